"""`PeerClient`: every call signed for its callee, whole or streamed, and a bulk twin."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from populi_p2p.inference._asgi import (
    header_map,
    lifespan,
    read_body,
    send_json,
    send_stream,
    serve_tcp,
)
from populi_p2p.inference.peer_auth import PeerCallSigner, PeerCallVerifier
from populi_p2p.inference.peer_client import PeerClient, peer_base_url

from .conftest import ALICE, BOB, CERTS, keys


@pytest.mark.parametrize(
    ("host", "url"),
    [("10.0.0.7", "http://10.0.0.7:7951"), ("fd7a::1", "http://[fd7a::1]:7951")],
)
def test_peer_base_url_brackets_ipv6(host: str, url: str) -> None:
    assert peer_base_url(host, 7951) == url


class Callee:
    """Bob's peer API as far as the client can tell: it checks each call's signature."""

    def __init__(self) -> None:
        self.verifier = PeerCallVerifier(keys(BOB), BOB.node_id, clock=time.time)
        self.seen: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        headers = header_map(scope)
        body = await read_body(receive, 1 << 20)
        caller = self.verifier.verify(scope["method"], scope["path"], headers, body)
        self.seen.append({"caller": caller, "body": body, "type": headers["content-type"]})
        if scope["path"] == "/peer/v1/stream":

            async def parts() -> AsyncIterator[bytes]:
                for part in (b"one ", b"two"):
                    yield part

            await send_stream(send, 200, parts(), content_type="text/plain")
        else:
            await send_json(send, 200, {"echo": body.decode()})


@pytest.fixture
async def bob(nursery: trio.Nursery) -> tuple[Callee, str]:
    callee = Callee()
    port = await nursery.start(
        lambda task_status: serve_tcp(
            callee, "127.0.0.1", 0, logger_name="test", task_status=task_status
        )
    )
    return callee, peer_base_url("127.0.0.1", port)


async def test_a_call_is_signed_for_its_callee(bob: tuple[Callee, str]) -> None:
    callee, base = bob
    client = PeerClient(PeerCallSigner(ALICE, CERTS[ALICE.node_id], clock=time.time))
    try:
        r = await client.call(BOB.node_id, base, "POST", "/peer/v1/echo", b"hello")
        assert r.status_code == 200 and r.json() == {"echo": "hello"}
        assert callee.seen == [
            {"caller": ALICE.node_id, "body": b"hello", "type": "application/json"}
        ]
    finally:
        await client.aclose()


async def test_a_streamed_answer_is_read_as_it_comes(bob: tuple[Callee, str]) -> None:
    callee, base = bob
    client = PeerClient(PeerCallSigner(ALICE, CERTS[ALICE.node_id], clock=time.time))
    try:
        async with client.stream(BOB.node_id, base, "POST", "/peer/v1/stream") as response:
            assert response.status_code == 200
            body = b"".join([part async for part in response.aiter_raw()])
        assert body == b"one two"
        assert callee.seen[-1]["caller"] == ALICE.node_id
        assert response.is_closed
        assert client.backend is not None and client.backend.sends > 0
    finally:
        await client.aclose()


async def test_the_bulk_twin_shares_the_signer_and_closes_with_it(
    bob: tuple[Callee, str],
) -> None:
    callee, base = bob
    client = PeerClient(
        PeerCallSigner(ALICE, CERTS[ALICE.node_id], clock=time.time), connect_timeout=1.5
    )
    bulk = client.bulk()
    assert client.bulk() is bulk and bulk.backend is None
    assert bulk._timeouts == (1.5, 30.0)
    r = await bulk.call(BOB.node_id, base, "GET", "/peer/v1/blob")
    assert r.status_code == 200 and callee.seen[-1]["caller"] == ALICE.node_id
    await client.aclose()
    assert client._client.is_closed and bulk._client.is_closed


async def test_a_streamed_call_keeps_its_read_timeout(nursery: trio.Nursery) -> None:
    """`stream` skips httpx's client (`open_response`), so its timeouts travel in the
    request: a callee that takes the call and never answers is given up on."""
    quiet = trio.Event()

    async def silent(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        await read_body(receive, 1 << 20)
        quiet.set()
        await trio.sleep_forever()

    port = await nursery.start(
        lambda task_status: serve_tcp(
            silent, "127.0.0.1", 0, logger_name="test", task_status=task_status
        )
    )
    client = PeerClient(
        PeerCallSigner(ALICE, CERTS[ALICE.node_id], clock=time.time), read_timeout=0.2
    )
    try:
        with trio.fail_after(10), pytest.raises(httpx.ReadTimeout):
            async with client.stream(
                BOB.node_id, peer_base_url("127.0.0.1", port), "POST", "/peer/v1/stream"
            ):
                pass  # pragma: no cover
        assert quiet.is_set()
    finally:
        await client.aclose()
