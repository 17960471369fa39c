"""The trio fetcher against in-memory holders: several at once, a corrupt chunk refused
and fetched elsewhere, a liar skipped, a false manifest outvoted, a cancelled fetch
resumed without fetching its done chunks again, the bandwidth cap."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from populi_p2p.blobs import CHUNK_BYTES, BlobStore, FetchError, FetchProgress, fetch_blob
from populi_p2p.blobs.fetcher import SourceError, TokenBucket
from populi_p2p.blobs.manifest import Manifest, hash_file
from populi_p2p.blobs.planner import ChunkFailure

from .test_store import _file


class Holders:
    """Holders by behaviour: honest, corrupt (flips a byte), liar (404), slow."""

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
        off, n = self.real.chunk_span(index)
        body = bytearray(self.data[off : off + n])
        if kind == "corrupt":
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
