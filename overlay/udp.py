"""The UDP half of the transport: one socket, one reader task, drop-and-count on overload.

Protocol packets (pings, acks, gossip) travel here. The reader is a single task: it
waits until the socket is readable (`trio.lowlevel.wait_readable`), then drains up to
`_RECEIVE_BATCH` datagrams with plain non-blocking `recvfrom` calls before it yields
again. Per datagram it does a size check, the accept-policy lookup, the caller's
`classify`, and a non-blocking `offer` into the `PriorityInbox`. No task, thread or
checkpoint per packet, and it never waits on the consumer: if the daemon falls behind,
packets are dropped here and counted. Draining in batches matters under a storm: the
faster the kernel buffer is emptied, the fewer packets (urgent ones included) the
kernel drops blindly before `classify` ever sees them; a large `SO_RCVBUF` is
requested for the same reason.

Every refusal has its own counter so `status` can say why packets were lost.
"""

from __future__ import annotations

import contextlib
import socket

import attrs
import trio

from overlay.base import (
    Address,
    TransportError,
    check_destination,
    destination_for,
    format_address,
    make_socket,
    normalize_source,
)
from overlay.inbox import Classifier, PriorityInbox, bulk_only, classify_and_offer
from overlay.netfilter import AcceptPolicy
from overlay.peerpaths import PathHealth

#: Largest datagram accepted or sent by default: the swim core's ~1400-byte packets plus
#: the authentication envelope, with room to spare; fragmentation beyond the path MTU is
#: the kernel's business.
DEFAULT_MAX_DATAGRAM_SIZE = 2048

#: Receive buffer requested for the UDP socket, bytes. The kernel caps it at
#: net.core.rmem_max (often 208 KiB); raise that sysctl for big meshes.
DEFAULT_RECEIVE_BUFFER = 4 << 20
#: Datagrams drained per wake-up before the reader yields to other tasks.
_RECEIVE_BATCH = 64

__all__ = [
    "DEFAULT_MAX_DATAGRAM_SIZE",
    "DEFAULT_RECEIVE_BUFFER",
    "Classifier",
    "UdpEndpoint",
    "UdpStatistics",
    "bulk_only",
]


@attrs.frozen
class UdpStatistics:
    """Counters of a `UdpEndpoint`.

    Attributes:
        received: datagrams read from the socket, whatever became of them.
        queued: datagrams handed to the inbox.
        oversize: dropped for exceeding `max_datagram_size`.
        refused_source: dropped because the source is outside the accept policy.
        unclassified: dropped because `classify` raised.
        queue_full: dropped because their lane of the inbox was full.
        receive_errors: socket errors while reading (ICMP errors and the like).
        sent: datagrams sent.
        send_errors: sends that failed (and raised `TransportError`).
    """

    received: int
    queued: int
    oversize: int
    refused_source: int
    unclassified: int
    queue_full: int
    receive_errors: int
    sent: int
    send_errors: int


@attrs.define
class _Counters:
    received: int = 0
    queued: int = 0
    oversize: int = 0
    refused_source: int = 0
    unclassified: int = 0
    queue_full: int = 0
    receive_errors: int = 0
    sent: int = 0
    send_errors: int = 0


class UdpEndpoint:
    """A bound UDP socket with a reader loop feeding a `PriorityInbox`.

    Create with `UdpEndpoint.bind(...)` (or from a non-blocking socket you bound), run
    `serve()` in a nursery you own, send with `send()`. Cancelling `serve()` stops
    reading; `close()` releases the socket.

    Args:
        sock: a bound, non-blocking stdlib UDP socket (ownership passes to the endpoint).
        inbox: where accepted datagrams go.
        policy: sources outside it are dropped before anything else.
        classify: payload -> lane; see `Classifier`.
        max_datagram_size: larger datagrams are dropped on receipt and refused on send.
        paths: per-peer counters shared with the TCP endpoint, or None.
        receive_buffer: SO_RCVBUF to request (best effort), or 0 to leave the default.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        inbox: PriorityInbox,
        policy: AcceptPolicy,
        classify: Classifier = bulk_only,
        max_datagram_size: int = DEFAULT_MAX_DATAGRAM_SIZE,
        paths: PathHealth | None = None,
        receive_buffer: int = DEFAULT_RECEIVE_BUFFER,
    ) -> None:
        if max_datagram_size < 1 or max_datagram_size > 65507:
            raise ValueError(f"max_datagram_size must be in 1..65507, got {max_datagram_size}")
        sock.setblocking(False)
        if receive_buffer > 0:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self._sock = sock
        self._family = sock.family
        self._inbox = inbox
        self._policy = policy
        self._classify = classify
        self._max = max_datagram_size
        self._paths = paths
        self._c = _Counters()
        self._closed = False
        name = sock.getsockname()
        self.local_address: Address = (name[0], name[1])

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
        max_datagram_size: int = DEFAULT_MAX_DATAGRAM_SIZE,
        paths: PathHealth | None = None,
        receive_buffer: int = DEFAULT_RECEIVE_BUFFER,
    ) -> UdpEndpoint:
        """Bind `host:port` (port 0 picks one) and wrap it.

        Raises:
            ValueError: `host` is not a numeric address.
            TransportError: the bind failed.
        """
        sock = make_socket(host, port, socket.SOCK_DGRAM, dual_stack=dual_stack)
        return cls(
            sock,
            inbox=inbox,
            policy=policy,
            classify=classify,
            max_datagram_size=max_datagram_size,
            paths=paths,
            receive_buffer=receive_buffer,
        )

    @property
    def max_datagram_size(self) -> int:
        """The size limit for one datagram, in bytes."""
        return self._max

    @property
    def receive_buffer(self) -> int:
        """The SO_RCVBUF the kernel actually granted (Linux reports double the request)."""
        return int(self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))

    async def serve(self) -> None:
        """Read datagrams until cancelled or `close()`d.

        Per wake-up, drain up to `_RECEIVE_BATCH` datagrams; per datagram: size check,
        accept policy, classify, offer.
        """
        sock = self._sock
        bufsize = self._max + 1  # one byte more, so an oversize datagram is noticed
        c = self._c
        handle = self._handle
        while True:
            try:
                await trio.lowlevel.wait_readable(sock)
            except trio.ClosedResourceError:
                return
            for _ in range(_RECEIVE_BATCH):
                try:
                    data, sockaddr = sock.recvfrom(bufsize)
                except BlockingIOError:
                    break
                except OSError:
                    if self._closed:
                        return
                    # Linux reports ICMP errors (port unreachable after an earlier send)
                    # on the next receive of an unconnected socket; they say nothing
                    # about this read, so count and go on.
                    c.receive_errors += 1
                    continue
                c.received += 1
                handle(data, sockaddr)

    def _handle(self, data: bytes, sockaddr: object) -> None:
        c = self._c
        if len(data) > self._max:
            c.oversize += 1
            return
        source = normalize_source(sockaddr)
        if not self._policy.allows(source[0]):
            c.refused_source += 1
            return
        if self._paths is not None:
            self._paths.record_udp_received(source)
        outcome = classify_and_offer(self._inbox, self._classify, source, data, reliable=False)
        if outcome == "queued":
            c.queued += 1
        elif outcome == "queue_full":
            c.queue_full += 1
        else:
            c.unclassified += 1

    async def send(self, address: Address, payload: bytes, *, expects_answer: bool = True) -> None:
        """Send one datagram to `address` (a numeric host and a port). `expects_answer`
        says whether the peer should answer it (for `PathHealth`'s evidence).

        Raises:
            ValueError: `payload` is larger than `max_datagram_size` (a caller bug: the
                core keeps its packets small, bigger things go over TCP).
            TransportError: not a numeric address, or the socket refused it (no route,
                filtered, wrong family, closed).
        """
        if len(payload) > self._max:
            raise ValueError(
                f"datagram of {len(payload)} bytes exceeds max_datagram_size {self._max}"
            )
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            check_destination(address[0])
            dest = destination_for(self._family, address)
            while True:
                if self._closed:
                    raise TransportError("udp socket is closed", address)
                try:
                    self._sock.sendto(payload, dest)
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self._sock)
        except TransportError:
            self._c.send_errors += 1
            raise
        except (OSError, trio.ClosedResourceError) as exc:
            self._c.send_errors += 1
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise TransportError(
                f"udp send to {format_address(address)} failed: {reason}", address
            ) from exc
        self._c.sent += 1
        if self._paths is not None:
            self._paths.record_udp_sent(
                address, trio.current_time(), expects_answer=expects_answer
            )
        await trio.lowlevel.cancel_shielded_checkpoint()

    def close(self) -> None:
        """Release the socket; a running `serve()` returns. Idempotent."""
        if self._closed:
            return
        self._closed = True
        trio.lowlevel.notify_closing(self._sock)
        self._sock.close()

    def statistics(self) -> UdpStatistics:
        """A snapshot of the counters."""
        return UdpStatistics(**attrs.asdict(self._c))
