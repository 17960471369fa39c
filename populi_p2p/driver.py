"""The Trio driver of the sans-IO swim core: it moves bytes and time, nothing else.

The core (`swim.Membership`) decides everything about membership; this module only
translates between it and the world, as h11's users do:

* wait for a packet with ``trio.move_on_at(core.next_deadline())``;
* a packet arrived: open it (authentication, via the injected `PacketCodec`) and hand
  the payload to ``core.receive``; junk is dropped and counted by the codec;
* the deadline passed: ``core.tick(now)``;
* apply every output: a `Send` goes out over UDP, or over TCP when ``reliable``; an
  event is queued for the node's ``on_event`` callback; a send that fails is reported
  back with ``core.send_failed`` so the core can fall back (and never retried here).

Why events go through a queue and their own task: the node's bookkeeping per event
(verifying the member's signed record and certificate, logging, the store) costs far
more than the core's own work, and one push-pull can bring a hundred members at once,
so a node joining a big mesh would otherwise answer no ping until it had verified them
all. Measured on a starved machine (100 daemons on 2 busy cores) that took a joiner
1.5 s, long enough for the members probing it to suspect it. With the queue the
receive loop answers pings between any two events.

Why TCP sends go through a small pool of sender tasks and a bounded queue: a TCP
connect to a dead peer may take seconds, and the receive loop must never wait on it or
every other member's acks would time out behind it. UDP ``sendto`` does not block on a
peer, so datagrams are sent inline. When the TCP queue is full the send is reported as
failed at once (counted): memory stays bounded whatever the core asks for. No task or
thread is spawned per packet.

`now` handed to the core is ``trio.current_time()`` (monotonic, so tests can use Trio's
mock clocks); realtime (for packet timestamps and records) is the codec's business.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final, Protocol

import attrs
import trio

from overlay.base import Address, TransportError
from swim import Event, Send
from swim.wire import asks_for_an_answer

from ._log import event, get_logger

if TYPE_CHECKING:
    from overlay.inbox import Incoming
    from swim import Membership, Output

    from ._trace import PacketTrace

__all__ = ["Driver", "DriverStatistics", "PacketCodec", "PacketTransport"]

#: TCP sends waiting for a sender task; beyond this they fail at once.
RELIABLE_QUEUE_MAX: Final = 256
#: Concurrent TCP sends (connects to dead peers may each take `connect_timeout`).
RELIABLE_SENDERS: Final = 4
#: Packets handled per wake-up before the deadline is checked again, so a flood cannot
#: starve the core's timers.
RECEIVE_BATCH_MAX: Final = 64
#: Membership events waiting for the node's callback; beyond this the driver waits for
#: it (events are never dropped). A push-pull of a 4,096-member view fits.
EVENT_QUEUE_MAX: Final = 4096

_log = get_logger("driver")


class PacketTransport(Protocol):
    """What the driver needs from `overlay.transport.Transport` (a fake in tests)."""

    async def receive(self) -> Incoming: ...

    def receive_nowait(self) -> Incoming: ...

    async def send_datagram(
        self, address: Address, payload: bytes, *, expects_answer: bool = True
    ) -> None: ...

    async def send_frame(self, address: Address, payload: bytes) -> None: ...


class PacketCodec(Protocol):
    """Wraps core payloads for the wire and unwraps what arrives (authentication).

    `open` returns None for a packet that must be dropped; it counts the drop itself.
    `last_sender` is the node id whose packet `open` accepted last (None when the codec
    does not authenticate): the core answers a pull only to that member (`swim._pull`).
    """

    last_sender: str | None

    def seal(self, destination: Address, payload: bytes, reliable: bool) -> bytes: ...

    def open(self, incoming: Incoming) -> bytes | None: ...


@attrs.frozen
class DriverStatistics:
    """What the driver itself counted (the core, codec and transport count the rest)."""

    packets_in: int
    packets_dropped: int
    datagrams_out: int
    frames_out: int
    send_failures: int
    reliable_queue_full: int
    oversize_datagrams: int


@attrs.define
class _Counters:
    packets_in: int = 0
    packets_dropped: int = 0
    datagrams_out: int = 0
    frames_out: int = 0
    send_failures: int = 0
    reliable_queue_full: int = 0
    oversize_datagrams: int = 0


class Driver:
    """Runs one `swim.Membership` over one transport until cancelled.

    All calls into the core go through this object (in the Trio thread), so their
    outputs are always applied. Read-only queries (``core.members()``) may be made on
    `core` directly.

    Args:
        core: the membership state machine.
        transport: UDP+TCP; see `PacketTransport`.
        codec: authentication; see `PacketCodec`.
        on_event: called with every membership event, in order, from the driver's own
            event task (so a long run of events never holds up the receive loop). When
            it returns an awaitable (an async fan-out), that is awaited before the next.
        max_datagram_size: sealed payloads above this go over TCP instead of UDP.
        trace: where to trace every packet and event (`populi_p2p._trace`), or None.
    """

    def __init__(
        self,
        core: Membership,
        transport: PacketTransport,
        codec: PacketCodec,
        on_event: Callable[[Event], Awaitable[None] | None],
        *,
        max_datagram_size: int,
        trace: PacketTrace | None = None,
    ) -> None:
        self.core = core
        self._trace = trace
        self._transport = transport
        self._codec = codec
        self._on_event = on_event
        self._max_datagram = max_datagram_size
        self._c = _Counters()
        send, receive = trio.open_memory_channel[tuple[Address, bytes, bytes]](RELIABLE_QUEUE_MAX)
        self._reliable_send = send
        self._reliable_receive = receive
        events_in, events_out = trio.open_memory_channel[Event](EVENT_QUEUE_MAX)
        self._events_in = events_in
        self._events_out = events_out
        self._wait_scope: trio.CancelScope | None = None
        # Set after the next call into the core; made only while somebody waits on it.
        self._stepped: trio.Event | None = None

    ####################################################################################
    # Running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled: receive, tick, apply outputs."""
        async with trio.open_nursery() as nursery:
            for _ in range(RELIABLE_SENDERS):
                nursery.start_soon(self._reliable_sender)
            nursery.start_soon(self._deliver_events)
            task_status.started()
            await self._loop()

    async def _loop(self) -> None:
        core = self.core
        while True:
            deadline = core.next_deadline()
            incoming: Incoming | None = None
            with trio.move_on_at(math.inf if deadline is None else deadline) as scope:
                self._wait_scope = scope
                incoming = await self._transport.receive()
            self._wait_scope = None
            if incoming is not None:
                await self._handle(incoming)
                # Drain what is already queued, bounded, before checking timers again.
                await self._drain(RECEIVE_BATCH_MAX - 1)
            now = trio.current_time()
            deadline = core.next_deadline()
            if deadline is not None and deadline <= now:
                if incoming is None:
                    # A timer is due: first hand the core what already arrived. On a
                    # starved node the ack that answers a probe is often waiting in
                    # the inbox or the socket; timing the probe out first would accuse
                    # a member for our own lateness. Two checkpoints let the transport's
                    # reader tasks move ready datagrams into the inbox.
                    await trio.lowlevel.checkpoint()
                    await trio.lowlevel.checkpoint()
                    await self._drain()
                    now = trio.current_time()
                await self.apply(core.tick(now))
            self._step_done()

    async def _drain(self, limit: int = RECEIVE_BATCH_MAX) -> None:
        """Handle up to `limit` packets already queued, without waiting for more."""
        for _ in range(limit):
            try:
                incoming = self._transport.receive_nowait()
            except trio.WouldBlock:
                break
            await self._handle(incoming)

    def wake(self) -> None:
        """Make the loop re-read `next_deadline` (after a call that may have moved it).

        Cancels the current wait (a cancelled receive loses no packet); no task is
        spawned for it.
        """
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    async def _handle(self, incoming: Incoming) -> None:
        self._c.packets_in += 1
        payload = self._codec.open(incoming)
        if payload is None:
            self._c.packets_dropped += 1
            return
        trace = self._trace
        if trace is not None:
            waited = time.monotonic() - incoming.received_at if incoming.received_at else 0.0
            trace.packet_in(incoming.source, incoming.reliable, waited, payload)
        now = trio.current_time()
        await self.apply(
            self.core.receive(
                incoming.source,
                payload,
                now,
                reliable=incoming.reliable,
                sender=self._codec.last_sender,
            )
        )

    def _step_done(self) -> None:
        stepped = self._stepped
        if stepped is not None:
            self._stepped = None
            stepped.set()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Return once `condition()` holds, checked after every call into the core.

        For conditions on the core's state (``lambda: core.leave_announced``): the core
        changes only when the driver calls it, so nothing is polled. Bound the wait
        with a cancel scope.
        """
        while not condition():
            if self._stepped is None:
                self._stepped = trio.Event()
            await self._stepped.wait()

    ####################################################################################
    # Calls into the core from the node

    async def call(self, method: Callable[[float], Sequence[Output]]) -> None:
        """Run ``method(now)`` (a bound core method such as ``core.leave``), apply its outputs.

        Example: ``await driver.call(lambda now: core.set_meta(meta, now))``.
        """
        await self.apply(method(trio.current_time()))
        self._step_done()
        self.wake()

    ####################################################################################
    # Outputs

    async def apply(self, outputs: Sequence[Output]) -> None:
        """Send every `Send` and queue every event, in the order the core gave them."""
        for output in outputs:
            if isinstance(output, Send):
                await self._send(output.destination, output.payload, output.reliable)
            else:
                if self._trace is not None:
                    self._trace.event("ev", output)
                try:
                    self._events_in.send_nowait(output)
                except trio.WouldBlock:
                    await self._events_in.send(output)

    async def _deliver_events(self) -> None:
        # Each receive is a checkpoint: the receive loop runs between any two events.
        async for ev in self._events_out:
            if self._trace is not None:
                self._trace.event("evd", ev)
            result = self._on_event(ev)
            if result is not None:
                await result

    async def _send(self, destination: Address, payload: bytes, reliable: bool) -> None:
        if self._trace is not None:
            self._trace.packet_out(destination, reliable, payload)
        sealed = self._codec.seal(destination, payload, reliable)
        if not reliable and len(sealed) > self._max_datagram:
            # Too big for one datagram (a large record): the core sized it for its budget,
            # so this is rare; TCP carries it instead of the kernel fragmenting or refusing.
            self._c.oversize_datagrams += 1
            reliable = True
        if reliable:
            try:
                self._reliable_send.send_nowait((destination, payload, sealed))
            except trio.WouldBlock:
                self._c.reliable_queue_full += 1
                await self._failed(destination, payload)
            return
        try:
            # Only probes count towards "UDP seems blocked" (`overlay.peerpaths`).
            await self._transport.send_datagram(
                destination, sealed, expects_answer=asks_for_an_answer(payload)
            )
        except TransportError as exc:
            event(_log, 10, "send.failed", to=_fmt(destination), proto="udp", reason=str(exc))
            await self._failed(destination, payload)
            return
        self._c.datagrams_out += 1

    async def _reliable_sender(self) -> None:
        async for destination, payload, sealed in self._reliable_receive:
            try:
                await self._transport.send_frame(destination, sealed)
            except TransportError as exc:
                event(_log, 10, "send.failed", to=_fmt(destination), proto="tcp", reason=str(exc))
                await self._failed(destination, payload)
                continue
            self._c.frames_out += 1

    async def _failed(self, destination: Address, payload: bytes) -> None:
        self._c.send_failures += 1
        now = trio.current_time()
        await self.apply(self.core.send_failed(destination, payload, now))
        self._step_done()
        self.wake()

    def statistics(self) -> DriverStatistics:
        """A snapshot of the driver's counters."""
        return DriverStatistics(**attrs.asdict(self._c))


def _fmt(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
