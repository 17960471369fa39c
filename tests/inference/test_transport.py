"""Fewer sends on the relay's hops: a request's head and body leave in one write
(`_transport.coalescing_transport`), and a response's head goes out with its first
body (`WITH_BODY`, `_http_serve.guard_app`), on every hop of a relayed stream. What is
checked is what each side hands to its socket, not how TCP cut it."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from populi_p2p._asgi import WITH_BODY, Receive, Scope, Send, send_json
from populi_p2p._http_serve import ConnectionGate, HttpLimits, serve_http
from populi_p2p.inference._asgi import read_body, send_stream
from populi_p2p.inference._tls import tls_context
from populi_p2p.inference._transport import FLUSH_BYTES, coalescing_transport


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every buffer handed to a trio socket stream's send_all, in this process."""
    sent: list[bytes] = []
    original = trio.SocketStream.send_all

    async def recording(self: trio.SocketStream, data: bytes | bytearray | memoryview) -> None:
        sent.append(bytes(data))
        await original(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", recording)
    return sent


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the body, then streams two chunks after a marked head (or unmarked for
    ``/plain``)."""
    body = await read_body(receive, 1 << 22)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: %d\n\n" % len(body)
        await trio.sleep(0.05)
        yield b"data: [DONE]\n\n"

    if scope["path"] == "/plain":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"whole", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/json":
        await send_json(send, 200, {"ok": True})
        return
    coalesce = scope["path"] == "/coalesced"
    await send_stream(send, 200, chunks(), content_type="text/event-stream", coalesce=coalesce)


async def _serve(nursery: trio.Nursery) -> int:
    gate = ConnectionGate(HttpLimits())
    names = await nursery.start(
        functools.partial(serve_http, _app, "127.0.0.1:0", gate, logger_name="test.http")
    )
    return int(names[0][1])


async def test_a_request_is_one_write_and_a_head_goes_with_its_first_chunk(
    writes: list[bytes],
) -> None:
    async with trio.open_nursery() as nursery:
        port = await _serve(nursery)
        transport, backend = coalescing_transport(httpx.Limits(), tls_context())
        body = json.dumps({"prompt": "x" * 1000}).encode()
        async with httpx.AsyncClient(transport=transport, trust_env=False) as client:
            for _ in range(3):  # a new connection, then kept alive
                writes.clear()
                async with client.stream("POST", f"http://127.0.0.1:{port}/s", content=body) as r:
                    data = await r.aread()
                assert data == b"data: %d\n\ndata: [DONE]\n\n" % len(body)
                requests = [w for w in writes if w.startswith(b"POST /s ")]
                assert len(requests) == 1 and requests[0].endswith(body)  # head and body
                heads = [w for w in writes if w.startswith(b"HTTP/1.1 200")]
                first_chunk = b"data: %d\n\n\r\n" % len(body)  # with its chunked framing
                assert len(heads) == 1 and heads[0].endswith(first_chunk)
            # An unmarked head still goes alone, as hypercorn writes it.
            writes.clear()
            r2 = await client.get(f"http://127.0.0.1:{port}/plain")
            assert r2.content == b"whole"
            heads = [w for w in writes if w.startswith(b"HTTP/1.1 200")]
            assert len(heads) == 1 and heads[0].endswith(b"\r\n\r\n")
            # A whole answer is one write; a stream's last events go with its end.
            writes.clear()
            assert (await client.get(f"http://127.0.0.1:{port}/json")).json() == {"ok": True}
            answers = [w for w in writes if w.startswith(b"HTTP/1.1")]
            assert len(answers) == 1 and answers[0].endswith(b'{"ok": true}')
            writes.clear()
            r3 = await client.post(f"http://127.0.0.1:{port}/coalesced", content=b"")
            assert r3.content == b"data: 0\n\ndata: [DONE]\n\n"
            assert writes[-1] == b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
        assert backend.sends == 6
        nursery.cancel_scope.cancel()


async def test_a_streamed_body_is_not_held_past_the_flush_size(writes: list[bytes]) -> None:
    piece = b"y" * (FLUSH_BYTES // 2)

    async def body() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield piece

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery)
        transport, backend = coalescing_transport(httpx.Limits(), tls_context())
        url = f"http://127.0.0.1:{port}/s"
        async with (
            httpx.AsyncClient(transport=transport, trust_env=False) as client,
            client.stream("POST", url, content=body()) as r,
        ):
            assert await r.aread() == b"data: %d\n\ndata: [DONE]\n\n" % (8 * len(piece))
        assert backend.sends >= 4  # held at most FLUSH_BYTES (plus one chunk) at a time
        nursery.cancel_scope.cancel()


def test_the_mark_is_a_plain_key() -> None:
    assert WITH_BODY == "populi.with_body"
