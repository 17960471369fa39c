"""`swim._probing`: one core's probe round (ping, ack, nack, indirect) and the probes
it answers or relays for others (single core, packets injected)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

from swim import Membership, MemberState, MemberSuspected, Send
from swim.wire import Ack, Alive, Dead, IndirectPing, Nack, Ping, decode_packet, encode

from .helpers import TEST_CONFIG

ME = ("10.0.0.1", 1)
SOURCE = ("10.0.1.0", 1)


def core(members: int = 1, **config: object) -> Membership:
    c = Membership(attrs.evolve(TEST_CONFIG, **config), "me", ME, random.Random(3), 0.0)  # type: ignore[arg-type]
    for i in range(members):
        c.receive(("x", 1), encode(Alive(f"m{i}", 0, (f"10.0.1.{i}", 1), b"")), 0.0)
    return c


def messages(outputs: Sequence[object]) -> list[tuple[Send, object]]:
    return [(o, m) for o in outputs if isinstance(o, Send) for m in decode_packet(o.payload)]


def first_ping(c: Membership) -> tuple[float, Send, Ping]:
    for _ in range(100):
        now = c.next_deadline()
        assert now is not None
        for send, message in messages(list(c.tick(now))):
            if isinstance(message, Ping) and not send.reliable:
                return now, send, message
    raise AssertionError("no ping")


def test_a_probe_pings_the_member_at_its_address_and_an_ack_ends_it() -> None:
    c = core()
    now, send, ping = first_ping(c)
    assert send.destination == ("10.0.1.0", 1)
    assert (ping.target, ping.source, ping.source_address) == ("m0", "me", ME)
    c.receive(send.destination, encode(Ack(ping.seq)), now + 0.1)
    assert c.rtt("m0") is not None and abs(c.rtt("m0") - 0.1) < 1e-9  # type: ignore[operator]
    stats = c.statistics()
    assert (stats.probes_sent, stats.acks_unexpected, stats.probes_failed) == (1, 0, 0)
    # The same ack again matches nothing.
    c.receive(send.destination, encode(Ack(ping.seq)), now + 0.2)
    assert c.statistics().acks_unexpected == 1


def test_a_probe_nobody_answers_suspects_its_target() -> None:
    c = core(members=1)
    first_ping(c)
    suspected: list[MemberSuspected] = []
    while not suspected:
        now = c.next_deadline()
        assert now is not None and now < 5.0
        suspected = [o for o in c.tick(now) if isinstance(o, MemberSuspected)]
    assert suspected[0].member.name == "m0"
    assert c.statistics().probes_failed == 1
    assert c.awareness == 1  # no helpers to nack: the failure costs one


def test_the_direct_timeout_asks_helpers_and_their_nacks_are_counted() -> None:
    c = core(members=3, indirect_checks=2)
    now, send, ping = first_ping(c)
    outputs = list(c.tick(now + TEST_CONFIG.probe_timeout))
    requests = [(s, m) for s, m in messages(outputs) if isinstance(m, IndirectPing)]
    assert len(requests) == 2
    assert {m.target for _, m in requests} == {ping.target}
    assert send.destination not in {s.destination for s, _ in requests}
    for s, _ in requests:
        c.receive(s.destination, encode(Nack(ping.seq)), now + 0.6)
    c.receive(SOURCE, encode(Nack(ping.seq)), now + 0.6)  # a third: none was asked for
    stats = c.statistics()
    assert (stats.nacks_received, stats.acks_unexpected) == (2, 1)
    assert stats.indirect_probes_sent == 2


def test_a_ping_for_us_is_acked_and_one_for_another_name_is_dropped() -> None:
    c = core()
    outputs = messages(list(c.receive(SOURCE, encode(Ping(41, "me", "m0", SOURCE)), 0.1)))
    assert [(s.destination, m) for s, m in outputs if isinstance(m, Ack)] == [(SOURCE, Ack(41))]
    assert list(c.receive(SOURCE, encode(Ping(42, "other", "m0", SOURCE)), 0.1)) == []
    assert c.statistics().dropped_misdirected == 1


def test_an_indirect_ping_pings_the_held_address_and_relays_the_ack() -> None:
    c = core(members=2)
    request = IndirectPing(7, "m1", ("6.6.6.6", 1), True, "m0", SOURCE)
    sent = messages(list(c.receive(SOURCE, encode(request), 0.1)))
    pings = [(s, m) for s, m in sent if isinstance(m, Ping)]
    assert [s.destination for s, _ in pings] == [("10.0.1.1", 1)]  # never the named one
    relayed = messages(list(c.receive(("10.0.1.1", 1), encode(Ack(pings[0][1].seq)), 0.2)))
    assert [(s.destination, m) for s, m in relayed if isinstance(m, Ack)] == [(SOURCE, Ack(7))]


def test_an_unanswered_relay_sends_a_nack_when_asked_for_one() -> None:
    c = core(members=2)
    c.receive(SOURCE, encode(IndirectPing(7, "m1", ("10.0.1.1", 1), True, "m0", SOURCE)), 0.0)
    nacks: list[object] = []
    while not nacks:
        now = c.next_deadline()
        assert now is not None and now <= TEST_CONFIG.probe_timeout
        nacks = [m for _, m in messages(list(c.tick(now))) if isinstance(m, Nack)]
    assert nacks == [Nack(7)]
    assert c.statistics().nacks_sent == 1


def test_indirect_pings_for_unknown_targets_or_over_the_bound_are_refused() -> None:
    c = core(members=3, indirect_pending_max=1)
    assert (
        list(c.receive(SOURCE, encode(IndirectPing(1, "nobody", SOURCE, True, "m0", SOURCE)), 0.0))
        == []
    )
    assert (
        list(c.receive(SOURCE, encode(IndirectPing(2, "me", SOURCE, True, "m0", SOURCE)), 0.0))
        == []
    )
    assert c.statistics().indirect_targets_refused == 2
    c.receive(SOURCE, encode(IndirectPing(3, "m1", ("10.0.1.1", 1), True, "m0", SOURCE)), 0.0)
    c.receive(SOURCE, encode(IndirectPing(4, "m2", ("10.0.1.2", 1), True, "m0", SOURCE)), 0.0)
    assert c.statistics().dropped_indirect_full == 1


def test_the_probe_skips_dead_members() -> None:
    c = core(members=2)
    c.receive(SOURCE, encode(Dead("m0", 0, "x")), 0.0)
    assert c.member("m0").state is MemberState.DEAD  # type: ignore[union-attr]
    for _ in range(3):
        _, send, ping = first_ping(c)
        assert ping.target == "m1"
        c.receive(send.destination, encode(Ack(ping.seq)), c.next_deadline() or 0.0)
