"""The membership service: the swim core, its driver, and the event fan-out.

Two real swim cores wired through an in-memory network under Trio's mock clock; no
sockets, no daemon.
"""

from __future__ import annotations

import trio
import trio.testing

from overlay.base import Address
from overlay.inbox import URGENT, Incoming
from populi_p2p.services.membership import MembershipService
from swim import Event, MemberJoined, SwimConfig

A: Address = ("10.0.0.1", 7946)
B: Address = ("10.0.0.2", 7946)


class Net:
    """Delivers every datagram and frame to the destination's inbox."""

    def __init__(self) -> None:
        self.inboxes: dict[Address, trio.MemorySendChannel[Incoming]] = {}

    def port(self, address: Address) -> Port:
        send, receive = trio.open_memory_channel[Incoming](1000)
        self.inboxes[address] = send
        return Port(self, address, receive)


class Port:
    def __init__(self, net: Net, address: Address, inbox: trio.MemoryReceiveChannel[Incoming]):
        self._net, self._address, self._inbox = net, address, inbox

    async def receive(self) -> Incoming:
        return await self._inbox.receive()

    def receive_nowait(self) -> Incoming:
        return self._inbox.receive_nowait()

    async def send_datagram(
        self, address: Address, payload: bytes, *, expects_answer: bool = True
    ) -> None:
        self._net.inboxes[address].send_nowait(Incoming(self._address, payload, False, URGENT))

    async def send_frame(self, address: Address, payload: bytes) -> None:
        self._net.inboxes[address].send_nowait(Incoming(self._address, payload, True, URGENT))


class Plain:
    """No authentication: the payload is the packet."""

    last_sender: str | None = None

    def seal(self, destination: Address, payload: bytes, reliable: bool) -> bytes:
        return payload

    def open(self, incoming: Incoming) -> bytes | None:
        return incoming.payload


def service(net: Net, name: str, address: Address) -> MembershipService:
    return MembershipService(
        SwimConfig.local(), name, address, meta=b"", incarnation=1,
        transport=net.port(address), codec=Plain(), max_datagram_size=1400,
        now=trio.current_time(),
    )  # fmt: skip


async def collect(events: trio.MemoryReceiveChannel[Event], into: list[Event], n: int) -> None:
    async for ev in events:
        into.append(ev)
        if len(into) >= n:
            return


async def test_every_subscriber_sees_the_join_and_a_closed_one_is_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = Net()
    a, b = service(net, "a", A), service(net, "b", B)
    first, second = a.subscribe(), a.subscribe(max_buffer=1)  # a slow one too
    closed = a.subscribe()
    await closed.aclose()  # unsubscribed: must not block or break the others
    seen_first: list[Event] = []
    seen_second: list[Event] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        await a.join([B])
        with trio.fail_after(10):
            async with trio.open_nursery() as readers:
                readers.start_soon(collect, first, seen_first, 1)
                readers.start_soon(collect, second, seen_second, 1)
        nursery.cancel_scope.cancel()
    assert isinstance(seen_first[0], MemberJoined) and seen_first[0].member.name == "b"
    assert seen_second == seen_first
    assert a.num_alive() == 2


async def test_subscribers_get_events_in_the_cores_order_without_loss(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = Net()
    hub = service(net, "hub", A)
    slow = hub.subscribe(max_buffer=1)
    fast = hub.subscribe()
    others = [service(net, f"n{i}", (f"10.0.1.{i}", 7946)) for i in range(5)]
    got_slow: list[Event] = []
    got_fast: list[Event] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        for other in others:
            await nursery.start(other.run)
            await other.join([A])
        with trio.fail_after(30):
            async with trio.open_nursery() as readers:
                readers.start_soon(collect, fast, got_fast, 5)

                async def slowly() -> None:
                    async for ev in slow:
                        await trio.sleep(0.5)  # a subscriber busy with each event
                        got_slow.append(ev)
                        if len(got_slow) >= 5:
                            return

                readers.start_soon(slowly)
        nursery.cancel_scope.cancel()
    joined = sorted(ev.member.name for ev in got_fast if isinstance(ev, MemberJoined))
    assert joined == [f"n{i}" for i in range(5)]
    assert got_slow == got_fast[: len(got_slow)]
