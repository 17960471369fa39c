"""What a blob is: digests as text, chunk arithmetic, and a manifest that refuses to
describe an impossible blob or another blob than the one asked for."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from populi_p2p.blobs.manifest import (
    CHUNK_BYTES,
    MAX_BLOB_BYTES,
    Manifest,
    ManifestError,
    chunk_count,
    hash_file,
    parse_digest,
)

H = hashlib.sha256(b"x").digest()


def test_parse_digest() -> None:
    assert parse_digest(H.hex()) == H
    assert parse_digest(H.hex().upper()) == H
    with pytest.raises(ManifestError, match="64 hex characters, not 63"):
        parse_digest(H.hex()[:-1])
    with pytest.raises(ManifestError, match="hex digits only"):
        parse_digest("g" * 64)


@pytest.mark.parametrize(
    ("size", "chunks"),
    [(0, 1), (1, 1), (CHUNK_BYTES, 1), (CHUNK_BYTES + 1, 2), (3 * CHUNK_BYTES, 3)],
)
def test_chunk_count(size: int, chunks: int) -> None:
    assert chunk_count(size) == chunks


def test_chunk_spans_cover_the_blob_once() -> None:
    size = 2 * CHUNK_BYTES + 5
    manifest = Manifest(H, size, CHUNK_BYTES, (H, H, H))
    spans = [manifest.chunk_span(i) for i in range(manifest.chunks)]
    assert spans == [(0, CHUNK_BYTES), (CHUNK_BYTES, CHUNK_BYTES), (2 * CHUNK_BYTES, 5)]
    assert sum(n for _, n in spans) == size


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ((H[:31], 1, CHUNK_BYTES, (H,)), "digest is not 32 bytes"),
        ((H, -1, CHUNK_BYTES, (H,)), "out of range"),
        ((H, MAX_BLOB_BYTES + 1, CHUNK_BYTES, (H,)), "out of range"),
        ((H, 1, CHUNK_BYTES // 2, (H,)), "chunks are"),
        ((H, CHUNK_BYTES + 1, CHUNK_BYTES, (H,)), "does not match the size"),
        ((H, 1, CHUNK_BYTES, (H[:5],)), "chunk hash is not 32 bytes"),
    ],
)
def test_an_impossible_manifest_is_refused(fields: tuple[object, ...], says: str) -> None:
    with pytest.raises(ManifestError, match=says):
        Manifest(*fields)  # type: ignore[arg-type]


def test_decode_is_for_the_digest_asked_and_the_key_is_the_encoding(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(b"populi" * 1000)
    manifest = hash_file(blob)
    assert manifest.digest == hashlib.sha256(blob.read_bytes()).digest()
    assert Manifest.decode(manifest.encode(), manifest.digest) == manifest
    assert manifest.key() == hashlib.sha256(manifest.encode()).digest()
    with pytest.raises(ManifestError, match="for another blob"):
        Manifest.decode(manifest.encode(), H)
    with pytest.raises(ManifestError):
        Manifest.decode(manifest.encode()[:-3], manifest.digest)
