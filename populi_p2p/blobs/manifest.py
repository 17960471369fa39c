"""A blob's manifest: its sha256, size and the sha256 of every chunk.

A blob is named by the sha256 of its bytes (its *digest*, 64 hex characters in text).
A fetch moves it in chunks of `CHUNK_BYTES` from several holders at once; each chunk is
checked against the manifest's chunk hash as it arrives, so one corrupt chunk costs one
chunk, not the blob. The manifest itself comes from a holder, so it is a claim: the
fetcher takes the manifest most holders agree on (`Manifest.key`), and the whole
digest is checked before the blob is used, which catches a manifest that lied.

Wire form (`encode`): canonical msgpack ``[1, digest(32 bytes), size, chunk_bytes,
chunk_hashes (concatenated 32-byte digests)]``. ONLY APPEND new versions.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Final

import attrs

from ..trust._codec import CodecError, pack_canonical, unpack_strict

__all__ = [
    "CHUNK_BYTES",
    "DIGEST_BYTES",
    "MAX_BLOB_BYTES",
    "Manifest",
    "ManifestError",
    "chunk_count",
    "hash_file",
    "parse_digest",
]

#: Bytes per chunk: the unit of verification, retry and resumption.
CHUNK_BYTES: Final = 4 * 1024 * 1024
#: sha256 digest length.
DIGEST_BYTES: Final = 32
#: The largest blob handled (512 GiB: its manifest is 4 MiB, a peer call's limit).
MAX_BLOB_BYTES: Final = 512 * 1024**3
#: Bytes read at a time when hashing or copying a file (bounded memory).
READ_BYTES: Final = 1024 * 1024
_VERSION: Final = 1


class ManifestError(ValueError):
    """A manifest or digest that is malformed (one line)."""


def parse_digest(text: str) -> bytes:
    """A digest from its 64 hex characters (case-insensitive). Raises ManifestError."""
    if len(text) != 2 * DIGEST_BYTES:
        raise ManifestError(f"a blob hash is {2 * DIGEST_BYTES} hex characters, not {len(text)}")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ManifestError("a blob hash is hex digits only") from None


def chunk_count(size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """How many chunks a blob of `size` bytes has (at least one, even when empty)."""
    return max(1, -(-size // chunk_bytes))


@attrs.frozen
class Manifest:
    """What a blob is: its digest, size, chunk size and every chunk's sha256."""

    digest: bytes
    size: int
    chunk_bytes: int
    chunk_hashes: tuple[bytes, ...]

    def __attrs_post_init__(self) -> None:
        if len(self.digest) != DIGEST_BYTES:
            raise ManifestError("the digest is not 32 bytes")
        if not 0 <= self.size <= MAX_BLOB_BYTES:
            raise ManifestError(f"the size {self.size} is out of range")
        if self.chunk_bytes != CHUNK_BYTES:
            raise ManifestError(f"chunks are {CHUNK_BYTES} bytes, not {self.chunk_bytes}")
        if len(self.chunk_hashes) != chunk_count(self.size, self.chunk_bytes):
            raise ManifestError("the chunk list does not match the size")
        if any(len(h) != DIGEST_BYTES for h in self.chunk_hashes):
            raise ManifestError("a chunk hash is not 32 bytes")

    @property
    def hex(self) -> str:
        return self.digest.hex()

    @property
    def chunks(self) -> int:
        return len(self.chunk_hashes)

    def chunk_span(self, index: int) -> tuple[int, int]:
        """(offset, length) of chunk `index`."""
        start = index * self.chunk_bytes
        return start, max(0, min(self.chunk_bytes, self.size - start))

    def encode(self) -> bytes:
        return pack_canonical(
            [_VERSION, self.digest, self.size, self.chunk_bytes, b"".join(self.chunk_hashes)]
        )

    def key(self) -> bytes:
        """The sha256 of the encoded manifest: holders that agree give equal keys."""
        return hashlib.sha256(self.encode()).digest()

    @classmethod
    def decode(cls, data: bytes, digest: bytes) -> Manifest:
        """The manifest in `data`, which must be for `digest`. Raises ManifestError."""
        try:
            value = unpack_strict(data)
        except CodecError as exc:
            raise ManifestError(str(exc)) from None
        if not (isinstance(value, list) and len(value) == 5 and value[0] == _VERSION):
            raise ManifestError("not a version-1 manifest")
        _, got, size, chunk_bytes, hashes = value
        if not (isinstance(got, bytes) and isinstance(hashes, bytes)):
            raise ManifestError("the digest and chunk hashes are bytes")
        if not (isinstance(size, int) and isinstance(chunk_bytes, int)) or isinstance(size, bool):
            raise ManifestError("the size and chunk size are integers")
        if got != digest:
            raise ManifestError("the manifest is for another blob")
        if len(hashes) % DIGEST_BYTES:
            raise ManifestError("the chunk hashes are not whole digests")
        split = tuple(hashes[i : i + DIGEST_BYTES] for i in range(0, len(hashes), DIGEST_BYTES))
        return cls(got, size, chunk_bytes, split)


def hash_file(path: Path, copy_to: int | None = None) -> Manifest:
    """The manifest of the file at `path`, read once in `READ_BYTES` pieces; with
    `copy_to` (a file descriptor) every piece is also written there. Blocking: run it
    in a thread.

    Raises:
        OSError: the file cannot be read (or written).
        ManifestError: the file is larger than `MAX_BLOB_BYTES`.
    """
    whole = hashlib.sha256()
    hashes: list[bytes] = []
    size = 0
    with open(path, "rb") as source:
        while True:
            chunk = hashlib.sha256()
            left = CHUNK_BYTES
            while left:
                piece = source.read(min(READ_BYTES, left))
                if not piece:
                    break
                whole.update(piece)
                chunk.update(piece)
                if copy_to is not None:
                    view = memoryview(piece)
                    while view:
                        view = view[os.write(copy_to, view) :]
                left -= len(piece)
            got = CHUNK_BYTES - left
            size += got
            if size > MAX_BLOB_BYTES:
                raise ManifestError(f"{path} is over {MAX_BLOB_BYTES} bytes")
            if got or not hashes:
                hashes.append(chunk.digest())
            if left:
                break
    return Manifest(whole.digest(), size, CHUNK_BYTES, tuple(hashes))
