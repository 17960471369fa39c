"""The chunk endpoint (issue 21): an outsider and an enrolled non-member are refused
before the store is read; a member's transfers are capped (503 beyond the cap, the
slots freed however a transfer ends)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import trio

from populi_p2p.blobs import CHUNK_BYTES, BlobStore
from populi_p2p.blobs.service import CHUNK_PATH, MANIFEST_PATH, BlobService
from populi_p2p.inference.peer_api import PeerApi, PeerRoutes
from populi_p2p.inference.peer_auth import PeerCallSigner, PeerCallVerifier
from populi_p2p.inference.peer_client import PeerClient, peer_base_url
from tests.inference.conftest import ALICE, BOB, CERTS, MALLORY, keys


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
    from tests.inference.conftest import AUTHORITY, NOW

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
