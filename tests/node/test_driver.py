"""The driver only translates: packets in -> core.receive, deadlines -> core.tick, Sends
out over UDP or TCP, failures -> core.send_failed. Run under Trio's mock clock."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from overlay.base import TransportError
from overlay.inbox import URGENT, Incoming
from populi_p2p.driver import RELIABLE_QUEUE_MAX, Driver
from swim import Member, MemberJoined, MemberState, Send

PEER = ("127.0.0.1", 9)
DEAD_PEER = ("127.0.0.1", 10)


class FakeTransport:
    def __init__(self) -> None:
        self.send_in, self.receive_out = trio.open_memory_channel[Incoming](100)
        self.datagrams: list[tuple[tuple[str, int], bytes]] = []
        self.expects_answer: list[bool] = []
        self.frames: list[tuple[tuple[str, int], bytes]] = []

    async def receive(self) -> Incoming:
        return await self.receive_out.receive()

    def receive_nowait(self) -> Incoming:
        return self.receive_out.receive_nowait()

    async def send_datagram(
        self, address: tuple[str, int], payload: bytes, *, expects_answer: bool = True
    ) -> None:
        if address == DEAD_PEER:
            raise TransportError("unreachable", address)
        self.datagrams.append((address, payload))
        self.expects_answer.append(expects_answer)

    async def send_frame(self, address: tuple[str, int], payload: bytes) -> None:
        await trio.sleep(1.0)  # a slow connect must not hold up the receive loop
        if address == DEAD_PEER:
            raise TransportError("refused", address)
        self.frames.append((address, payload))


class FakeCodec:
    """Opens "S" + payload; "bad..." is refused. The sender is the byte after "S"."""

    last_sender: str | None = None

    def seal(self, destination: tuple[str, int], payload: bytes, reliable: bool) -> bytes:
        return b"S" + payload

    def open(self, incoming: Incoming) -> bytes | None:
        if incoming.payload.startswith(b"bad"):
            self.last_sender = None
            return None
        self.last_sender = f"node-{incoming.payload[1:2].decode()}"
        return incoming.payload[1:]


class FakeCore:
    """Records calls; answers each packet with a UDP reply and a TCP send."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.senders: list[str | None] = []
        self.deadline: float | None = 5.0

    def next_deadline(self) -> float | None:
        return self.deadline

    def tick(self, now: float) -> list[Any]:
        self.calls.append(("tick", now))
        self.deadline = None
        member = Member("m", PEER, MemberState.ALIVE, 1)
        return [MemberJoined(member), Send(DEAD_PEER, b"probe")]

    def receive(
        self, source: Any, payload: bytes, now: float, *, reliable: bool, sender: str | None = None
    ) -> list[Any]:
        self.calls.append(("receive", source, payload, reliable))
        self.senders.append(sender)
        return [Send(PEER, b"ack"), Send(DEAD_PEER, b"state", reliable=True)]

    def send_failed(self, destination: Any, payload: bytes, now: float) -> list[Any]:
        self.calls.append(("failed", destination, payload))
        return []


async def test_driver_translates(autojump_clock: trio.testing.MockClock) -> None:
    core, transport = FakeCore(), FakeTransport()
    events: list[object] = []
    driver = Driver(core, transport, FakeCodec(), events.append, max_datagram_size=1400)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await transport.send_in.send(Incoming(PEER, b"Shello", False, URGENT))
        await transport.send_in.send(Incoming(PEER, b"bad packet", False, URGENT))
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    assert ("receive", PEER, b"hello", False) in core.calls  # opened, then handed over
    assert core.senders == ["node-h"]  # with who signed it (`swim._pull` needs it)
    assert not any(c[0] == "receive" and c[2].startswith(b"ad") for c in core.calls)
    assert transport.datagrams == [(PEER, b"Sack")]  # sealed, over UDP
    # The failed UDP probe and the failed TCP send are both reported back.
    assert ("failed", DEAD_PEER, b"probe") in core.calls
    assert ("failed", DEAD_PEER, b"state") in core.calls
    # The deadline fired exactly once, at 5.0 (virtual time).
    ticks = [c for c in core.calls if c[0] == "tick"]
    assert len(ticks) == 1 and ticks[0][1] >= 5.0
    assert [type(e) for e in events] == [MemberJoined]
    stats = driver.statistics()
    assert stats.packets_in == 2 and stats.packets_dropped == 1
    assert stats.send_failures == 2


async def test_reliable_queue_is_bounded(autojump_clock: trio.testing.MockClock) -> None:
    core, transport = FakeCore(), FakeTransport()
    core.deadline = None
    driver = Driver(core, transport, FakeCodec(), lambda e: None, max_datagram_size=1400)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        sends = [Send(PEER, b"x%d" % i, reliable=True) for i in range(RELIABLE_QUEUE_MAX + 50)]
        await driver.apply(sends)  # must not block, whatever the senders are doing
        stats = driver.statistics()
        assert stats.reliable_queue_full >= 40
        failed = [c for c in core.calls if c[0] == "failed"]
        assert len(failed) == stats.reliable_queue_full
        nursery.cancel_scope.cancel()


async def test_oversize_datagram_goes_over_tcp(autojump_clock: trio.testing.MockClock) -> None:
    core, transport = FakeCore(), FakeTransport()
    core.deadline = None
    driver = Driver(core, transport, FakeCodec(), lambda e: None, max_datagram_size=10)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.apply([Send(PEER, b"a big record that does not fit")])
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert transport.datagrams == []
    assert transport.frames == [(PEER, b"Sa big record that does not fit")]
    assert driver.statistics().oversize_datagrams == 1


async def test_wait_for_rechecks_after_every_call_into_the_core(
    autojump_clock: trio.testing.MockClock,
) -> None:
    core, transport = FakeCore(), FakeTransport()
    driver = Driver(core, transport, FakeCodec(), lambda e: None, max_datagram_size=1400)  # type: ignore[arg-type]
    done: dict[str, float] = {}

    def count(kind: str) -> int:
        return sum(1 for c in core.calls if c[0] == kind)

    async def waiter(what: str, condition: Any) -> None:
        await driver.wait_for(condition)
        done[what] = trio.current_time()

    start = trio.current_time()
    core.deadline = start + 5.0
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        nursery.start_soon(waiter, "second packet", lambda: count("receive") >= 2)
        nursery.start_soon(waiter, "tick", lambda: count("tick") >= 1)
        nursery.start_soon(waiter, "already true", lambda: True)
        await transport.send_in.send(Incoming(PEER, b"Sone", False, URGENT))
        await trio.sleep(3)
        assert "second packet" not in done
        await transport.send_in.send(Incoming(PEER, b"Stwo", False, URGENT))
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert done["already true"] == start
    assert done["second packet"] == start + 3  # woken by the packet, not by a poll
    assert done["tick"] == start + 5.0  # the core's deadline


async def test_a_long_run_of_events_does_not_hold_up_packets(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A push-pull that brings 100 members: the packet queued behind it reaches the
    core before the node has seen all 100 events (the node's bookkeeping per event is
    what costs; the receive loop must not wait for it)."""
    core, transport = FakeCore(), FakeTransport()
    core.deadline = None
    joined = [MemberJoined(Member(f"m{i}", PEER, MemberState.ALIVE, 1)) for i in range(100)]

    def receive(
        source: Any, payload: bytes, now: float, *, reliable: bool, sender: str | None = None
    ) -> list[Any]:
        core.calls.append(("receive", source, payload, reliable))
        return list(joined) if payload == b"state" else []

    core.receive = receive  # type: ignore[method-assign]
    delivered: list[tuple[str, int]] = []

    def on_event(ev: Any) -> None:
        received = sum(1 for c in core.calls if c[0] == "receive")
        delivered.append((ev.member.name, received))

    driver = Driver(core, transport, FakeCodec(), on_event, max_datagram_size=1400)  # type: ignore[arg-type]
    # Both packets wait in the inbox when the driver wakes up (no scheduling race).
    transport.send_in.send_nowait(Incoming(PEER, b"Sstate", True, URGENT))
    transport.send_in.send_nowait(Incoming(PEER, b"Sping", False, URGENT))
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert [name for name, _ in delivered] == [f"m{i}" for i in range(100)]  # all, in order
    assert delivered[0][1] == 2  # the ping was handled before the first event's bookkeeping


class LateInbox(FakeTransport):
    """An inbox whose packet lands just as the core's deadline passes: the driver's
    wait has already timed out (the blocking receive never returns it)."""

    async def receive(self) -> Incoming:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def test_a_due_timer_waits_for_what_already_arrived(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A starved node finds the ack to its probe queued when the probe's timeout is
    already due: the core must see the ack before the tick that would time it out."""
    core, transport = FakeCore(), LateInbox()
    driver = Driver(core, transport, FakeCodec(), lambda _e: None, max_datagram_size=1400)  # type: ignore[arg-type]
    transport.send_in.send_nowait(Incoming(PEER, b"Sack", False, URGENT))
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    kinds = [c[0] for c in core.calls if c[0] in ("receive", "tick")]
    assert kinds == ["receive", "tick"]


async def test_only_probes_are_sent_as_expecting_an_answer() -> None:
    """`PathHealth` counts only datagrams that ask for an answer towards "UDP seems
    blocked": gossip and acks expect nothing back (issue 8's untrue `udp.blocked`)."""
    from swim import Send
    from swim.wire import Ack, Alive, IndirectPing, Ping, encode

    transport = FakeTransport()
    driver = Driver(FakeCore(), transport, FakeCodec(), lambda e: None, max_datagram_size=1400)  # type: ignore[arg-type]
    alive = Alive("n2", 1, ("127.0.0.1", 7), b"")
    await driver.apply([
        Send(PEER, encode(Ping(1, "n1", "n0", ("127.0.0.1", 8)), alive)),
        Send(PEER, encode(IndirectPing(2, "n2", ("127.0.0.1", 7), True, "n0", ("127.0.0.1", 8)))),
        Send(PEER, encode(Ack(1), alive)),
        Send(PEER, encode(alive)),
    ])  # fmt: skip
    assert transport.expects_answer == [True, True, False, False]
