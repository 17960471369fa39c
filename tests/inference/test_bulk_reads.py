"""`bulk_transport`: httpx's transport whose connections read big pieces (blob chunks)."""

from __future__ import annotations

import functools
from typing import Any

import httpx
import pytest
import trio

from populi_p2p.inference._bulk_reads import bulk_transport
from populi_p2p.inference._tls import tls_context

BODY = b"x" * (3 * 1024 * 1024)


async def _serve(stream: trio.SocketStream) -> None:
    await stream.receive_some(65536)  # the request (small, one read is enough here)
    head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(BODY)}\r\n\r\n".encode()
    await stream.send_all(head + BODY)
    await stream.aclose()


@pytest.mark.parametrize("read_bytes", [256 * 1024, 1024 * 1024])
async def test_each_socket_read_asks_for_the_bulk_size(
    read_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    receive_some = trio.SocketStream.receive_some

    async def recording(self: trio.SocketStream, max_bytes: int | None = None) -> Any:
        asked.append(max_bytes or 0)
        return await receive_some(self, max_bytes)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, _serve, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        monkeypatch.setattr(trio.SocketStream, "receive_some", recording)
        limits = httpx.Limits(max_connections=4)
        transport = bulk_transport(read_bytes, limits=limits, ssl_context=tls_context())
        async with httpx.AsyncClient(transport=transport, trust_env=False) as client:
            answer = await client.get(f"http://127.0.0.1:{port}/")
        monkeypatch.undo()
        nursery.cancel_scope.cancel()
    assert answer.content == BODY
    # The server read the request once with 64 KiB; httpx's own transport would read
    # the 3 MiB answer 64 KiB at a time too (tens of such reads).
    assert read_bytes in asked and asked.count(64 * 1024) <= 1, sorted(set(asked))
