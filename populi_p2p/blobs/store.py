"""The blob store: content-addressed files in the node's state dir, under a quota.

Layout (``STATE/blobs``, mode 0700)::

    <hex>               a complete blob, its sha256 checked before it was put here
    <hex>.manifest      its manifest (`Manifest.encode`)
    catalogue.json      name, kind, size, added and last-used times, and pins, per blob
    partial/<hex>.part  a fetch in progress (written at chunk offsets)
    partial/<hex>.done  one byte per chunk, 1 once the chunk was written
    partial/<hex>.manifest  the manifest the fetch follows

The quota counts complete blobs and the full size of every partial one (reserved when
the fetch or add begins), so it is never exceeded, however a fetch ends. Room is made
by evicting the least recently used blobs that nothing pins (`pin`: a deployment, a
task's inputs or outputs); when that is not enough the add or fetch is refused with one
line, and nothing is lost.

A partial fetch survives a kill: its ``.done`` map says which chunks were written, and
on resumption every chunk marked done is checked again against the manifest (a chunk
that did not reach the disk is fetched again), so no fsync per chunk is needed. Which
chunks were checked is kept in memory (`Partial.verified`): only checked chunks are
served to other fetchers, and a written chunk that was not checked yet is checked when
one is asked for (`verify_chunk`) or when the whole hash fails (`refute_unchecked`).

Blocking file work (copying, hashing) is in plain functions run in a worker thread;
the catalogue is changed only under the store's lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

import attrs

from .manifest import READ_BYTES, Manifest, ManifestError, hash_file, parse_digest

__all__ = ["BlobEntry", "BlobStore", "Partial", "QuotaError", "check_name"]

#: The longest blob name.
MAX_NAME: Final = 64
#: The most pins one blob keeps (each a deployment or task id).
MAX_PINS: Final = 1024
_CATALOGUE: Final = "catalogue.json"
#: A chunk's check (`Partial.verified`).
UNCHECKED: Final = 0
GOOD: Final = 1
BAD: Final = 2


class Hash(Protocol):
    """What `Partial.hash_span` feeds (a hashlib hash)."""

    def update(self, data: bytes | memoryview, /) -> None: ...


class QuotaError(Exception):
    """No room under the quota, even after evicting every unpinned blob (one line)."""


def check_name(name: str) -> str:
    """`name` if it is a usable blob name (printable, no slash, at most `MAX_NAME`)."""
    if not 0 < len(name) <= MAX_NAME:
        raise ValueError(f"a model name is 1 to {MAX_NAME} characters")
    if not name.isprintable() or "/" in name or name.strip() != name:
        raise ValueError(f"model name {name!r}: printable, no slash, no outer spaces")
    return name


@attrs.define
class BlobEntry:
    """One blob the store holds (or is fetching, with `complete` False)."""

    digest: bytes
    size: int
    name: str
    kind: str
    added: float
    used: float
    complete: bool = True
    pins: list[str] = attrs.field(factory=list)

    @property
    def hex(self) -> str:
        return self.digest.hex()

    def row(self) -> dict[str, Any]:
        return {
            "hash": self.hex, "size": self.size, "name": self.name, "kind": self.kind,
            "added": self.added, "used": self.used, "complete": self.complete,
            "pins": list(self.pins),
        }  # fmt: skip


class Partial:
    """A blob being fetched: its part file, manifest and done map (one byte a chunk)."""

    def __init__(self, store: BlobStore, manifest: Manifest, part: Path, done_path: Path) -> None:
        self.store = store
        self.manifest = manifest
        self.part = part
        self._done_path = done_path
        self.fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._done_fd = os.open(done_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        raw = os.pread(self._done_fd, manifest.chunks, 0)
        self.done = bytearray(raw.ljust(manifest.chunks, b"\0"))
        #: Whether the done map was checked (`recheck`): only then are chunks served.
        self.checked = False
        #: Per chunk: `UNCHECKED`, `GOOD` (its sha256 is the manifest's) or `BAD`.
        self.verified = bytearray(manifest.chunks)
        if len(raw) < manifest.chunks:
            os.pwrite(self._done_fd, bytes(self.done), 0)

    def done_count(self) -> int:
        return sum(1 for b in self.done if b)

    def recheck(self) -> int:
        """Check every chunk marked done against the manifest; clear the ones that do not
        match (blocking: a worker thread). Returns how many were cleared."""
        cleared = 0
        for index, flag in enumerate(self.done):
            if flag and not self.verify_chunk(index):
                self._clear(index)
                cleared += 1
        self.checked = True
        return cleared

    def verify_chunk(self, index: int) -> bool:
        """Whether chunk `index` is written and matches the manifest, checked once
        (blocking: a worker thread)."""
        if not self.done[index]:
            return False
        if self.verified[index] == UNCHECKED:
            self.verified[index] = GOOD if self._chunk_matches(index) else BAD
        return self.verified[index] == GOOD

    def refute_unchecked(self) -> list[int]:
        """Check every written chunk not checked yet (the whole hash failed); clear the
        ones that do not match, so they are fetched again. Returns them (blocking)."""
        bad = [i for i, flag in enumerate(self.done) if flag and not self.verify_chunk(i)]
        for index in bad:
            self._clear(index)
        return bad

    def _clear(self, index: int) -> None:
        self.done[index] = 0
        self.verified[index] = UNCHECKED
        os.pwrite(self._done_fd, b"\0", index)

    def _chunk_matches(self, index: int) -> bool:
        offset, length = self.manifest.chunk_span(index)
        h = hashlib.sha256()
        while length:
            piece = os.pread(self.fd, min(READ_BYTES, length), offset)
            if not piece:
                return False
            h.update(piece)
            offset += len(piece)
            length -= len(piece)
        return h.digest() == self.manifest.chunk_hashes[index]

    def write(self, offset: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, offset)
            view, offset = view[n:], offset + n

    def mark_done(self, index: int, *, verified: bool) -> None:
        """Chunk `index` is written (and was `verified` on the way in, or not)."""
        self.done[index] = 1
        self.verified[index] = GOOD if verified else UNCHECKED
        os.pwrite(self._done_fd, b"\1", index)

    def hash_span(self, whole: Hash, start: int, end: int) -> None:
        """Feed bytes `start` to `end` of the part file to `whole` (the in-order whole
        hash; blocking: a worker thread). Raises OSError if the file is shorter.

        Read into one buffer, reused: a fresh 1 MiB object per read costs an allocation
        and its page faults each time."""
        buffer = memoryview(bytearray(min(READ_BYTES, max(end - start, 0))))
        while start < end:
            n = os.preadv(self.fd, [buffer[: min(len(buffer), end - start)]], start)
            if not n:
                raise OSError(f"{self.part} ends at {start}, before its done chunks do")
            whole.update(buffer[:n])
            start += n

    def close(self) -> None:
        for fd in (self.fd, self._done_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class BlobStore:
    """The node's blobs under ``root`` with at most `quota` bytes (0: no quota).

    Args:
        root: the store's directory (created 0700).
        quota: the most bytes of blobs, complete and partial, kept here.
        clock: realtime, for the added and last-used times.
    """

    def __init__(self, root: Path, quota: int, *, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.quota = quota
        self._clock = clock
        self._lock = threading.RLock()
        self._partial_dir = root / "partial"
        self._partial_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(root, 0o700)
        self._entries: dict[bytes, BlobEntry] = {}
        self._reserved: dict[str, int] = {}  # reservation key -> bytes
        self._partials: dict[bytes, Partial] = {}
        self.evicted = 0
        self.on_change: Callable[[], None] = lambda: None
        self._load()

    ####################################################################################
    # The catalogue

    def _load(self) -> None:
        try:
            data = json.loads((self.root / _CATALOGUE).read_text())
        except (OSError, ValueError):
            data = {}
        rows = data.get("blobs", []) if isinstance(data, dict) else []
        for row in rows if isinstance(rows, list) else []:
            try:
                entry = _entry_from_row(row)
            except (KeyError, TypeError, ValueError):
                continue
            if entry.complete and (self.root / entry.hex).is_file():
                self._entries[entry.digest] = entry
            elif not entry.complete and (self._partial_dir / f"{entry.hex}.part").is_file():
                self._entries[entry.digest] = entry
                self._reserved[entry.hex] = entry.size
        for leftover in self._partial_dir.glob("add-*.tmp"):
            leftover.unlink(missing_ok=True)

    def _save(self) -> None:
        rows = [e.row() for e in sorted(self._entries.values(), key=lambda e: e.added)]
        tmp = self.root / f".{_CATALOGUE}.{secrets.token_hex(4)}"
        tmp.write_text(json.dumps({"blobs": rows}))
        os.replace(tmp, self.root / _CATALOGUE)
        self.on_change()

    def entries(self) -> list[BlobEntry]:
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: (e.name, e.hex))

    def get(self, digest: bytes) -> BlobEntry | None:
        return self._entries.get(digest)

    def find(self, name_or_hash: str) -> BlobEntry:
        """The blob with this name, hash or unique hash prefix (4+ characters).

        Raises:
            LookupError: none, or more than one (one line).
        """
        with self._lock:
            text = name_or_hash.lower()
            hits = [e for e in self._entries.values() if e.name == name_or_hash]
            if not hits and len(text) >= 4:
                hits = [e for e in self._entries.values() if e.hex.startswith(text)]
        if len(hits) == 1:
            return hits[0]
        if not hits:
            raise LookupError(f"no blob named {name_or_hash!r} here (see populi-node model ls)")
        raise LookupError(f"{name_or_hash!r} names {len(hits)} blobs: give the hash")

    def path(self, digest: bytes) -> Path | None:
        """The complete blob's file, if held."""
        entry = self._entries.get(digest)
        return self.root / entry.hex if entry is not None and entry.complete else None

    def manifest(self, digest: bytes) -> Manifest | None:
        """The complete blob's manifest, if held."""
        if self.path(digest) is None:
            return None
        try:
            return Manifest.decode((self.root / f"{digest.hex()}.manifest").read_bytes(), digest)
        except (OSError, ManifestError):
            return None

    def used(self) -> int:
        """Bytes counted against the quota: complete blobs and reservations."""
        with self._lock:
            complete = sum(e.size for e in self._entries.values() if e.complete)
            return complete + sum(self._reserved.values())

    ####################################################################################
    # Quota, eviction and pins

    def reserve(self, key: str, size: int) -> None:
        """Count `size` bytes for `key` against the quota, evicting least recently used
        unpinned blobs to make room.

        Raises:
            QuotaError: not enough room even then (nothing is evicted in that case).
        """
        with self._lock:
            if not self.quota:
                self._reserved[key] = size
                return
            need = self.used() + size - self.quota
            victims: list[BlobEntry] = []
            if need > 0:
                for entry in sorted(self._entries.values(), key=lambda e: e.used):
                    if need <= 0:
                        break
                    if entry.complete and not entry.pins:
                        victims.append(entry)
                        need -= entry.size
            if need > 0:
                raise QuotaError(
                    f"no room for {size} bytes: {self.used()} of the {self.quota}-byte blob"
                    " quota are used and the rest is pinned (raise --blob-quota, or model rm)"
                )
            for entry in victims:
                self._delete(entry)
                self.evicted += 1
            self._reserved[key] = size
            if victims:
                self._save()

    def release(self, key: str) -> None:
        with self._lock:
            self._reserved.pop(key, None)

    def pin(self, digest: bytes, holder: str) -> None:
        """Keep the blob from eviction until `unpin(digest, holder)` (persisted)."""
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                raise LookupError(f"blob {digest.hex()} is not held here")
            if holder not in entry.pins:
                if len(entry.pins) >= MAX_PINS:
                    raise ValueError(f"blob {entry.hex} has {MAX_PINS} pins already")
                entry.pins.append(holder)
                self._save()

    def unpin(self, digest: bytes, holder: str) -> None:
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None and holder in entry.pins:
                entry.pins.remove(holder)
                self._save()

    def touch(self, digest: bytes) -> None:
        """Mark the blob used now (eviction takes the least recently used first)."""
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None:
                entry.used = self._clock()
                self._save()

    def remove(self, digest: bytes) -> BlobEntry:
        """Delete a blob (complete or partial).

        Raises:
            LookupError: not held.
            ValueError: pinned (one line naming the pins).
        """
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                raise LookupError(f"blob {digest.hex()} is not held here")
            if entry.pins:
                raise ValueError(
                    f"blob {entry.name} is pinned by {', '.join(entry.pins[:3])}: undeploy"
                    " or wait for those tasks first"
                )
            if digest in self._partials:
                raise ValueError(f"blob {entry.name} is being fetched; try again once it ends")
            self._delete(entry)
            self._save()
            return entry

    def _delete(self, entry: BlobEntry) -> None:
        del self._entries[entry.digest]
        self._reserved.pop(entry.hex, None)
        for path in (
            self.root / entry.hex,
            self.root / f"{entry.hex}.manifest",
            *(self._partial_dir / f"{entry.hex}{s}" for s in (".part", ".done", ".manifest")),
        ):
            path.unlink(missing_ok=True)

    ####################################################################################
    # Adding a local file, and fetching

    def add_file(self, source: Path, name: str, kind: str) -> BlobEntry:
        """Copy `source` into the store (hashed as it is copied; blocking: a worker
        thread). A blob already held only gains the name.

        Raises:
            OSError: the file cannot be read or the copy written.
            QuotaError: no room.
            ManifestError: too large.
        """
        check_name(name)
        size = os.stat(source).st_size
        key = f"add-{secrets.token_hex(8)}"
        tmp = self._partial_dir / f"{key}.tmp"
        self.reserve(key, size)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                manifest = hash_file(source, copy_to=fd)
            finally:
                os.close(fd)
            with self._lock:
                entry = self._entries.get(manifest.digest)
                if entry is not None and entry.complete:
                    entry.name = name
                    entry.used = self._clock()
                    self._save()
                    return entry
                (self.root / f"{manifest.hex}.manifest").write_bytes(manifest.encode())
                os.replace(tmp, self.root / manifest.hex)
                now = self._clock()
                entry = BlobEntry(manifest.digest, manifest.size, name, kind, now, now)
                self._entries[manifest.digest] = entry
                self._save()
                return entry
        finally:
            tmp.unlink(missing_ok=True)
            self.release(key)

    def begin_partial(self, manifest: Manifest, name: str, kind: str) -> Partial:
        """Open (or resume) the fetch of `manifest`'s blob, its size reserved.

        Raises:
            QuotaError: no room.
            ValueError: the blob is complete here, or a fetch of it is running.
        """
        with self._lock:
            digest = manifest.digest
            if digest in self._partials:
                raise ValueError(f"blob {manifest.hex} is already being fetched")
            entry = self._entries.get(digest)
            if entry is not None and entry.complete:
                raise ValueError(f"blob {manifest.hex} is already held")
            stem = self._partial_dir / manifest.hex
            kept = _read_manifest(stem.with_suffix(".manifest"), digest)
            if entry is None or kept != manifest:
                for suffix in (".part", ".done"):
                    stem.with_suffix(suffix).unlink(missing_ok=True)
            if entry is None:
                self.reserve(manifest.hex, manifest.size)
                now = self._clock()
                entry = BlobEntry(digest, manifest.size, name, kind, now, now, complete=False)
                self._entries[digest] = entry
            stem.with_suffix(".manifest").write_bytes(manifest.encode())
            partial = Partial(self, manifest, stem.with_suffix(".part"), stem.with_suffix(".done"))
            self._partials[digest] = partial
            self._save()
            return partial

    def finish_partial(self, partial: Partial) -> BlobEntry:
        """Move a fetched blob whose whole hash was checked into place."""
        with self._lock:
            digest = partial.manifest.digest
            partial.close()
            self._partials.pop(digest, None)
            hexd = partial.manifest.hex
            os.replace(self._partial_dir / f"{hexd}.manifest", self.root / f"{hexd}.manifest")
            os.replace(partial.part, self.root / hexd)
            (self._partial_dir / f"{hexd}.done").unlink(missing_ok=True)
            entry = self._entries[digest]
            entry.complete = True
            entry.used = self._clock()
            self._reserved.pop(hexd, None)
            self._save()
            return entry

    def drop_partial(self, partial: Partial, *, discard: bool) -> None:
        """Stop a fetch: keep its progress for a resumption, or `discard` it all."""
        with self._lock:
            partial.close()
            self._partials.pop(partial.manifest.digest, None)
            entry = self._entries.get(partial.manifest.digest)
            if discard and entry is not None and not entry.complete:
                self._delete(entry)
                self._save()
            else:
                self.on_change()  # no longer fetched here: no longer advertised as such

    def fetching(self, digest: bytes) -> Partial | None:
        """The running fetch of `digest`, if any (its verified chunks may be served)."""
        return self._partials.get(digest)

    def fetching_digests(self) -> set[bytes]:
        return set(self._partials)

    def partial_manifest(self, digest: bytes) -> Manifest | None:
        """The manifest a stopped fetch followed (a resumption needs no holder's)."""
        return _read_manifest(self._partial_dir / f"{digest.hex()}.manifest", digest)


def _read_manifest(path: Path, digest: bytes) -> Manifest | None:
    try:
        return Manifest.decode(path.read_bytes(), digest)
    except (OSError, ManifestError):
        return None


def _entry_from_row(row: Any) -> BlobEntry:
    return BlobEntry(
        digest=parse_digest(str(row["hash"])), size=int(row["size"]),
        name=check_name(str(row["name"])), kind=str(row["kind"])[:32],
        added=float(row["added"]), used=float(row["used"]),
        complete=bool(row.get("complete", True)),
        pins=[str(p) for p in row.get("pins", [])][:MAX_PINS],
    )  # fmt: skip
