"""Serving the node's HTTP listeners under limits an outsider cannot exhaust.

HTTP is hypercorn's (its Trio worker's `TCPServer`, one per connection); this module
only decides which connections it gets and for how long. Every listener (the peer API,
``--api-listen`` with the dashboard on it, the control API's unix socket) is served by
`serve_http`, which does what hypercorn's ``worker_serve`` does, with two additions:

- `ConnectionGate`: at most `HttpLimits.total` open connections per listener, at most
  `HttpLimits.per_source` from one address (Consul's ``http_max_conns_per_client``). A
  connection over its source's cap is closed at once and counted, so the daemon never
  runs out of file descriptors for its other sockets, files and tasks. At the total
  cap, when a newcomer waits in the kernel's backlog, the oldest TCP connection with no
  request in flight (headers still trickling in, or an idle keep-alive) is closed to
  let it in (`evicted`): an attacker with many addresses cannot hold the listener with
  slow headers, and a request in flight is never cut. With every connection busy the
  newcomer waits for one to close.
- `guard_app`, around the app: a request's body must arrive within
  `HttpLimits.body_timeout` (else 408), and any answer sent before the whole body was
  read (a 401, 413, 408...) carries ``Connection: close``, so a keep-alive client knows
  that the connection ends there.

Headers and idle keep-alive share hypercorn's keep-alive timer (`HttpLimits.idle_timeout`):
it runs from the connect, or from the end of the previous answer, until a request's
headers are complete, and bytes trickling in do not reset it. Header size is h11's
``max_incomplete_event_size`` (16 KiB). There is no read timeout while a request runs:
a streamed answer may legitimately hear nothing from its client for minutes.

A response's head and its first body go out in one write when the app says the body
follows at once (`WITH_BODY` on its ``http.response.start``), and a last body goes out
with the end of the message (chunked encoding's ``0\r\n\r\n``): hypercorn writes each
HTTP event as its own send, and each costs a syscall and wakes the client, which on a
busy machine can cost the sender its CPU, for a part of what the client waits for.

Closing after an early answer lingers, as nginx's ``lingering_close`` does
(`LingeringStream`): the daemon sends its FIN after the answer, then reads and drops
what the client still sends, for at most `LINGER_SECONDS` and `LINGER_BYTES`, before
it closes. Closing at once with a body still arriving makes the kernel send a reset,
and a reset makes the client's kernel drop the answer it had not read yet: the client
saw a dead connection instead of its 401 or 413.

`raise_open_file_limit` lifts the soft RLIMIT_NOFILE to the hard limit at start-up; the
caps (`HttpLimits.for_open_files`) follow whatever limit the process ends up with.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import resource
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from ._asgi import WITH_BODY, AsgiApp, Message, Receive, Scope, Send, send_json

if TYPE_CHECKING:
    import hypercorn.config

__all__ = [
    "ConnectionGate",
    "HttpLimits",
    "guard_app",
    "raise_open_file_limit",
    "serve_http",
]

#: Seconds for a request's headers, counted from the connect or from the end of the
#: previous answer; also how long an idle keep-alive connection stays open.
IDLE_TIMEOUT: Final = 10.0
#: Seconds for a request's whole body, counted from its headers.
BODY_TIMEOUT: Final = 30.0
#: Each listener's total cap is the open-file limit over this (three listeners then
#: hold at most 3/8 of the descriptors), within `TOTAL_MIN` and `TOTAL_MAX`.
OPEN_FILES_PER_CONNECTION: Final = 8
TOTAL_MIN: Final = 16
TOTAL_MAX: Final = 1024
#: The per-source cap is the total cap over this (one address never takes it all).
SOURCES_MIN: Final = 4
#: How long, and how many bytes, a closing connection reads and drops before it closes.
LINGER_SECONDS: Final = 2.0
LINGER_BYTES: Final = 16 << 20
#: Below this many open files the start-up log says the limit is low.
OPEN_FILES_LOW: Final = 4096
#: The soft limit asked for when the hard limit is unlimited (Linux's default nr_open).
OPEN_FILES_UNLIMITED: Final = 1 << 20


@attrs.frozen
class HttpLimits:
    """One listener's limits (docs/operations.md, "HTTP listeners")."""

    #: Open connections from one address (a unix socket's peers are one source).
    per_source: int = 32
    #: Open connections in all; the listener waits for one to close beyond it.
    total: int = 128
    idle_timeout: float = IDLE_TIMEOUT
    body_timeout: float = BODY_TIMEOUT

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.per_source <= self.total:
            raise ValueError(f"per_source {self.per_source} must be in 1..total {self.total}")
        if self.idle_timeout <= 0 or self.body_timeout <= 0:
            raise ValueError("the HTTP timeouts must be positive")

    @classmethod
    def for_open_files(cls, open_files: int | None = None, **kwargs: Any) -> HttpLimits:
        """The caps for an open-file limit (default: this process's soft limit):
        1,024 files give 128 connections per listener, 32 per source."""
        if open_files is None:
            open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            if open_files == resource.RLIM_INFINITY:
                open_files = OPEN_FILES_UNLIMITED
        total = max(TOTAL_MIN, min(TOTAL_MAX, open_files // OPEN_FILES_PER_CONNECTION))
        return cls(per_source=total // SOURCES_MIN, total=total, **kwargs)


def raise_open_file_limit() -> tuple[int, int]:
    """Lift the soft RLIMIT_NOFILE to the hard limit; returns (soft, hard) after.

    A soft limit that cannot be raised stays as it was (the caps follow it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_UNLIMITED if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


class ConnectionGate:
    """The connection caps of one listener, and what they refused (`statistics`)."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self._slots = trio.Semaphore(limits.total)
        self._by_source: Counter[str] = Counter()
        self._refused_per_source = 0
        self._waited_full = 0
        self._accepted = 0
        self._evicted = 0
        #: TCP connections by peer (host, port): the scope that cancels each, and those
        #: with no request in flight, oldest first (insertion order).
        self._scopes: dict[tuple[str, int], trio.CancelScope] = {}
        self._idle: dict[tuple[str, int], None] = {}

    @property
    def open(self) -> int:
        """Connections admitted and not yet closed."""
        return self._by_source.total()

    async def slot(self) -> None:
        """Wait for a free slot (counted when the listener was full)."""
        if self._slots.value == 0:
            self._waited_full += 1
        await self._slots.acquire()

    def admit(self, source: str) -> bool:
        """Whether `source` may have the slot just acquired (False: over its cap)."""
        if self._by_source[source] >= self.limits.per_source:
            self._refused_per_source += 1
            return False
        self._by_source[source] += 1
        self._accepted += 1
        return True

    @property
    def full(self) -> bool:
        return self._slots.value == 0

    def opened(self, peer: tuple[str, int], scope: trio.CancelScope) -> None:
        """A TCP connection's handler started under `scope`; no request in it yet."""
        self._scopes[peer] = scope
        self._idle[peer] = None

    def closed(self, peer: tuple[str, int]) -> None:
        self._scopes.pop(peer, None)
        self._idle.pop(peer, None)

    def request(self, peer: tuple[str, int], running: bool) -> None:
        """A request on `peer`'s connection began (`running`) or was answered."""
        if peer not in self._scopes:
            return
        self._idle.pop(peer, None)
        if not running:
            self._idle[peer] = None  # idle again: now the newest

    def evict_oldest_idle(self) -> bool:
        """Close the oldest connection with no request in flight (False: none)."""
        for peer in self._idle:
            del self._idle[peer]
            self._scopes[peer].cancel()
            self._evicted += 1
            return True
        return False

    def release(self, source: str | None) -> None:
        """A connection closed (`source` None: the slot was never admitted)."""
        if source is not None:
            self._by_source[source] -= 1
            if self._by_source[source] <= 0:
                del self._by_source[source]
        self._slots.release()

    def statistics(self) -> dict[str, int]:
        return {
            "open": self.open,
            "total_cap": self.limits.total,
            "per_source_cap": self.limits.per_source,
            "accepted": self._accepted,
            "refused_per_source": self._refused_per_source,
            "waited_full": self._waited_full,
            "evicted_idle": self._evicted,
        }


def _source(stream: trio.SocketStream) -> str | None:
    """The peer's address (without the port), "" for a unix socket, None if gone."""
    try:
        peer = stream.socket.getpeername()
    except OSError:
        return None
    return str(peer[0]) if isinstance(peer, tuple) else ""


class _GatedListener(trio.abc.Listener[trio.SocketStream]):
    """`inner`, accepting only what `gate` admits; `release` when a stream is done."""

    def __init__(self, inner: trio.SocketListener, gate: ConnectionGate) -> None:
        self._inner = inner
        self._gate = gate
        self._sources: dict[trio.SocketStream, str] = {}

    async def accept(self) -> trio.SocketStream:
        while True:
            if self._gate.full:
                # Only for a newcomer actually waiting: then make room if we can.
                await trio.lowlevel.wait_readable(self._inner.socket)
                self._gate.evict_oldest_idle()
            await self._gate.slot()
            try:
                stream = await self._inner.accept()
            except BaseException:
                self._gate.release(None)
                raise
            source = _source(stream)
            if source is not None and self._gate.admit(source):
                self._sources[stream] = source
                return stream
            self._gate.release(None)
            stream.socket.close()  # over its source's cap, or already gone: at once

    def release(self, stream: trio.SocketStream) -> None:
        self._gate.release(self._sources.pop(stream))

    async def aclose(self) -> None:
        await self._inner.aclose()


class EagerLock:
    """A lock whose acquire yields to the scheduler only when it must wait (a
    `trio.Lock` always yields). A write of an answer passes two locks, hypercorn's and
    `LingeringStream`'s; each yield was one more scheduling round on the way to the
    socket, on every hop of a relayed stream."""

    def __init__(self) -> None:
        self._lock = trio.Lock()

    async def __aenter__(self) -> None:
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()


class LingeringStream(trio.abc.HalfCloseableStream):
    """`stream` for hypercorn, whose `aclose` only sends our FIN and starts lingering:
    from then on `receive_some` drops what arrives and ends the stream (b"") when the
    client closes, after `LINGER_BYTES`, or at `LINGER_SECONDS`. The socket itself is
    closed by whoever handed the stream out (`serve_http`'s handler). `hold_next_write`
    keeps a response head back to go out with the body that follows it."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self.socket = stream.socket  # hypercorn reads the peer's address from it
        self._linger_until: float | None = None
        # hypercorn sends under its own lock but closes outside it: its send_eof then
        # met an answer still being sent (trio's BusyResourceError, a traceback).
        self._sending = EagerLock()
        self._holds = 0
        self._held = b""

    def hold_next_write(self) -> None:
        """The next write waits for the one after it: both go out as one send."""
        self._holds += 1

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async with self._sending:
            if self._holds:
                self._holds -= 1
                self._held += bytes(data)
                return
            if self._held:
                data, self._held = self._held + bytes(data), b""
            await self._stream.send_all(data)

    async def _flush_held(self) -> None:
        if self._held:
            data, self._held = self._held, b""
            await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        async with self._sending:
            await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        async with self._sending:
            await self._flush_held()
            await self._stream.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._linger_until is None:
            return await self._stream.receive_some(max_bytes)
        dropped = 0
        with trio.move_on_at(self._linger_until):
            while dropped < LINGER_BYTES:
                data = await self._stream.receive_some(1 << 16)
                if not data:
                    break
                dropped += len(data)
        return b""

    async def aclose(self) -> None:
        if self._linger_until is None:
            self._linger_until = trio.current_time() + LINGER_SECONDS
            async with self._sending:  # after the answer in flight, if any
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._flush_held()
                if not self.socket.did_shutdown_SHUT_WR:
                    try:
                        self.socket.shutdown(trio.socket.SHUT_WR)  # our answer ends here
                    except OSError:
                        pass  # the peer is gone
        await trio.lowlevel.checkpoint()


#: The connection a request came on (set per connection by `serve_http`; the app's
#: tasks inherit it), for `guard_app` to hold a response head for its body.
_CONNECTION: contextvars.ContextVar[LingeringStream | None] = contextvars.ContextVar(
    "populi_http_connection", default=None
)


def _has_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", []):
        name = bytes(name).lower()
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def _peer(value: Any) -> tuple[str, int] | None:
    """A TCP peer's (host, port) from a socket name or an ASGI ``client``; None else."""
    if isinstance(value, list | tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None


def guard_app(
    app: AsgiApp, body_timeout: float, on_request: Callable[[tuple[str, int], bool], None]
) -> AsgiApp:
    """`app` with a body deadline, and ``Connection: close`` on every early answer;
    `on_request(peer, running)` hears when a TCP connection's request begins and ends."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        peer = _peer(scope.get("client"))
        if peer is None:
            await _guarded(scope, receive, send)
            return
        on_request(peer, True)
        try:
            await _guarded(scope, receive, send)
        finally:
            on_request(peer, False)

    async def _guarded(scope: Scope, receive: Receive, send: Send) -> None:
        body_read = not _has_body(scope)
        started = timed_out = body_written = False
        deadline = trio.current_time() + body_timeout

        async def receive_in_time() -> Message:
            nonlocal body_read, timed_out
            if body_read:
                return await receive()
            with trio.move_on_at(deadline):
                message = await receive()
                body_read = message["type"] != "http.request" or not message.get("more_body")
                return message
            timed_out = True
            app_scope.cancel()
            await trio.lowlevel.checkpoint()  # raises Cancelled: the app stops here
            raise AssertionError("unreachable: the app's scope was cancelled")

        async def send_marked(message: Message) -> None:
            nonlocal started, body_written
            connection = _CONNECTION.get()
            if message["type"] == "http.response.start":
                started = True
                status = message.get("status", 200)
                body_written = scope.get("method") != "HEAD" and status not in (204, 304)
                if message.get(WITH_BODY) and connection is not None:
                    connection.hold_next_write()
                if WITH_BODY in message:
                    message = {k: v for k, v in message.items() if k != WITH_BODY}
                if not body_read:
                    headers = list(message.get("headers", []))
                    if not any(bytes(k).lower() == b"connection" for k, _ in headers):
                        message = {**message, "headers": [*headers, (b"connection", b"close")]}
            elif (
                message["type"] == "http.response.body"
                and not message.get("more_body")
                and message.get("body")
                and body_written
                and connection is not None
            ):
                connection.hold_next_write()  # goes out with the end of the message
            await send(message)

        with trio.CancelScope() as app_scope:
            await app(scope, receive_in_time, send_marked)
        if timed_out and not started:
            error = f"the request body did not arrive within {body_timeout:g} s"
            await send_json(send, 408, {"error": error}, headers=[(b"connection", b"close")])

    return guarded


def _hypercorn_config(
    bind: str, umask: int | None, logger_name: str, idle_timeout: float
) -> hypercorn.config.Config:
    """hypercorn's settings for one server: no access log, warnings to `logger_name`,
    no server header, 1 s of grace at shutdown, idle connections kept `idle_timeout`."""
    from hypercorn.config import Config

    config = Config()
    config.bind = [bind]
    if umask is not None:
        config.umask = umask
    config.accesslog = None
    server_log = logging.getLogger(logger_name)
    server_log.setLevel(logging.WARNING)
    config.errorlog = server_log
    config.graceful_timeout = 1.0
    config.include_server_header = False
    config.keep_alive_timeout = idle_timeout
    return config


async def serve_http(
    app: AsgiApp,
    bind: str,
    gate: ConnectionGate,
    *,
    logger_name: str,
    umask: int | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[Any]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `bind` (hypercorn's ``host:port``, ``[v6]:port`` or ``unix:path``)
    under `gate` until cancelled or `shutdown_trigger` returns; started with the bound
    socket names. At shutdown, answers in flight get 1 s."""
    from hypercorn.app_wrappers import ASGIWrapper
    from hypercorn.trio.tcp_server import TCPServer
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.typing import ConnectionState

    config = _hypercorn_config(bind, umask, logger_name, gate.limits.idle_timeout)
    sockets = config.create_sockets().insecure_sockets
    listeners = []
    for sock in sockets:
        sock.listen(config.backlog)
        inner = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        listeners.append(_GatedListener(inner, gate))
    guarded = guard_app(app, gate.limits.body_timeout, gate.request)
    wrapped = ASGIWrapper(guarded)  # type: ignore[arg-type]
    context = WorkerContext(None)

    async def handle(listener: _GatedListener, stream: trio.SocketStream) -> None:
        try:
            peer = _peer(stream.socket.getpeername())
        except OSError:
            peer = None
        try:
            with trio.CancelScope() as scope:
                if peer is not None:
                    gate.opened(peer, scope)
                _CONNECTION.set(lingering := LingeringStream(stream))
                server = TCPServer(wrapped, config, context, ConnectionState({}), lingering)  # type: ignore[arg-type]
                server.send_lock = EagerLock()  # type: ignore[assignment]
                await server
        finally:
            # Cancelled (evicted, or at shutdown), hypercorn's own close stops at its
            # first checkpoint: close the socket here, whatever happened.
            stream.socket.close()
            if peer is not None:
                gate.closed(peer)
            listener.release(stream)

    try:
        async with trio.open_nursery() as connections:
            task_status.started([sock.getsockname() for sock in sockets])
            try:
                async with trio.open_nursery() as accepting:
                    for listener in listeners:
                        serve = functools.partial(
                            trio.serve_listeners, functools.partial(handle, listener),
                            [listener], handler_nursery=connections,
                        )  # fmt: skip
                        accepting.start_soon(serve)
                    if shutdown_trigger is None:
                        await trio.sleep_forever()
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
            finally:
                await context.terminated.set()
                connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
    finally:
        with trio.CancelScope(shield=True):
            for listener in listeners:
                await listener.aclose()
