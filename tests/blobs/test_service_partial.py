"""A node fetching a blob serves the chunks it has verified: over the peer API (409 for
a chunk it lacks or that does not match, which the fetcher takes as "ask again later",
not as a lie), in its record's ``p`` rows, and in the fetch plan of the nodes that
fetch from it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from populi_p2p.blobs import CHUNK_BYTES, BlobStore, FetchProgress, fetch_blob
from populi_p2p.blobs.fetcher import SourceError
from populi_p2p.blobs.holders import advert_section, mesh_catalogue, parse_advert
from populi_p2p.blobs.manifest import Manifest, hash_file
from populi_p2p.blobs.planner import ChunkFailure
from populi_p2p.blobs.service import BlobService, PeerChunkSource
from populi_p2p.blobs.store import Partial
from populi_p2p.inference.peer_api import PeerApi, PeerRoutes
from populi_p2p.inference.peer_auth import PeerCallSigner, PeerCallVerifier
from populi_p2p.inference.peer_client import BULK_READ_BYTES, PeerClient
from tests.inference.conftest import ALICE, BOB, CERTS, keys

from .test_fetcher import Holders
from .test_store import _file


async def _noop(_name: str, _value: object) -> None:
    return None


async def test_a_fetching_node_serves_its_verified_chunks_and_409_for_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _file(tmp_path, "m.gguf", 3 * CHUNK_BYTES + 17, seed=3)
    data, manifest = src.read_bytes(), hash_file(src)
    store = BlobStore(tmp_path / "blobs", 0)
    partial = store.begin_partial(manifest, "m", "model")
    partial.write(0, data[:CHUNK_BYTES])
    partial.mark_done(0, verified=False)
    service = BlobService(
        store, me=BOB.node_id, is_member={ALICE.node_id, BOB.node_id}.__contains__,
        sections=dict, address_of=lambda _n: None, peer_client=lambda: None,
        set_section=_noop,
    )  # fmt: skip
    assert parse_advert(service._advert())[0].partial  # advertised as being fetched
    routes = PeerRoutes()
    service.register_peer_routes(routes)
    api = PeerApi(PeerCallVerifier(keys(BOB), BOB.node_id, clock=time.time), routes,
                  host="127.0.0.1", port=0)  # fmt: skip
    alice = PeerClient(PeerCallSigner(ALICE, CERTS[ALICE.node_id], clock=time.time))
    asked: list[int] = []  # how much each socket read asked for
    receive_some = trio.SocketStream.receive_some

    async def recording(self: trio.SocketStream, max_bytes: int | None = None) -> Any:
        asked.append(max_bytes or 0)
        return await receive_some(self, max_bytes)

    monkeypatch.setattr(trio.SocketStream, "receive_some", recording)

    async def chunk(source: PeerChunkSource, index: int) -> bytes:
        out = b""
        async with source.chunk(BOB.node_id, manifest.digest, index) as pieces:
            async for piece in pieces:
                out += piece
        return out

    async with trio.open_nursery() as nursery:
        port = await nursery.start(api.run)
        source = PeerChunkSource(alice.bulk(), lambda _n: ("127.0.0.1", port))
        try:
            raw = await source.manifest(BOB.node_id, manifest.digest)
            assert Manifest.decode(raw, manifest.digest) == manifest
            with pytest.raises(SourceError) as unchecked:  # done map not checked yet
                await chunk(source, 0)
            assert unchecked.value.failure is ChunkFailure.LACKS
            assert partial.recheck() == 0
            assert await chunk(source, 0) == data[:CHUNK_BYTES]
            assert BULK_READ_BYTES in asked  # the bulk client reads large pieces
            with pytest.raises(SourceError) as lacking:
                await chunk(source, 1)
            assert lacking.value.failure is ChunkFailure.LACKS
            # Written unchecked (the fetcher checks a trusted holder's chunks by the
            # whole hash): checked when asked for, and served only if it matches.
            checked: list[int] = []
            matches = Partial._chunk_matches

            def counting(self: Partial, index: int) -> bool:
                checked.append(index)
                return matches(self, index)

            monkeypatch.setattr(Partial, "_chunk_matches", counting)
            partial.write(CHUNK_BYTES, data[CHUNK_BYTES : 2 * CHUNK_BYTES])
            partial.mark_done(1, verified=False)
            assert await chunk(source, 1) == data[CHUNK_BYTES : 2 * CHUNK_BYTES]
            rotten = bytearray(data[2 * CHUNK_BYTES : 3 * CHUNK_BYTES])
            rotten[9] ^= 1
            partial.write(2 * CHUNK_BYTES, bytes(rotten))
            partial.mark_done(2, verified=False)
            refusals: list[ChunkFailure] = []

            async def ask_for_2() -> None:
                with pytest.raises(SourceError) as refused:
                    await chunk(source, 2)
                refusals.append(refused.value.failure)

            async with trio.open_nursery() as askers:  # three at once, then one more
                for _ in range(3):
                    askers.start_soon(ask_for_2)
            await ask_for_2()
            assert refusals == [ChunkFailure.LACKS] * 4
            assert await chunk(source, 1) == data[CHUNK_BYTES : 2 * CHUNK_BYTES]
            assert checked == [1, 2]  # each once, however often it is asked for
            assert service.stats["lacked"] == 6 and service.stats["served_chunks"] == 3
            store.drop_partial(partial, discard=False)  # the fetch stopped: not served
            with pytest.raises(SourceError) as gone:
                await chunk(source, 0)
            assert gone.value.failure is ChunkFailure.MISSING
            assert service._advert() is None
        finally:
            await alice.aclose()
            api.stop()


def test_partial_rows_are_advertised_after_complete_ones_and_bounded(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs", 0)
    whole = store.add_file(_file(tmp_path, "a", 10), "a", "model")
    fetching = hash_file(_file(tmp_path, "b", 20))
    store.begin_partial(fetching, "b", "model")
    stopped = hash_file(_file(tmp_path, "c", 30))
    store.drop_partial(store.begin_partial(stopped, "c", "model"), discard=False)
    section = advert_section(store.entries(), store.fetching_digests())
    assert section == {"m": [[whole.digest, 10, "a"]], "p": [[fetching.digest, 20, "b"]]}
    catalogue = mesh_catalogue({"n1": section, "n2": {"m": section["p"]}})
    assert catalogue[fetching.digest].holders == ["n2"]
    assert catalogue[fetching.digest].sources() == ["n2", "n1"]  # complete holders first
    assert stopped.digest not in catalogue
    hostile: dict[str, Any] = {"m": section["m"] * 8, "p": section["p"] * 8}
    assert len(parse_advert(hostile)) == 8


async def test_a_fetch_takes_verified_chunks_from_a_holder_still_fetching(
    tmp_path: Path,
) -> None:
    src = _file(tmp_path, "src", 5 * CHUNK_BYTES + 999, seed=1)
    data, manifest = src.read_bytes(), hash_file(src)
    holders = Holders(data, manifest, {"partial": "honest", "good": "honest"})
    chunk = holders.chunk

    def lacking_from_2(holder: str, digest: bytes, index: int) -> Any:
        if holder == "partial" and index >= 2:
            raise SourceError(ChunkFailure.LACKS, "not yet")
        return chunk(holder, digest, index)

    holders.chunk = lacking_from_2  # type: ignore[method-assign]
    store = BlobStore(tmp_path / "blobs", 0)
    progress = FetchProgress(manifest.digest, "m")
    entry = await fetch_blob(store, holders, manifest.digest, ["partial", "good"], name="m",
                             kind="model", progress=progress, per_holder=2)  # fmt: skip
    assert store.path(entry.digest).read_bytes() == data  # type: ignore[union-attr]
    stats = progress.holders["partial"]
    assert stats["skipped"] is None and stats["served"] >= 1 and stats["lacks"] >= 1
