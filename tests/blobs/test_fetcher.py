"""The trio fetcher against in-memory holders: several at once, a corrupt chunk refused
and fetched elsewhere, a liar skipped, a false manifest outvoted, a cancelled fetch
resumed without fetching its done chunks again, the bandwidth cap."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from populi_p2p.blobs import CHUNK_BYTES, BlobStore, FetchError, FetchProgress, fetch_blob, fetcher
from populi_p2p.blobs.fetcher import SourceError, TokenBucket
from populi_p2p.blobs.manifest import Manifest, hash_file
from populi_p2p.blobs.planner import ChunkFailure
from populi_p2p.blobs.store import Partial

from .test_store import _file


class Holders:
    """Holders by behaviour: honest, corrupt (flips a byte), sly (honest for its first
    two chunks, then corrupt), liar (404), gone (unreachable)."""

    def __init__(self, data: bytes, manifest: Manifest, kinds: dict[str, str]) -> None:
        self.data, self.real, self.kinds = data, manifest, kinds
        self.asked: list[tuple[str, int]] = []
        self.gate = trio.Event()
        self.gate.set()

    async def manifest(self, holder: str, digest: bytes) -> bytes:
        if self.kinds[holder] == "liar":
            raise SourceError(ChunkFailure.MISSING, "no")
        if self.kinds[holder] == "forger":
            forged = Manifest(digest, self.real.size, CHUNK_BYTES,
                              tuple(bytes(32) for _ in self.real.chunk_hashes))  # fmt: skip
            return forged.encode()
        return self.real.encode()

    @contextlib.asynccontextmanager
    async def chunk(
        self, holder: str, digest: bytes, index: int
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        self.asked.append((holder, index))
        kind = self.kinds[holder]
        if kind == "liar":
            raise SourceError(ChunkFailure.MISSING, "no")
        if kind == "gone":  # gave the manifest, then died (kill -9 mid-fetch)
            raise SourceError(ChunkFailure.UNREACHABLE, "connection refused")
        off, n = self.real.chunk_span(index)
        body = bytearray(self.data[off : off + n])
        if kind == "corrupt" or (kind == "sly" and [h for h, _ in self.asked].count(holder) > 2):
            body[7] ^= 1

        async def pieces() -> AsyncIterator[bytes]:
            for i in range(0, len(body), 65536):
                await self.gate.wait()
                await trio.lowlevel.checkpoint()
                yield bytes(body[i : i + 65536])

        yield pieces()


@pytest.fixture
def blob(tmp_path: Path) -> tuple[bytes, Manifest]:
    src = _file(tmp_path, "src", 5 * CHUNK_BYTES + 999)
    return src.read_bytes(), hash_file(src)


async def test_corrupt_and_lying_holders_skipped_chunks_from_the_honest(
    tmp_path: Path, blob: tuple[bytes, Manifest]
) -> None:
    data, manifest = blob
    holders = Holders(data, manifest, {"liar": "liar", "bad": "corrupt", "good": "honest"})
    store = BlobStore(tmp_path / "blobs", 0)
    progress = FetchProgress(manifest.digest, "m")
    entry = await fetch_blob(store, holders, manifest.digest, ["liar", "bad", "good"],
                             name="m", kind="model", progress=progress, per_holder=2)  # fmt: skip
    assert store.path(entry.digest).read_bytes() == data  # type: ignore[union-attr]
    stats = progress.holders
    assert 1 <= stats["bad"]["corrupt"] <= 2 and stats["bad"]["skipped"]
    assert stats["good"]["served"] == manifest.chunks
    assert not any(h == "liar" for h, _ in holders.asked)  # skipped at the manifest
    assert progress.state == "done"


async def test_a_holder_corrupt_after_its_first_chunks_is_caught_by_the_whole_hash(
    tmp_path: Path, blob: tuple[bytes, Manifest]
) -> None:
    """A holder's first chunks are checked on the way in; once one matched, its later
    ones are checked by the whole hash. When that fails, the chunks written unchecked
    are checked, the corrupt ones fetched again from another holder, and the sender
    skipped."""
    data, manifest = blob
    holders = Holders(data, manifest, {"sly": "sly", "good": "honest"})
    store = BlobStore(tmp_path / "blobs", 0)
    progress = FetchProgress(manifest.digest, "m")
    entry = await fetch_blob(store, holders, manifest.digest, ["sly", "good"], name="m",
                             kind="model", progress=progress, per_holder=2)  # fmt: skip
    assert store.path(entry.digest).read_bytes() == data  # type: ignore[union-attr]
    sly, good = progress.holders["sly"], progress.holders["good"]
    asked_sly = [i for h, i in holders.asked if h == "sly"]
    assert len(asked_sly) > 2  # it was trusted after its first chunks matched
    assert sly["skipped"] == "sent a corrupt chunk" and sly["corrupt"] == len(asked_sly) - 2
    assert sly["served"] == 2 and good["served"] == manifest.chunks - 2
    refetched = [i for h, i in holders.asked if h == "good" and i in asked_sly[2:]]
    assert sorted(refetched) == sorted(asked_sly[2:])
    assert progress.state == "done" and progress.done == manifest.chunks


async def test_a_forged_manifest_is_outvoted(tmp_path: Path, blob: tuple[bytes, Manifest]) -> None:
    data, manifest = blob
    holders = Holders(data, manifest, {"f": "forger", "a": "honest", "b": "honest"})
    store = BlobStore(tmp_path / "blobs", 0)
    progress = FetchProgress(manifest.digest, "m")
    await fetch_blob(store, holders, manifest.digest, ["f", "a", "b"], name="m", kind="model",
                     progress=progress)  # fmt: skip
    assert progress.holders["f"]["skipped"] and not any(h == "f" for h, _ in holders.asked)


async def test_only_liars_is_one_clear_error(tmp_path: Path, blob: tuple[bytes, Manifest]) -> None:
    data, manifest = blob
    holders = Holders(data, manifest, {"x": "liar", "y": "liar"})
    store = BlobStore(tmp_path / "blobs", 0)
    with pytest.raises(FetchError, match="no holder gave the manifest"):
        await fetch_blob(store, holders, manifest.digest, ["x", "y"], name="m", kind="model")
    assert store.get(manifest.digest) is None


async def test_a_holder_gone_mid_fetch_is_one_clear_error(
    tmp_path: Path, blob: tuple[bytes, Manifest], autojump_clock: Any
) -> None:
    """Not an ExceptionGroup out of the fetcher's nursery: its callers catch FetchError
    (a holder of a snapshot whose owner was killed while it fetched, issue 22)."""
    data, manifest = blob
    holders = Holders(data, manifest, {"owner": "gone"})
    store = BlobStore(tmp_path / "blobs", 0)
    with pytest.raises(FetchError, match="every holder was skipped"):
        await fetch_blob(store, holders, manifest.digest, ["owner"], name="m", kind="model")


async def test_cancelled_fetch_resumes_without_refetching_done_chunks(
    tmp_path: Path, blob: tuple[bytes, Manifest]
) -> None:
    data, manifest = blob
    holders = Holders(data, manifest, {"a": "honest", "b": "honest"})
    store = BlobStore(tmp_path / "blobs", 0)
    progress = FetchProgress(manifest.digest, "m")
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            await fetch_blob(store, holders, manifest.digest, ["a", "b"], name="m",
                             kind="model", progress=progress, per_holder=1, total=2)  # fmt: skip

        nursery.start_soon(run)
        while progress.done < 2:
            await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    done_before = progress.done
    assert 2 <= done_before < manifest.chunks
    holders.asked.clear()
    store = BlobStore(tmp_path / "blobs", 0)  # as after a restart
    entry = await fetch_blob(store, holders, manifest.digest, ["b"], name="m", kind="model")
    assert store.path(entry.digest).read_bytes() == data  # type: ignore[union-attr]
    assert len(holders.asked) == manifest.chunks - done_before


async def test_bandwidth_cap(autojump_clock: object) -> None:
    bucket = TokenBucket(1024 * 1024, burst=64 * 1024)
    start = trio.current_time()
    for _ in range(32):
        await bucket.take(64 * 1024)  # 2 MiB at 1 MiB/s
    assert trio.current_time() - start >= 1.9


async def test_whole_hash_follows_the_verified_prefix_during_the_fetch(
    tmp_path: Path, blob: tuple[bytes, Manifest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole sha256 is computed in order while chunks still arrive (not a second
    pass over the blob after the last one), each byte once."""
    data, manifest = blob
    holders = Holders(data, manifest, {"a": "honest", "b": "honest"})
    last = manifest.chunks - 1
    release_last = trio.Event()
    spans: list[tuple[int, int]] = []
    hash_span = Partial.hash_span

    def recording(self: Partial, whole: Any, start: int, end: int) -> None:
        spans.append((start, end))
        hash_span(self, whole, start, end)

    monkeypatch.setattr(Partial, "hash_span", recording)
    monkeypatch.setattr(fetcher, "HASH_SPAN", CHUNK_BYTES // 2)  # a stop waits for one span
    original_chunk = holders.chunk

    @contextlib.asynccontextmanager
    async def held_chunk(
        holder: str, digest: bytes, index: int
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        if index == last:
            await release_last.wait()
        async with original_chunk(holder, digest, index) as pieces:
            yield pieces

    holders.chunk = held_chunk  # type: ignore[method-assign]
    store = BlobStore(tmp_path / "blobs", 0)
    last_offset = manifest.chunk_span(last)[0]

    async def release_once_the_prefix_is_hashed() -> None:
        with trio.fail_after(30):
            while sum(end - start for start, end in spans) < last_offset:
                await trio.sleep(0.005)
        release_last.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(release_once_the_prefix_is_hashed)
        entry = await fetch_blob(store, holders, manifest.digest, ["a", "b"], name="m",
                                 kind="model")  # fmt: skip
    assert store.path(entry.digest).read_bytes() == data  # type: ignore[union-attr]
    assert spans[0][0] == 0 and spans[-1][1] == manifest.size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # in order, each byte once
    assert max(end - start for start, end in spans) <= CHUNK_BYTES // 2


async def test_chunks_that_match_a_false_manifest_are_refused_whole(tmp_path: Path) -> None:
    """A manifest whose chunk hashes describe other bytes than its digest: every chunk
    verifies, the whole hash does not; the fetch fails and keeps nothing."""
    src = _file(tmp_path, "src", 2 * CHUNK_BYTES + 5)
    other = hash_file(src)
    claimed = bytes(31) + b"\1"
    false = Manifest(claimed, other.size, CHUNK_BYTES, other.chunk_hashes)
    holders = Holders(src.read_bytes(), false, {"a": "honest", "b": "honest"})
    store = BlobStore(tmp_path / "blobs", 0)
    with pytest.raises(FetchError, match="the manifest was false"):
        await fetch_blob(store, holders, claimed, ["a", "b"], name="m", kind="model")
    assert store.get(claimed) is None and store.used() == 0
    assert not list((tmp_path / "blobs" / "partial").iterdir())
