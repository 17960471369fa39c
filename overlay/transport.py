"""One port, two protocols: the node's `Transport` (UDP datagrams + TCP frames).

This is the component the daemon wires to the swim core. It binds UDP and TCP on the same
host and port (`DEFAULT_PORT` unless told otherwise), feeds both into one two-lane
`PriorityInbox`, and shares one `AcceptPolicy` and one `PathHealth` between them.

Usage, in a nursery the daemon owns::

    transport = Transport("10.77.0.1", DEFAULT_PORT, policy=policy, classify=lane_of)
    local = await nursery.start(transport.run)      # bound; raises TransportError if not
    async for packet in transport.inbox:            # urgent lane first
        ...
    await transport.send_datagram(address, payload) # TransportError on failure
    await transport.send_frame(address, payload)    # idem, over a pooled TCP connection

Cancelling the nursery closes both sockets, every TCP connection and the inbox.
"""

from __future__ import annotations

import attrs
import trio

from overlay.base import (
    DEFAULT_PORT,
    Address,
    TransportError,
    format_address,
    is_address_in_use,
)
from overlay.inbox import BULK, URGENT, InboxStatistics, Incoming, LaneLimit, PriorityInbox
from overlay.netfilter import AcceptPolicy
from overlay.peerpaths import PathHealth
from overlay.tcp import TcpConfig, TcpEndpoint, TcpStatistics
from overlay.udp import DEFAULT_MAX_DATAGRAM_SIZE, Classifier, UdpEndpoint, UdpStatistics, bulk_only

__all__ = [
    "BULK",
    "DEFAULT_PORT",
    "URGENT",
    "Transport",
    "TransportConfig",
    "TransportError",
    "TransportStatistics",
]

# With port 0 the UDP socket picks a free port and TCP must get the same one; another
# process may hold it for TCP, so try a few fresh ports before giving up.
_EPHEMERAL_BIND_ATTEMPTS = 20


@attrs.frozen
class TransportConfig:
    """Bounds of a `Transport`; every queue and frame has one.

    Attributes:
        max_datagram_size: largest UDP payload, both directions, in bytes.
        urgent_queue_items: packets the urgent lane holds before dropping. Generous:
            membership messages are small and must survive a bulk storm.
        urgent_newest_first_after: seconds the oldest urgent packet may wait before the
            lane serves the newest first (`LaneLimit.newest_first_after`); None keeps it
            FIFO. 0.2 s is far beyond a packet's wait in a daemon that keeps up (under a
            millisecond) and below the LAN preset's probe timeout (0.5 s), so a starved
            daemon acks the probes still waiting for an answer.
        bulk_queue_items: packets the bulk lane holds before dropping.
        queue_bytes: payload bytes each lane holds before dropping; bounds memory when
            large TCP frames pile up.
        tcp: the TCP endpoint's limits and timeouts.
    """

    max_datagram_size: int = DEFAULT_MAX_DATAGRAM_SIZE
    urgent_queue_items: int = 1024
    urgent_newest_first_after: float | None = 0.2
    bulk_queue_items: int = 256
    queue_bytes: int = 4 << 20
    tcp: TcpConfig = attrs.field(factory=TcpConfig)

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.max_datagram_size <= 65507:
            raise ValueError(f"max_datagram_size must be in 1..65507, got {self.max_datagram_size}")
        if self.urgent_queue_items < 1 or self.bulk_queue_items < 1 or self.queue_bytes < 1:
            raise ValueError("queue limits must be positive")
        if self.queue_bytes < self.tcp.max_frame_size:
            raise ValueError(
                f"queue_bytes ({self.queue_bytes}) must hold at least one frame of "
                f"max_frame_size ({self.tcp.max_frame_size})"
            )

    def lanes(self) -> tuple[LaneLimit, LaneLimit]:
        """The inbox lane limits: (urgent, bulk)."""
        return (
            LaneLimit(self.urgent_queue_items, self.queue_bytes, self.urgent_newest_first_after),
            LaneLimit(self.bulk_queue_items, self.queue_bytes),
        )


@attrs.frozen
class TransportStatistics:
    """Everything the transport counts, for `status` and metrics.

    Attributes:
        local_address: the bound (host, port).
        udp: datagram counters, with drop reasons.
        tcp: frame and connection counters, with drop reasons.
        inbox: per-lane queue depth, drops and deliveries (index 0 = urgent).
        udp_blocked_peers: peers for which UDP seems blocked while TCP works.
    """

    local_address: Address
    udp: UdpStatistics
    tcp: TcpStatistics
    inbox: InboxStatistics
    udp_blocked_peers: tuple[Address, ...]


class Transport:
    """UDP and TCP on one host and port, one priority inbox, one accept policy.

    Args:
        host: numeric address to bind (an overlay address, `0.0.0.0` or `::`).
        port: port for both protocols; 0 picks a free one (tests).
        policy: sources accepted; everything else is dropped before decoding.
        classify: payload -> lane (`URGENT` or `BULK`); runs on unauthenticated bytes.
        config: size and queue bounds.
        dual_stack: with host `::`, also accept IPv4 (IPv4-mapped sources are unmapped).
        paths: per-peer UDP/TCP health; a fresh one if None.
    """

    def __init__(
        self,
        host: str,
        port: int = DEFAULT_PORT,
        *,
        policy: AcceptPolicy,
        classify: Classifier = bulk_only,
        config: TransportConfig | None = None,
        dual_stack: bool = False,
        paths: PathHealth | None = None,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        self._host = host
        self._port = port
        self._policy = policy
        self._classify = classify
        self._config = config if config is not None else TransportConfig()
        self._dual_stack = dual_stack
        self.paths = paths if paths is not None else PathHealth()
        self.inbox = PriorityInbox(self._config.lanes())
        self._udp: UdpEndpoint | None = None
        self._tcp: TcpEndpoint | None = None
        self._running = False

    @property
    def config(self) -> TransportConfig:
        """The bounds in force."""
        return self._config

    @property
    def policy(self) -> AcceptPolicy:
        """The accept policy in force."""
        return self._policy

    @property
    def local_address(self) -> Address:
        """The bound (host, port).

        Raises:
            RuntimeError: `run()` has not bound yet.
        """
        if self._udp is None:
            raise RuntimeError("transport is not bound; start run() first")
        return self._udp.local_address

    def _bind(self) -> tuple[UdpEndpoint, TcpEndpoint]:
        attempts = _EPHEMERAL_BIND_ATTEMPTS if self._port == 0 else 1
        for attempt in range(attempts):
            udp = UdpEndpoint.bind(
                self._host,
                self._port,
                dual_stack=self._dual_stack,
                inbox=self.inbox,
                policy=self._policy,
                classify=self._classify,
                max_datagram_size=self._config.max_datagram_size,
                paths=self.paths,
            )
            try:
                tcp = TcpEndpoint.bind(
                    self._host,
                    udp.local_address[1],
                    dual_stack=self._dual_stack,
                    inbox=self.inbox,
                    policy=self._policy,
                    classify=self._classify,
                    config=self._config.tcp,
                    paths=self.paths,
                )
            except TransportError as exc:
                udp.close()
                if attempt + 1 < attempts and is_address_in_use(exc):
                    continue
                raise
            return udp, tcp
        raise AssertionError("unreachable")  # pragma: no cover

    async def run(
        self, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Bind both sockets, report the bound address, serve until cancelled.

        Use as `local = await nursery.start(transport.run)`.

        Raises:
            TransportError: binding failed (reported by `nursery.start`).
            ValueError: the host is not a numeric address.
            RuntimeError: already run once (the inbox is closed when a run ends).
        """
        if self._running or self._udp is not None:
            raise RuntimeError("a Transport runs once; make a new one to run again")
        self._running = True
        try:
            udp, tcp = self._bind()
            self._udp, self._tcp = udp, tcp
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(tcp.serve)
                    nursery.start_soon(udp.serve)
                    task_status.started(udp.local_address)
            finally:
                udp.close()
                tcp.close()
        finally:
            self.inbox.close()
            self._running = False

    async def send_datagram(
        self, address: Address, payload: bytes, *, expects_answer: bool = True
    ) -> None:
        """Send one UDP datagram from the bound port. `expects_answer`: whether the peer
        should answer it (a probe), the evidence `paths` counts as unanswered.

        Raises:
            ValueError: payload over `max_datagram_size`.
            TransportError: the send failed.
            RuntimeError: not running.
        """
        if self._udp is None or not self._running:
            raise RuntimeError("transport is not running")
        await self._udp.send(address, payload, expects_answer=expects_answer)

    async def send_frame(self, address: Address, payload: bytes) -> None:
        """Send one length-prefixed frame over TCP to the peer listening at `address`.

        Raises:
            ValueError: payload over `max_frame_size`.
            TransportError: connect or write failed or timed out.
            RuntimeError: not running.
        """
        if self._tcp is None or not self._running:
            raise RuntimeError("transport is not running")
        await self._tcp.send_frame(address, payload)

    async def receive(self) -> Incoming:
        """The next packet or frame, urgent lane first.

        Raises:
            trio.EndOfChannel: the transport stopped and the inbox is drained.
        """
        return await self.inbox.receive()

    async def receive_batch(self, max_items: int = 64) -> list[Incoming]:
        """Wait for one packet, then take up to `max_items` waiting ones, urgent first.

        The efficient way to drain under load (see `PriorityInbox.receive_batch`).

        Raises:
            trio.EndOfChannel: the transport stopped and the inbox is drained.
        """
        return await self.inbox.receive_batch(max_items)

    def receive_nowait(self) -> Incoming:
        """Like `receive` but raises `trio.WouldBlock` when nothing is waiting."""
        return self.inbox.receive_nowait()

    def statistics(self) -> TransportStatistics:
        """A snapshot of every counter.

        Raises:
            RuntimeError: `run()` has not bound yet.
        """
        if self._udp is None or self._tcp is None:
            raise RuntimeError("transport is not bound; start run() first")
        return TransportStatistics(
            local_address=self._udp.local_address,
            udp=self._udp.statistics(),
            tcp=self._tcp.statistics(),
            inbox=self.inbox.statistics(),
            udp_blocked_peers=tuple(self.paths.blocked_peers()),
        )

    def describe(self) -> str:
        """One line for the log: where it listens and what it accepts."""
        where = format_address(self.local_address) if self._udp else f"{self._host}:{self._port}"
        return f"listening on udp+tcp {where}, {self._policy.describe()}"
