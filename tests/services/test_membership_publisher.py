"""The node's services alone: the membership fan-out and the record publisher.

Two real swim cores wired through an in-memory network under Trio's mock clock; no
sockets, no daemon.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from overlay.base import Address
from overlay.inbox import URGENT, Incoming
from populi_p2p.services.codec import AuthCodec
from populi_p2p.services.membership import MembershipService
from populi_p2p.services.publisher import RecordPublisher, RecordSigner
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.record import NodeRecord, SignedNodeRecord
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


async def test_publisher_re_signs_on_a_gpu_change_and_publishes_until_left(
    tmp_path: Path,
) -> None:
    """The signer's first record is the membership's metadata; the publisher, built
    after the membership, re-signs each change and publishes it while we have not left."""
    identity = NodeIdentity.load_or_create(tmp_path)
    signed: list[bytes] = []
    published: list[bytes] = []
    open_ = [True]
    clock = iter(float(t) for t in range(1_000, 2_000))
    signer = RecordSigner(
        identity, b"", name="n1", labels={"zone": "a"}, started_at=1.0, max_bytes=1200,
        clock=lambda: next(clock),
    )  # fmt: skip
    signer.advertise = ("10.0.0.1", 7946)

    class Report:
        def to_record(self) -> dict[str, object]:
            return {}

    first = signer.sign()
    assert first.signed_at == 1_000.0

    async def publish(raw: bytes) -> None:
        published.append(raw)

    publisher = RecordPublisher(
        signer, publish=publish, is_open=lambda: open_[0],
        on_signed=lambda raw, _now: signed.append(raw),
    )  # fmt: skip
    await publisher.gpu_changed(Report())
    assert len(published) == 1 and published[0] != first.raw and signed == published
    await publisher.set_section("peer", {"port": 1})
    await publisher.set_section("peer", {"port": 1})  # unchanged: not re-signed
    await publisher.set_section("gone", None)  # nothing to remove: not re-signed
    assert len(published) == 2
    records = [SignedNodeRecord.from_bytes(raw).record for raw in [first.raw, *signed]]
    assert [r.sequence for r in records] == sorted({r.sequence for r in records})
    assert all(isinstance(r, NodeRecord) and r.name == "n1" for r in records)
    assert records[-1].port == 7946 and records[-1].sections == {"peer": {"port": 1}}
    open_[0] = False  # left: nothing more is signed or published
    await publisher.gpu_changed(Report())
    await publisher.set_draining(True)
    assert len(published) == 2 and len(signed) == 2


class Paths:
    def __init__(self) -> None:
        from overlay.peerpaths import PathHealth

        self.paths = PathHealth()


def blocked_warnings(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if r.getMessage() == "udp.blocked")


def starve(paths: Paths, peer: Address) -> None:
    """Datagrams unanswered for 10 s while a TCP frame came back: "UDP seems blocked"."""
    for second in range(11):
        paths.paths.record_udp_sent(peer, float(second))
    paths.paths.record_tcp_received(peer)


def test_udp_blocked_is_warned_only_when_it_lasts_two_checks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from populi_p2p.services.links import LinkService

    caplog.set_level(logging.DEBUG)
    transport = Paths()
    links = LinkService("me", _codec(), transport, lambda _n: True)
    starve(transport, B)
    links.check()
    assert blocked_warnings(caplog) == 0  # one check: maybe a starved peer
    transport.paths.record_udp_received(B)  # it answered: it was
    links.check()
    starve(transport, B)
    links.check()
    assert blocked_warnings(caplog) == 0
    links.check()  # still blocked a check later: a firewall
    assert blocked_warnings(caplog) == 1
    links.check()
    assert blocked_warnings(caplog) == 1  # once per episode


def _codec() -> AuthCodec:
    from populi_p2p.trust.authority import ClusterAuthority
    from populi_p2p.trust.envelope_keys import packet_authenticator

    authority = ClusterAuthority.from_seed(b"A" * 32)
    identity = NodeIdentity.from_seed(b"m" * 32)
    cert = authority.enroll(identity.public_key, now=1_700_000_000.0, serial=1).raw
    return AuthCodec(packet_authenticator(identity, cert, authority.public_key), 1 << 20)
