"""The peer API on a real loopback socket: signed calls reach the handler (whole and
streamed), unsigned and forged ones get 401 and are counted."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import trio

from populi_p2p.inference.peer_api import PeerApi, PeerRequest, PeerResponse, PeerRoutes
from populi_p2p.inference.peer_auth import PeerCallSigner, PeerCallVerifier
from populi_p2p.inference.peer_client import PeerClient, peer_base_url

from .conftest import ALICE, BOB, CERTS, MALLORY, keys


async def _echo(request: PeerRequest) -> PeerResponse:
    return PeerResponse(200, request.caller.encode() + b"|" + request.body)


async def _count(request: PeerRequest) -> PeerResponse:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(3):
            yield f"data: {i}\n\n".encode()

    return PeerResponse(200, chunks(), content_type="text/event-stream")


async def test_signed_calls_pass_and_others_are_refused() -> None:
    routes = PeerRoutes()
    routes.add("POST", "/peer/v1/echo", _echo)
    routes.add("GET", "/peer/v1/count", _count)
    verifier = PeerCallVerifier(keys(BOB), BOB.node_id, clock=time.time)
    api = PeerApi(verifier, routes, host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(api.run)
        base = peer_base_url("127.0.0.1", port)
        client = PeerClient(PeerCallSigner(ALICE, CERTS[ALICE.node_id], clock=time.time))
        try:
            r = await client.call(BOB.node_id, base, "POST", "/peer/v1/echo", b"hello")
            assert r.status_code == 200
            assert r.content == ALICE.node_id.encode() + b"|hello"
            async with client.stream(BOB.node_id, base, "GET", "/peer/v1/count") as s:
                got = b"".join([c async for c in s.aiter_raw()])
            assert got == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
            # Unsigned: 401.
            async with httpx.AsyncClient() as plain:
                r = await plain.post(base + "/peer/v1/echo", content=b"hello")
                assert r.status_code == 401
            # Signed by a key the cluster never enrolled (with Alice's certificate): 401.
            forger = PeerClient(PeerCallSigner(MALLORY, CERTS[ALICE.node_id], clock=time.time))
            r = await forger.call(BOB.node_id, base, "POST", "/peer/v1/echo", b"x")
            assert r.status_code == 401
            await forger.aclose()
            r = await client.call(BOB.node_id, base, "POST", "/peer/v1/nothing")
            assert r.status_code == 404
        finally:
            await client.aclose()
        stats = api.statistics()
        assert stats["accepted"] == 2
        assert stats["refused"] == {"bad_certificate": 1, "missing": 1}
        api.stop()


def test_routes_refuse_duplicates() -> None:
    import pytest

    routes = PeerRoutes()
    routes.add("GET", "/a", _echo)
    with pytest.raises(ValueError, match="already registered"):
        routes.add("get", "/a", _echo)
    assert routes.find("POST", "/a") is False
    assert routes.find("GET", "/b") is None


async def test_an_outsiders_body_is_never_read_and_a_members_is_checked_after() -> None:
    """The caller is checked from the headers before the body is read: an unsigned or
    foreign call is refused without one `receive`; a member's altered body is read,
    then refused for its signature."""
    routes = PeerRoutes()
    routes.add("POST", "/peer/v1/echo", _echo)
    verifier = PeerCallVerifier(keys(BOB), BOB.node_id, clock=time.time)
    api = PeerApi(verifier, routes, host="127.0.0.1", port=0)
    sent: list[dict[str, object]] = []
    reads = [0]

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def receive() -> dict[str, object]:
        reads[0] += 1
        return {"type": "http.request", "body": b"tampered", "more_body": False}

    def scope(headers: dict[str, str]) -> dict[str, object]:
        raw = [(k.encode(), v.encode()) for k, v in headers.items()]
        return {"type": "http", "method": "POST", "path": "/peer/v1/echo", "headers": raw}

    forger = PeerCallSigner(MALLORY, CERTS[ALICE.node_id], clock=time.time)
    for headers in (
        {"content-length": "8"},
        forger.headers("POST", "/peer/v1/echo", b"x", BOB.node_id),
    ):
        await api.app(scope(headers), receive, send)  # type: ignore[arg-type]
        assert sent[-2]["status"] == 401 and reads == [0]
    member = PeerCallSigner(ALICE, CERTS[ALICE.node_id], clock=time.time)
    headers = member.headers("POST", "/peer/v1/echo", b"original", BOB.node_id)
    await api.app(scope(headers), receive, send)  # type: ignore[arg-type]
    assert sent[-2]["status"] == 401 and reads == [1]
    assert api.statistics()["refused"] == {"bad_certificate": 1, "bad_signature": 1, "missing": 1}
