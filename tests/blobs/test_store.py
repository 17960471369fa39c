"""The blob store: content addressing, the quota (never exceeded), eviction of the least
recently used unpinned blobs, pins, partial fetches that survive a restart."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.blobs import CHUNK_BYTES, BlobStore, Manifest, QuotaError
from populi_p2p.blobs.manifest import ManifestError, chunk_count, hash_file

MiB = 1024 * 1024


def _file(tmp: Path, name: str, size: int, seed: int = 0) -> Path:
    path = tmp / name
    block = hashlib.sha256(f"{name}{seed}".encode()).digest() * (MiB // 32)
    with open(path, "wb") as f:
        left = size
        while left:
            f.write(block[: min(left, len(block))])
            left -= min(left, len(block))
    return path


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1
        return self.t


def test_add_is_content_addressed_and_hash_checked(tmp_path: Path) -> None:
    src = _file(tmp_path, "m.gguf", CHUNK_BYTES + 123)
    store = BlobStore(tmp_path / "blobs", 0)
    entry = store.add_file(src, "m", "model")
    assert entry.hex == hashlib.sha256(src.read_bytes()).hexdigest()
    assert entry.size == CHUNK_BYTES + 123
    path = store.path(entry.digest)
    assert path is not None and path.read_bytes() == src.read_bytes()
    manifest = store.manifest(entry.digest)
    assert manifest is not None and manifest.chunks == 2
    # The same bytes again only rename; the catalogue survives a restart.
    again = store.add_file(src, "m2", "model")
    assert again.digest == entry.digest and len(store.entries()) == 1
    reopened = BlobStore(tmp_path / "blobs", 0)
    assert [e.name for e in reopened.entries()] == ["m2"]
    assert reopened.find("m2").digest == entry.digest
    assert reopened.find(entry.hex[:8]).digest == entry.digest
    with pytest.raises(LookupError):
        reopened.find("nope")


def test_quota_evicts_least_recently_used_unpinned_and_keeps_pinned(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs", 3 * MiB, clock=Clock())
    a = store.add_file(_file(tmp_path, "a", MiB), "a", "model")
    b = store.add_file(_file(tmp_path, "b", MiB), "b", "model")
    c = store.add_file(_file(tmp_path, "c", MiB), "c", "model")
    store.pin(a.digest, "deploy:x")
    store.touch(b.digest)  # b used after c: c is now the least recently used unpinned
    d = store.add_file(_file(tmp_path, "d", MiB), "d", "model")
    held = {e.name for e in store.entries()}
    assert held == {"a", "b", "d"} and store.used() <= 3 * MiB
    assert store.get(c.digest) is None and store.evicted == 1
    with pytest.raises(ValueError, match="pinned"):
        store.remove(a.digest)
    # Everything else pinned: a blob that does not fit is refused, nothing is lost.
    store.pin(b.digest, "task:1")
    store.pin(d.digest, "task:2")
    with pytest.raises(QuotaError, match="quota"):
        store.add_file(_file(tmp_path, "e", MiB), "e", "model")
    assert {e.name for e in store.entries()} == {"a", "b", "d"}
    assert not list((tmp_path / "blobs" / "partial").iterdir())
    store.unpin(b.digest, "task:1")
    store.add_file(_file(tmp_path, "e", MiB), "e", "model")
    assert {e.name for e in store.entries()} == {"a", "d", "e"}
    assert d.digest in {e.digest for e in store.entries()}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "pin", "unpin", "rm", "touch"]),
            st.integers(0, 5),
            st.integers(1, 3),
        ),
        max_size=25,
    )
)
def test_quota_is_never_exceeded_and_pins_are_kept(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, int]]
) -> None:
    tmp = tmp_path_factory.mktemp("q")
    quota = 4 * 64 * 1024
    store = BlobStore(tmp / "blobs", quota, clock=Clock())
    files = {i: _file(tmp, f"f{i}", 64 * 1024 * (1 + i % 3), seed=i) for i in range(6)}
    pinned: set[bytes] = set()
    for op, i, _ in ops:
        digest = hashlib.sha256(files[i].read_bytes()).digest()
        try:
            if op == "add":
                store.add_file(files[i], f"f{i}", "model")
            elif op == "pin":
                store.pin(digest, "p")
                pinned.add(digest)
            elif op == "unpin":
                store.unpin(digest, "p")
                pinned.discard(digest)
            elif op == "rm":
                store.remove(digest)
            else:
                store.touch(digest)
        except (LookupError, ValueError, QuotaError):
            pass
        assert store.used() <= quota
        on_disk = sum(p.stat().st_size for p in (tmp / "blobs").iterdir() if p.is_file()
                      and len(p.name) == 64)  # fmt: skip
        assert on_disk <= quota
        held = {e.digest for e in store.entries()}
        assert pinned <= held


def test_partial_resumes_and_rechecks_what_it_kept(tmp_path: Path) -> None:
    src = _file(tmp_path, "m", 3 * CHUNK_BYTES)
    manifest = hash_file(src)
    data = src.read_bytes()
    store = BlobStore(tmp_path / "blobs", 0)
    partial = store.begin_partial(manifest, "m", "model")
    for i in (0, 2):
        off, n = manifest.chunk_span(i)
        partial.write(off, data[off : off + n])
        partial.mark_done(i, verified=False)
    store.drop_partial(partial, discard=False)
    # Restarted: the catalogue knows the partial; its manifest needs no holder.
    store = BlobStore(tmp_path / "blobs", 0)
    assert store.partial_manifest(manifest.digest) == manifest
    assert store.used() == manifest.size
    # A chunk marked done whose bytes did not reach the disk is found and cleared.
    with open(tmp_path / "blobs" / "partial" / f"{manifest.hex}.part", "r+b") as f:
        f.seek(2 * CHUNK_BYTES + 5)
        f.write(b"X")
    partial = store.begin_partial(manifest, "m", "model")
    assert list(partial.done) == [1, 0, 1]
    assert partial.recheck() == 1 and list(partial.done) == [1, 0, 0]
    for i in (1, 2):
        off, n = manifest.chunk_span(i)
        partial.write(off, data[off : off + n])
        partial.mark_done(i, verified=False)
    whole = hashlib.sha256()
    partial.hash_span(whole, 0, CHUNK_BYTES + 7)
    partial.hash_span(whole, CHUNK_BYTES + 7, manifest.size)
    assert whole.digest() == manifest.digest
    with pytest.raises(OSError, match="before its done chunks"):
        partial.hash_span(hashlib.sha256(), manifest.size - 1, manifest.size + 1)
    entry = store.finish_partial(partial)
    assert entry.complete and store.path(manifest.digest).read_bytes() == data  # type: ignore[union-attr]
    assert not list((tmp_path / "blobs" / "partial").iterdir())
    assert store.used() == manifest.size


def test_manifest_round_trip_and_refusals(tmp_path: Path) -> None:
    manifest = hash_file(_file(tmp_path, "m", 2 * CHUNK_BYTES + 1))
    assert Manifest.decode(manifest.encode(), manifest.digest) == manifest
    assert chunk_count(0) == 1 and chunk_count(CHUNK_BYTES) == 1
    with pytest.raises(ManifestError, match="another blob"):
        Manifest.decode(manifest.encode(), bytes(32))
    for junk in (b"", b"\xc1", os.urandom(64), manifest.encode()[:-3]):
        with pytest.raises(ManifestError):
            Manifest.decode(junk, manifest.digest)
    empty = hash_file(_file(tmp_path, "e", 0))
    assert empty.chunks == 1 and empty.digest == hashlib.sha256(b"").digest()
