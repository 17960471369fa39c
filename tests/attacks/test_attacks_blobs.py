"""The chunk endpoint (issue 21): an outsider and an enrolled non-member are refused
before the store is read; a member's transfers are capped (503 beyond the cap, the
slots freed however a transfer ends). A member that serves garbage after a good first
chunk never makes a fetcher keep a wrong file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import trio

from populi_p2p.blobs import CHUNK_BYTES, BlobStore, FetchProgress, fetch_blob
from populi_p2p.blobs.service import CHUNK_PATH, MANIFEST_PATH, BlobService, PeerChunkSource
from populi_p2p.inference.peer_api import PeerApi, PeerRoutes
from populi_p2p.inference.peer_auth import PeerCallSigner, PeerCallVerifier
from populi_p2p.inference.peer_client import PeerClient, peer_base_url
from populi_p2p.trust.envelope_keys import EnvelopeKeys
from tests.inference.conftest import ALICE, AUTHORITY, BOB, CERTS, MALLORY, NOW, keys


class SpyStore(BlobStore):
    """Counts every look at the store's blobs."""

    reads = 0

    def manifest(self, digest: bytes) -> Any:
        SpyStore.reads += 1
        return super().manifest(digest)

    def path(self, digest: bytes) -> Any:
        SpyStore.reads += 1
        return super().path(digest)

    def fetching(self, digest: bytes) -> Any:
        SpyStore.reads += 1
        return super().fetching(digest)


async def _noop(_name: str, _value: object) -> None:
    return None


async def test_chunks_are_for_members_only_and_transfers_are_capped(tmp_path: Path) -> None:
    src = tmp_path / "m.gguf"
    src.write_bytes(b"x" * (2 * CHUNK_BYTES))
    store = SpyStore(tmp_path / "blobs", 0)
    digest = store.add_file(src, "m", "model").hex
    members = {BOB.node_id, ALICE.node_id}  # MALLORY below is enrolled, never a member
    service = BlobService(
        store, me=BOB.node_id, is_member=members.__contains__, sections=dict,
        address_of=lambda _n: None, peer_client=lambda: None, set_section=_noop,
        max_transfers=2,
    )  # fmt: skip
    routes = PeerRoutes()
    service.register_peer_routes(routes)
    verifier = PeerCallVerifier(keys(BOB), BOB.node_id, clock=time.time)
    api = PeerApi(verifier, routes, host="127.0.0.1", port=0)
    mallory_cert = dict(CERTS)
    mallory_cert[MALLORY.node_id] = AUTHORITY.enroll(MALLORY.public_key, now=NOW, serial=9).raw
    async with trio.open_nursery() as nursery:
        port = await nursery.start(api.run)
        base = peer_base_url("127.0.0.1", port)
        alice = PeerClient(PeerCallSigner(ALICE, CERTS[ALICE.node_id], clock=time.time))
        mallory = PeerClient(
            PeerCallSigner(MALLORY, mallory_cert[MALLORY.node_id], clock=time.time)
        )
        chunk0 = f"{CHUNK_PATH}?h={digest}&i=0"
        try:
            SpyStore.reads = 0
            async with httpx.AsyncClient() as outsider:  # unsigned: 401, nothing read
                for path in (chunk0, f"{MANIFEST_PATH}?h={digest}"):
                    r = await outsider.get(base + path)
                    assert r.status_code == 401
            for path in (chunk0, f"{MANIFEST_PATH}?h={digest}"):  # enrolled, no member
                r = await mallory.call(BOB.node_id, base, "GET", path)
                assert r.status_code == 403
            assert SpyStore.reads == 0
            assert service.stats["refused_not_member"] == 2
            assert api.statistics()["refused"]["missing"] == 2
            # A member gets the chunk; past the transfer cap: 503 at once, not a queue.
            r = await alice.call(BOB.node_id, base, "GET", chunk0)
            assert r.status_code == 200 and r.content == b"x" * CHUNK_BYTES
            held = []
            for i in (0, 1):
                cm = alice.stream(BOB.node_id, base, "GET", f"{CHUNK_PATH}?h={digest}&i={i}")
                resp = await cm.__aenter__()
                assert resp.status_code == 200
                held.append(cm)
            r = await alice.call(BOB.node_id, base, "GET", chunk0)
            assert r.status_code == 503 and service.stats["refused_busy"] == 1
            for cm in held:  # the clients go away mid-chunk: the slots come back
                await cm.__aexit__(None, None, None)
            with trio.fail_after(10):
                while service.statistics()["transfers"]:
                    await trio.sleep(0.01)
            r = await alice.call(BOB.node_id, base, "GET", chunk0)
            assert r.status_code == 200
        finally:
            await alice.aclose()
            await mallory.aclose()
            api.stop()


async def test_a_member_that_turns_corrupt_after_its_first_chunk_never_makes_a_wrong_file(
    tmp_path: Path,
) -> None:
    """An insider whose first chunk is good (so the fetcher trusts it and checks its
    later chunks by the whole hash) and whose later chunks are garbage: the whole hash
    fails, the unchecked chunks are checked, its corrupt ones are fetched again from
    the honest holder, and it is skipped. The file kept is the blob, byte for byte."""
    chunks = 8
    data = bytes(range(256)) * (chunks * CHUNK_BYTES // 256)
    src = tmp_path / "m.gguf"
    src.write_bytes(data)
    sly_cert = AUTHORITY.enroll(MALLORY.public_key, now=NOW - 60, serial=9).raw
    ports: dict[str, int] = {}
    apis: list[PeerApi] = []
    async with trio.open_nursery() as nursery:
        for who, cert in ((BOB, CERTS[BOB.node_id]), (MALLORY, sly_cert)):
            store = BlobStore(tmp_path / who.node_id, 0)
            digest = store.add_file(src, "m", "model").digest
            service = BlobService(
                store, me=who.node_id, is_member={ALICE.node_id}.__contains__,
                sections=dict, address_of=lambda _n: None, peer_client=lambda: None,
                set_section=_noop,
            )  # fmt: skip
            routes = PeerRoutes()
            service.register_peer_routes(routes)
            verifier = PeerCallVerifier(
                EnvelopeKeys(who, cert, AUTHORITY.public_key), who.node_id, clock=time.time
            )
            apis.append(PeerApi(verifier, routes, host="127.0.0.1", port=0))
            ports[who.node_id] = await nursery.start(apis[-1].run)
        with open(tmp_path / MALLORY.node_id / digest.hex(), "r+b") as rotten:
            for chunk in range(1, chunks):  # its copy is good only in chunk 0
                rotten.seek(chunk * CHUNK_BYTES + 11)
                rotten.write(b"\xff\x00rot")
        alice = PeerClient(PeerCallSigner(ALICE, CERTS[ALICE.node_id], clock=time.time))
        source = PeerChunkSource(alice.bulk(), lambda n: ("127.0.0.1", ports[n]))
        store = BlobStore(tmp_path / "alice", 0)
        progress = FetchProgress(digest, "m")
        try:
            entry = await fetch_blob(
                store, source, digest, [MALLORY.node_id, BOB.node_id], name="m",
                kind="model", progress=progress, per_holder=1,
            )  # fmt: skip
        finally:
            await alice.aclose()
            for api in apis:
                api.stop()
    assert store.path(entry.digest).read_bytes() == data  # type: ignore[union-attr]
    sly, honest = progress.holders[MALLORY.node_id], progress.holders[BOB.node_id]
    assert sly["corrupt"] >= 1 and sly["skipped"] == "sent a corrupt chunk"
    assert sly["served"] == 1 and honest["served"] == chunks - 1
