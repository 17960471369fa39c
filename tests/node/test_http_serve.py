"""The limits every HTTP listener is served under (`populi_p2p._http_serve`), on real
loopback sockets: the per-source and total connection caps, the header deadline, the
body deadline, and ``Connection: close`` on an answer sent before the body was read."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from populi_p2p._asgi import Receive, Scope, Send, send_json
from populi_p2p._http_serve import ConnectionGate, EagerLock, HttpLimits, serve_http
from populi_p2p.inference._asgi import read_body

#: Generous bounds: what must happen happens long before them.
WITHIN = 10.0


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """GET: 200. POST /read: reads the body, then 200. Other POSTs: 401 unread."""
    if scope["method"] == "GET":
        await send_json(send, 200, {"ok": True})
    elif scope["path"] == "/read":
        body = await read_body(receive, 1 << 20)
        await send_json(send, 200, {"read": len(body)})
    else:
        await send_json(send, 401, {"error": "who are you"})


@asynccontextmanager
async def _serving(limits: HttpLimits) -> AsyncIterator[tuple[ConnectionGate, int]]:
    gate = ConnectionGate(limits)
    async with trio.open_nursery() as nursery:
        names = await nursery.start(
            functools.partial(serve_http, _app, "127.0.0.1:0", gate, logger_name="test.http")
        )
        yield gate, int(names[0][1])
        nursery.cancel_scope.cancel()


async def _connect(port: int, source: str = "127.0.0.1") -> trio.socket.SocketType:
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    return sock


async def _answer(sock: trio.socket.SocketType) -> bytes:
    """Whatever the server sends until it stops for a moment or closes (b"": closed)."""
    data = b""
    with trio.fail_after(WITHIN):
        while b"\r\n\r\n" not in data:
            chunk = await sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    with trio.move_on_after(0.2):  # the rest of a small body
        data += await sock.recv(65536)
    return data


async def _closed(sock: trio.socket.SocketType) -> bool:
    with trio.fail_after(WITHIN):
        while True:
            try:
                if not await sock.recv(65536):
                    return True
            except ConnectionResetError:
                return True


def test_caps_follow_the_open_file_limit() -> None:
    assert HttpLimits.for_open_files(1024) == HttpLimits(per_source=32, total=128)
    assert HttpLimits.for_open_files(1 << 20).total == 1024
    assert HttpLimits.for_open_files(64) == HttpLimits(per_source=4, total=16)
    with pytest.raises(ValueError, match="per_source"):
        HttpLimits(per_source=5, total=4)


#: A request whose body never comes: in flight until its body deadline.
BUSY = b"POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12"


async def _in_flight(gate: ConnectionGate, n: int) -> None:
    """Wait until `n` connections have a request in flight."""
    with trio.fail_after(WITHIN):
        while len(gate._scopes) - len(gate._idle) < n:
            await trio.sleep(0.01)


async def test_a_source_over_its_cap_is_closed_and_a_full_busy_listener_waits() -> None:
    async with _serving(HttpLimits(per_source=2, total=3)) as (gate, port):
        held = [await _connect(port), await _connect(port)]
        over = await _connect(port)
        assert await _closed(over)  # the third from 127.0.0.1: closed at once
        third = await _connect(port, "127.0.0.2")
        for sock in [*held, third]:
            await sock.send(BUSY)
        await _in_flight(gate, 3)
        waiting = await _connect(port, "127.0.0.3")  # the kernel's backlog holds it
        await waiting.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        with trio.move_on_after(0.3):
            assert not await waiting.recv(1), "answered beyond the total cap"
        held.pop().close()
        assert b"HTTP/1.1 200" in await _answer(waiting)
        stats = gate.statistics()
        assert stats["refused_per_source"] == 1
        assert stats["waited_full"] >= 1
        assert stats["evicted_idle"] == 0, "a request in flight is never cut"
        for sock in [*held, third, waiting]:
            sock.close()
        with trio.fail_after(WITHIN):
            while gate.open:
                await trio.sleep(0.01)


async def test_a_full_listener_closes_the_oldest_idle_connection_for_a_newcomer() -> None:
    """Slow headers from many addresses fill the listener: each newcomer gets in by
    closing the oldest of them; the one request in flight is never cut."""
    async with _serving(HttpLimits(per_source=1, total=4)) as (gate, port):
        busy = await _connect(port, "127.0.0.9")
        await busy.send(BUSY)
        await _in_flight(gate, 1)
        slow = []
        for i in range(3):  # headers trickling in: no request yet
            sock = await _connect(port, f"127.0.0.{20 + i}")
            await sock.send(b"GET / HT")
            slow.append(sock)
        with trio.fail_after(WITHIN):
            while gate.open < 4:
                await trio.sleep(0.01)
        newcomers = []  # kept open (idle keep-alive, newer than the slow ones)
        for i in range(3):
            newcomer = await _connect(port, f"127.0.0.{30 + i}")
            await newcomer.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"HTTP/1.1 200" in await _answer(newcomer)
            assert await _closed(slow[i]), "the oldest idle connection goes first"
            newcomers.append(newcomer)
        assert gate.statistics()["evicted_idle"] == 3
        await busy.send(b"34567890")  # the rest of its body: answered, never cut
        assert b"HTTP/1.1 200" in await _answer(busy)
        for sock in [busy, *newcomers]:
            sock.close()


async def test_headers_trickled_in_are_cut_at_the_deadline() -> None:
    async with _serving(HttpLimits(idle_timeout=0.5)) as (_, port):
        sock = await _connect(port)

        async def trickle() -> None:
            for byte in b"GET / HTTP/1.1\r\nHost: x" + b"y" * 1000:
                try:
                    await sock.send(bytes([byte]))
                except OSError:
                    return
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle)
            assert await _closed(sock)
            nursery.cancel_scope.cancel()
        sock.close()


async def test_a_slow_body_gets_408_and_the_connection_closes() -> None:
    async with _serving(HttpLimits(body_timeout=0.5)) as (_, port):
        sock = await _connect(port)
        await sock.send(b"POST /read HTTP/1.1\r\nHost: x\r\ncontent-length: 100\r\n\r\n{")
        answer = await _answer(sock)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"\r\nconnection: close" in answer.lower()
        assert await _closed(sock)
        sock.close()


async def test_early_answers_close_and_others_keep_alive() -> None:
    async with _serving(HttpLimits()) as (_, port):
        sock = await _connect(port)
        for _ in range(2):  # keep-alive: no Connection: close on a whole exchange
            await sock.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await _answer(sock)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            assert b"connection: close" not in answer.lower()
        await sock.send(b"POST /read HTTP/1.1\r\nHost: x\r\ncontent-length: 2\r\n\r\n{}")
        answer = await _answer(sock)
        assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" not in answer.lower()
        # Answered without reading the body: the connection ends, and says so.
        await sock.send(b"POST /no HTTP/1.1\r\nHost: x\r\ncontent-length: 5\r\n\r\n")
        answer = await _answer(sock)
        assert answer.startswith(b"HTTP/1.1 401"), answer
        assert b"\r\nconnection: close" in answer.lower()
        assert await _closed(sock)
        sock.close()


async def test_an_early_answer_reaches_a_client_still_sending_its_body() -> None:
    """A 401 sent at the headers of a 4 MiB body, to a client that sends its whole
    request before it reads (as many do): the daemon sends its FIN, then lingers,
    dropping the rest, so the client reads the 401. Closed at once instead, with the
    body still arriving, the connection is reset, and the reset drops the answer the
    client had not read yet."""
    body = 4 << 20
    async with _serving(HttpLimits()) as (_, port):
        for _ in range(3):
            sock = await _connect(port)
            data = memoryview(
                f"POST /no HTTP/1.1\r\nHost: x\r\ncontent-length: {body}\r\n\r\n".encode()
                + bytes(body)
            )
            with trio.fail_after(WITHIN):
                while data:
                    data = data[await sock.send(data[: 1 << 16]) :]
            answer = await _answer(sock)
            assert answer.startswith(b"HTTP/1.1 401"), answer
            assert b"\r\nconnection: close" in answer.lower()
            sock.close()


async def test_an_eager_lock_yields_only_when_it_must_wait() -> None:
    """Free, it is taken without a checkpoint (a `trio.Lock` always takes one, a
    scheduling round, and an answer's write passes two locks); held, a second task
    waits its turn."""
    lock = EagerLock()
    entered: list[str] = []
    for kind, each in (("eager", lock), ("trio", trio.Lock())):
        with trio.CancelScope() as scope:
            scope.cancel()  # any checkpoint on the way in raises Cancelled
            async with each:
                entered.append(kind)
    assert entered == ["eager"]

    order: list[str] = []

    async def holder(name: str, task_status: trio.TaskStatus[None]) -> None:
        async with lock:
            task_status.started()
            order.append(f"{name} in")
            await trio.sleep(0.01)
            order.append(f"{name} out")

    async with trio.open_nursery() as nursery:
        await nursery.start(holder, "a")
        await nursery.start(holder, "b")  # returns once b holds it: after a let go
    assert order == ["a in", "a out", "b in", "b out"]
