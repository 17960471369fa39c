"""The TCP half of the transport: length-prefixed frames, a bounded connection pool.

TCP carries what does not fit or must not be lost in a datagram: push-pull state
exchange, large records, and the retry of a UDP probe when UDP seems filtered.

Framing: a 4-byte big-endian length, then that many payload bytes. A zero length is a
keepalive and is not delivered; it needs no authentication, so it renews the idle timer
only of an inbound connection that has already carried an authenticated frame (the
daemon says so through `Incoming.vouch`). A length above `max_frame_size` closes the
connection (the stream cannot be resynchronised, and a peer sending that is broken or
hostile).

Inbound: one accept loop; a connection from outside the accept policy is closed at once
and counted. When `max_inbound_connections` are open, the unauthenticated connection
idle the longest (no data frame for the longest time) is evicted to make room; only if
every connection is authenticated is the new one closed at once and counted. So
connections that send nothing, or only keepalives, cannot hold the slots a member needs.
Each accepted connection gets one reader task (a task per connection, never per frame)
that must deliver a frame's body within `frame_timeout` of its header (slow-loris) and
is closed after `idle_timeout` without a data frame (or a vouched-for keepalive).
Memory per connection is bounded by `max_frame_size` plus one receive buffer.

Outbound: `send_frame(address, payload)` reuses a pooled connection to `address` or
opens one within `connect_timeout`, then writes within `send_timeout`. The pool holds
at most `pool_size` connections; the least recently used idle one is evicted, and a
janitor closes those idle longer than `idle_timeout`. A write on a reused connection
that turns out dead is retried once on a fresh one. Each pooled connection also has a
reader, so a peer may answer on the same connection and so a peer's close is noticed
before the next write goes into the void.
"""

from __future__ import annotations

import errno
import math
import socket
import struct
from collections.abc import Callable

import attrs
import trio

from overlay.base import (
    Address,
    TransportError,
    format_address,
    is_ipv6_host,
    make_socket,
    normalize_source,
)
from overlay.inbox import Classifier, PriorityInbox, bulk_only, classify_and_offer
from overlay.netfilter import AcceptPolicy
from overlay.peerpaths import PathHealth

#: Largest frame accepted or sent by default: a push-pull of a few hundred signed
#: NodeRecords fits; 64 inbound connections x 1 MiB stays well inside a small daemon.
DEFAULT_MAX_FRAME_SIZE = 1 << 20

_HEADER = struct.Struct(">I")
_RECEIVE_CHUNK = 65536
_LISTEN_BACKLOG = 128
# Accept errors that mean "out of a resource, try again shortly" rather than a bug.
_ACCEPT_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def encode_frame(payload: bytes) -> bytes:
    """The wire form of one frame: 4-byte big-endian length, then the payload."""
    return _HEADER.pack(len(payload)) + payload


@attrs.frozen
class TcpConfig:
    """Limits and timeouts of a `TcpEndpoint`; all durations in seconds.

    Attributes:
        max_frame_size: largest payload per frame, both directions.
        max_inbound_connections: concurrent accepted connections; more are closed at once.
        pool_size: outbound connections kept open for reuse.
        connect_timeout: bound on opening an outbound connection.
        send_timeout: bound on writing one frame (a peer that stops reading).
        idle_timeout: a connection without traffic this long is closed (both directions).
        frame_timeout: once a frame's header has arrived, its body must arrive this fast.
    """

    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_inbound_connections: int = 64
    pool_size: int = 32
    connect_timeout: float = 2.0
    send_timeout: float = 5.0
    idle_timeout: float = 60.0
    frame_timeout: float = 10.0

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.max_frame_size <= 0xFFFFFFFF:
            raise ValueError(f"max_frame_size must be in 1..2**32-1, got {self.max_frame_size}")
        for name in ("max_inbound_connections", "pool_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("connect_timeout", "send_timeout", "idle_timeout", "frame_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@attrs.frozen
class TcpStatistics:
    """Counters of a `TcpEndpoint`.

    Attributes:
        inbound_accepted: connections accepted and served.
        inbound_refused_source: connections closed because the source is outside the policy.
        inbound_refused_capacity: connections closed because `max_inbound_connections`
            authenticated connections were open.
        inbound_evicted: unauthenticated connections closed to make room for a new one.
        inbound_active: accepted connections open now.
        accept_errors: errors from accept (out of file descriptors and the like).
        frames_received: complete frames read (inbound and on pooled connections).
        frames_queued: frames handed to the inbox.
        oversize_frames: connections closed for announcing a frame over the limit.
        truncated_frames: connections that ended in the middle of a frame.
        frame_timeouts: connections closed because a frame body was too slow.
        idle_closed: connections closed for idleness.
        unclassified: frames dropped because `classify` raised.
        queue_full: frames dropped because their lane was full.
        frames_sent: frames written successfully.
        connect_failures: outbound connects that failed or timed out.
        send_failures: `send_frame` calls that raised `TransportError`.
        pool_connections: outbound connections open now.
        pool_evictions: pooled connections closed to make room or for idleness.
    """

    inbound_accepted: int
    inbound_refused_source: int
    inbound_refused_capacity: int
    inbound_evicted: int
    inbound_active: int
    accept_errors: int
    frames_received: int
    frames_queued: int
    oversize_frames: int
    truncated_frames: int
    frame_timeouts: int
    idle_closed: int
    unclassified: int
    queue_full: int
    frames_sent: int
    connect_failures: int
    send_failures: int
    pool_connections: int
    pool_evictions: int


@attrs.define
class _Counters:
    inbound_accepted: int = 0
    inbound_refused_source: int = 0
    inbound_refused_capacity: int = 0
    inbound_evicted: int = 0
    accept_errors: int = 0
    frames_received: int = 0
    frames_queued: int = 0
    oversize_frames: int = 0
    truncated_frames: int = 0
    frame_timeouts: int = 0
    idle_closed: int = 0
    unclassified: int = 0
    queue_full: int = 0
    frames_sent: int = 0
    connect_failures: int = 0
    send_failures: int = 0
    pool_evictions: int = 0


@attrs.define(eq=False)
class _Inbound:
    """One accepted connection: whether it proved to be a member's, and when it last spoke."""

    scope: trio.CancelScope
    last_active: float
    authenticated: bool = False

    def vouch(self) -> None:
        self.authenticated = True


@attrs.define(eq=False)
class _Outbound:
    """One pooled connection to a peer's listening address."""

    address: Address
    lock: trio.Lock = attrs.field(factory=trio.Lock)
    stream: trio.SocketStream | None = None
    last_used: float = 0.0


class TcpEndpoint:
    """A TCP listener plus an outbound connection pool, speaking length-prefixed frames.

    Run `serve()` in a nursery you own (`await nursery.start(endpoint.serve)`); it owns the
    per-connection tasks and closes every connection when cancelled. `send_frame` works
    only while `serve()` runs.

    Args:
        sock: a bound, not yet listening Trio TCP socket (ownership passes here).
        inbox: where accepted frames go (with `reliable=True`).
        policy: connections from outside it are closed before a byte is read.
        classify: payload -> lane, as for UDP.
        config: limits and timeouts.
        paths: per-peer counters shared with the UDP endpoint, or None.
    """

    def __init__(
        self,
        sock: trio.socket.SocketType,
        *,
        inbox: PriorityInbox,
        policy: AcceptPolicy,
        classify: Classifier = bulk_only,
        config: TcpConfig | None = None,
        paths: PathHealth | None = None,
    ) -> None:
        self._config = config if config is not None else TcpConfig()
        self._sock = sock
        self._inbox = inbox
        self._policy = policy
        self._classify = classify
        self._paths = paths
        self._c = _Counters()
        self._inbound: set[_Inbound] = set()
        self._pool: dict[Address, _Outbound] = {}
        self._nursery: trio.Nursery | None = None
        name = sock.getsockname()
        self.local_address: Address = (name[0], name[1])
        # Outbound connections leave from the bound address when it is a specific one, so
        # the peer's accept policy sees our overlay address, not whatever the route picks.
        self._source_host: str | None = None if name[0] in ("0.0.0.0", "::") else name[0]

    @classmethod
    def bind(
        cls,
        host: str,
        port: int,
        *,
        dual_stack: bool = False,
        inbox: PriorityInbox,
        policy: AcceptPolicy,
        classify: Classifier = bulk_only,
        config: TcpConfig | None = None,
        paths: PathHealth | None = None,
    ) -> TcpEndpoint:
        """Bind `host:port` (port 0 picks one) and wrap it.

        Raises:
            ValueError: `host` is not a numeric address.
            TransportError: the bind failed.
        """
        raw = make_socket(host, port, socket.SOCK_STREAM, dual_stack=dual_stack)
        sock = trio.socket.from_stdlib_socket(raw)
        return cls(sock, inbox=inbox, policy=policy, classify=classify, config=config, paths=paths)

    @property
    def config(self) -> TcpConfig:
        """The limits and timeouts in force."""
        return self._config

    ####################################################################################
    # Inbound
    ####################################################################################

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until cancelled; then close every connection.

        Reports started once listening, so `await nursery.start(endpoint.serve)` returns
        when connections can be made and `send_frame` can be used.
        """
        self._sock.listen(_LISTEN_BACKLOG)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._janitor)
                task_status.started()
                await self._accept_loop(nursery)
        finally:
            self._nursery = None
            for entry in list(self._pool.values()):
                self._discard(entry, evicted=False)
            self._sock.close()

    async def _accept_loop(self, nursery: trio.Nursery) -> None:
        c = self._c
        while True:
            try:
                conn, peer = await self._sock.accept()
            except trio.ClosedResourceError:
                return
            except OSError as exc:
                c.accept_errors += 1
                if exc.errno in _ACCEPT_RESOURCE_ERRNOS:
                    # Out of descriptors or memory: back off instead of spinning on accept.
                    await trio.sleep(0.1)
                continue
            source = normalize_source(peer)
            if not self._policy.allows(source[0]):
                c.inbound_refused_source += 1
                conn.close()
                continue
            full = len(self._inbound) >= self._config.max_inbound_connections
            if full and not self._evict_inbound():
                c.inbound_refused_capacity += 1
                conn.close()
                continue
            c.inbound_accepted += 1
            entry = _Inbound(trio.CancelScope(), trio.current_time())
            self._inbound.add(entry)
            nursery.start_soon(self._serve_inbound, trio.SocketStream(conn), source, entry)

    def _evict_inbound(self) -> bool:
        """Close the unauthenticated connection idle the longest; False if there is none."""
        candidates = [e for e in self._inbound if not e.authenticated]
        if not candidates:
            return False
        victim = min(candidates, key=lambda e: e.last_active)
        self._inbound.discard(victim)
        victim.scope.cancel()
        self._c.inbound_evicted += 1
        return True

    async def _serve_inbound(
        self, stream: trio.SocketStream, source: Address, entry: _Inbound
    ) -> None:
        try:
            with entry.scope:
                await self._read_frames(stream, source, self._config.idle_timeout, entry)
        finally:
            self._inbound.discard(entry)
            stream.socket.close()

    async def _read_frames(
        self,
        stream: trio.SocketStream,
        source: Address,
        idle_timeout: float,
        inbound: _Inbound | None = None,
    ) -> None:
        """Read frames from `stream` and deliver them, until EOF, error or a limit.

        The idle timer restarts on every data frame, and on a keepalive only when the
        connection is outbound (ours) or `inbound` was vouched for.
        """
        cfg = self._config
        c = self._c
        buf = bytearray()
        last_active = trio.current_time()
        while True:
            with trio.move_on_at(last_active + idle_timeout) as idle:
                ok = await _fill(stream, buf, _HEADER.size)
            if idle.cancelled_caught:
                c.idle_closed += 1
                return
            if not ok:
                if buf:
                    c.truncated_frames += 1
                return
            (length,) = _HEADER.unpack_from(buf)
            if length > cfg.max_frame_size:
                c.oversize_frames += 1
                return
            end = _HEADER.size + length
            with trio.move_on_after(cfg.frame_timeout) as slow:
                ok = await _fill(stream, buf, end)
            if slow.cancelled_caught:
                c.frame_timeouts += 1
                return
            if not ok:
                c.truncated_frames += 1
                return
            payload = bytes(buf[_HEADER.size : end])
            del buf[:end]
            if length == 0:  # keepalive
                if inbound is None or inbound.authenticated:
                    last_active = trio.current_time()
                continue
            last_active = trio.current_time()
            c.frames_received += 1
            if inbound is not None:
                inbound.last_active = last_active
            elif self._paths is not None:
                self._paths.record_tcp_received(source)  # it answered on our connection
            self._deliver(source, payload, None if inbound is None else inbound.vouch)

    def _deliver(self, source: Address, payload: bytes, vouch: Callable[[], None] | None) -> None:
        c = self._c
        outcome = classify_and_offer(
            self._inbox, self._classify, source, payload, reliable=True, vouch=vouch
        )
        if outcome == "queued":
            c.frames_queued += 1
        elif outcome == "queue_full":
            c.queue_full += 1
        else:
            c.unclassified += 1

    ####################################################################################
    # Outbound
    ####################################################################################

    async def send_frame(self, address: Address, payload: bytes) -> None:
        """Send one frame to the peer listening at `address`.

        Reuses a pooled connection or opens one. Frames to one peer are written in call
        order and never interleave.

        Raises:
            ValueError: `payload` exceeds `max_frame_size` (a caller bug).
            TransportError: connect failed or timed out, or the write failed or timed out;
                the message names the peer and the cause.
            RuntimeError: `serve()` is not running.
        """
        cfg = self._config
        if len(payload) > cfg.max_frame_size:
            raise ValueError(
                f"frame of {len(payload)} bytes exceeds max_frame_size {cfg.max_frame_size}"
            )
        if self._nursery is None:
            raise RuntimeError("TcpEndpoint.send_frame called while serve() is not running")
        frame = encode_frame(payload)
        entry = self._pool.get(address)
        if entry is None:
            if len(self._pool) >= cfg.pool_size and not self._evict_one():
                await self._send_one_shot(address, frame)
                return
            entry = _Outbound(address)
            self._pool[address] = entry
        try:
            async with entry.lock:
                await self._send_pooled(entry, frame)
        except TransportError:
            self._c.send_failures += 1
            if self._paths is not None:
                self._paths.record_tcp_failed(address)
            if entry.stream is None:
                self._forget(entry)  # a dead peer must not hold a pool slot
            raise
        self._c.frames_sent += 1
        if self._paths is not None:
            self._paths.record_tcp_sent(address)

    async def _send_pooled(self, entry: _Outbound, frame: bytes) -> None:
        reused = entry.stream is not None
        if not reused:
            await self._open(entry)
        try:
            await self._write(entry, frame)
        except TransportError:
            if not reused:
                raise
            # The pooled connection had died under us (peer restarted); one fresh try.
            await self._open(entry)
            await self._write(entry, frame)

    async def _open(self, entry: _Outbound) -> None:
        assert self._nursery is not None
        try:
            entry.stream = await self._connect(entry.address)
        except TransportError:
            self._forget(entry)
            raise
        if self._paths is not None:
            self._paths.record_tcp_connected(entry.address)
        if self._pool.get(entry.address) is not entry:
            self._pool[entry.address] = entry
        self._nursery.start_soon(self._watch_outbound, entry, entry.stream)

    async def _write(self, entry: _Outbound, frame: bytes) -> None:
        stream = entry.stream
        if stream is None:  # closed by the reader between open and write
            raise TransportError(
                f"tcp connection to {format_address(entry.address)} closed", entry.address
            )
        try:
            with trio.fail_after(self._config.send_timeout):
                await stream.send_all(frame)
        except trio.TooSlowError:
            self._discard(entry, evicted=False)
            raise TransportError(
                f"tcp send to {format_address(entry.address)} timed out after "
                f"{self._config.send_timeout:g} s",
                entry.address,
            ) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._discard(entry, evicted=False)
            raise TransportError(
                f"tcp send to {format_address(entry.address)} failed: {_reason(exc)}",
                entry.address,
            ) from exc
        entry.last_used = trio.current_time()

    async def _send_one_shot(self, address: Address, frame: bytes) -> None:
        """Pool full of busy connections: use a throwaway one rather than wait."""
        try:
            stream = await self._connect(address)
            if self._paths is not None:
                self._paths.record_tcp_connected(address)
            try:
                with trio.fail_after(self._config.send_timeout):
                    await stream.send_all(frame)
            except trio.TooSlowError:
                raise TransportError(
                    f"tcp send to {format_address(address)} timed out", address
                ) from None
            except (trio.BrokenResourceError, OSError) as exc:
                raise TransportError(
                    f"tcp send to {format_address(address)} failed: {_reason(exc)}", address
                ) from exc
            finally:
                await trio.aclose_forcefully(stream)
        except TransportError:
            self._c.send_failures += 1
            if self._paths is not None:
                self._paths.record_tcp_failed(address)
            raise
        self._c.frames_sent += 1
        if self._paths is not None:
            self._paths.record_tcp_sent(address)

    async def _connect(self, address: Address) -> trio.SocketStream:
        host, port = address
        timeout = self._config.connect_timeout
        local = self._source_host
        if local is not None and is_ipv6_host(local) != is_ipv6_host(host):
            local = None
        try:
            with trio.fail_after(timeout):
                return await trio.open_tcp_stream(host, port, local_address=local)
        except trio.TooSlowError:
            self._c.connect_failures += 1
            raise TransportError(
                f"tcp connect to {format_address(address)} timed out after {timeout:g} s",
                address,
            ) from None
        except OSError as exc:
            self._c.connect_failures += 1
            raise TransportError(
                f"tcp connect to {format_address(address)} failed: {_reason(exc)}", address
            ) from exc

    async def _watch_outbound(self, entry: _Outbound, stream: trio.SocketStream) -> None:
        """Read what the peer sends back on a pooled connection; drop it when it closes."""
        try:
            await self._read_frames(stream, entry.address, math.inf)
        finally:
            if entry.stream is stream:
                self._discard(entry, evicted=False)
            else:
                stream.socket.close()

    async def _janitor(self) -> None:
        """Close pooled connections idle longer than `idle_timeout`."""
        idle = self._config.idle_timeout
        while True:
            await trio.sleep(max(idle / 4, 0.05))
            cutoff = trio.current_time() - idle
            for entry in list(self._pool.values()):
                idle_now = entry.stream is not None and entry.last_used < cutoff
                if idle_now and not entry.lock.locked():
                    self._discard(entry, evicted=True)

    def _evict_one(self) -> bool:
        """Close the least recently used idle pooled connection; False if all are busy."""
        candidates = [e for e in self._pool.values() if not e.lock.locked()]
        if not candidates:
            return False
        victim = min(candidates, key=lambda e: e.last_used)
        self._discard(victim, evicted=True)
        return True

    def _discard(self, entry: _Outbound, *, evicted: bool) -> None:
        stream, entry.stream = entry.stream, None
        if stream is not None:
            stream.socket.close()
            if evicted:
                self._c.pool_evictions += 1
        self._forget(entry)

    def _forget(self, entry: _Outbound) -> None:
        if self._pool.get(entry.address) is entry and not entry.lock.locked():
            del self._pool[entry.address]

    ####################################################################################
    # Introspection
    ####################################################################################

    def close(self) -> None:
        """Close the listening socket (a running `serve()` stops accepting)."""
        self._sock.close()

    def statistics(self) -> TcpStatistics:
        """A snapshot of the counters."""
        return TcpStatistics(
            inbound_active=len(self._inbound),
            pool_connections=sum(1 for e in self._pool.values() if e.stream is not None),
            **attrs.asdict(self._c),
        )


async def _fill(stream: trio.SocketStream, buf: bytearray, size: int) -> bool:
    """Read from `stream` until `buf` holds `size` bytes; False on EOF or a broken stream."""
    while len(buf) < size:
        try:
            data = await stream.receive_some(_RECEIVE_CHUNK)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return False
        if not data:
            return False
        buf += data
    return True


def _reason(exc: BaseException) -> str:
    """The most useful one-line cause of a socket failure."""
    cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return str(cause) or type(cause).__name__
