"""Where a reply goes (`swim._reply`): never at an address only the request names.

Issue 18, row 4: pings, indirect pings, syncs and push-pulls were answered at the
`source_address` they name, so any enrolled key could aim an ack with a datagram of
piggybacked rumors, or a whole view over a TCP connection, at a victim. These tests pin
the rule that replaced it, message kind by message kind: the requester's held address
or the address it names (when the request came from there, as a joiner's does), the
named address over a stream only on the connection's host, and otherwise the packet's
source within the request's size.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from swim import Address
from swim._reply import fit_within, reply_route
from swim.wire import (
    Ack,
    Alive,
    AliveRef,
    Dead,
    IndirectPing,
    Nack,
    Ping,
    Pull,
    PushPull,
    Sync,
    decode_packet,
    encode,
    encode_packet,
    meta_digest,
)
from tests.swim.helpers import TEST_CONFIG, address_of
from tests.swim.test_pull_route import REQUESTER, VICTIM, core, sends

STRANGER = ("10.0.0.77", 4000)
TARGET = address_of(10)  # "b0" in `core`


def ping(named: Address = VICTIM, requester: str = "x", seq: int = 5) -> bytes:
    return encode(Ping(seq, "me", requester, named))


#: Entries about "x" as every core here holds it: they change nothing, and give a
#: request room for an answer of a few records.
PADDING = tuple(("x", REQUESTER, 0, 0, b"p" * 40) for _ in range(12))


def sync_open(named: Address = VICTIM, requester: str = "x", *, join: bool = False) -> bytes:
    return encode(Sync(0, join, requester, named, (), PADDING, (), b"", b""))


def test_the_rule_table() -> None:
    held, elsewhere = ("10.0.0.5", 7946), ("10.0.0.6", 7946)
    ephemeral = ("10.0.0.5", 51234)
    # Datagrams: full from the held address or the named one, else to the source, cut.
    assert reply_route(held, VICTIM, held, False) == (held, False)
    assert reply_route(held, held, elsewhere, False) == (elsewhere, True)
    assert reply_route(None, elsewhere, elsewhere, False) == (elsewhere, False)
    assert reply_route(held, elsewhere, elsewhere, False) == (elsewhere, False)
    assert reply_route(None, VICTIM, elsewhere, False) == (elsewhere, True)
    # Streams: the named address on the connection's host, else the held one there.
    assert reply_route(None, held, ephemeral, True) == (held, False)
    assert reply_route(held, VICTIM, ephemeral, True) == (held, False)
    assert reply_route(None, VICTIM, ephemeral, True) is None
    assert reply_route(elsewhere, VICTIM, ephemeral, True) is None


def test_a_ping_from_the_held_address_is_acked_there_with_rumors() -> None:
    me = core()
    request = ping(named=VICTIM)
    (ack,) = sends(me.receive(REQUESTER, request, 1.0))
    assert ack.destination == REQUESTER and not ack.reliable
    assert decode_packet(ack.payload)[0] == Ack(5)
    assert len(ack.payload) > 2 * len(request)  # it asked: rumors ride along


def test_a_ping_naming_a_victim_is_acked_at_its_source_within_its_size() -> None:
    me = core()
    request = ping(named=VICTIM)
    (ack,) = sends(me.receive(STRANGER, request, 1.0))
    assert ack.destination == STRANGER and not ack.reliable
    assert decode_packet(ack.payload)[0] == Ack(5)
    assert len(ack.payload) <= len(request)
    assert me.statistics().replies_capped == 1
    # The member "x" itself, from another address: the same.
    (ack,) = sends(me.receive(("10.0.0.50", 9999), request, 1.1, sender="x"))
    assert ack.destination == ("10.0.0.50", 9999) and len(ack.payload) <= len(request)


def test_a_ping_in_another_members_name_is_refused() -> None:
    me = core()
    assert sends(me.receive(REQUESTER, ping(named=REQUESTER), 1.0, sender="b0")) == []
    assert me.statistics().replies_refused == 1


def test_a_ping_over_a_stream_is_acked_on_the_connections_host_only() -> None:
    me = core()
    connection = (REQUESTER[0], 51234)
    (ack,) = sends(me.receive(connection, ping(named=REQUESTER), 1.0, reliable=True))
    assert ack.destination == REQUESTER and ack.reliable
    # Naming another host than the connection's: refused, nothing sent anywhere.
    assert sends(me.receive(("10.0.0.66", 40000), ping(named=VICTIM), 1.1, reliable=True)) == []
    assert me.statistics().replies_refused == 1


def test_an_indirect_ping_goes_to_the_targets_held_address_within_the_requests_size() -> None:
    me = core()
    request = encode(IndirectPing(9, "b0", VICTIM, True, "x", VICTIM))
    (relayed,) = sends(me.receive(STRANGER, request, 1.0))
    assert relayed.destination == TARGET and len(relayed.payload) <= len(request)
    probe = decode_packet(relayed.payload)[0]
    assert isinstance(probe, Ping) and probe.target == "b0"
    # The target answers: the ack goes back where the request came from, bare.
    (forwarded,) = sends(me.receive(TARGET, encode(Ack(probe.seq)), 1.1))
    assert forwarded.destination == STRANGER
    assert list(decode_packet(forwarded.payload)) == [Ack(9)]


def test_an_indirect_ping_from_the_held_address_is_answered_there_in_full() -> None:
    me = core()
    request = encode(IndirectPing(9, "b0", TARGET, True, "x", VICTIM))
    (relayed,) = sends(me.receive(REQUESTER, request, 1.0))
    probe = decode_packet(relayed.payload)[0]
    assert isinstance(probe, Ping)
    (forwarded,) = sends(me.receive(TARGET, encode(Ack(probe.seq)), 1.1))
    assert forwarded.destination == REQUESTER and len(decode_packet(forwarded.payload)) > 1


def test_a_nack_goes_back_under_the_same_rule() -> None:
    me = core()
    request = encode(IndirectPing(9, "b0", TARGET, True, "x", VICTIM))
    me.receive(STRANGER, request, 1.0)
    outputs = sends(me.tick(1.0 + TEST_CONFIG.probe_timeout))
    nacks = [s for s in outputs if Nack(9) in decode_packet(s.payload)]
    assert [s.destination for s in nacks] == [STRANGER]
    assert list(decode_packet(nacks[0].payload)) == [Nack(9)]


def test_an_indirect_ping_for_a_target_nobody_holds_is_refused() -> None:
    me = core()
    request = encode(IndirectPing(9, "ghost", VICTIM, True, "x", REQUESTER))
    assert sends(me.receive(REQUESTER, request, 1.0)) == []
    assert me.statistics().indirect_targets_refused == 1


def test_many_indirect_pings_in_one_packet_send_the_target_at_most_the_packets_size() -> None:
    me = core()
    request = encode(*(IndirectPing(i, "b0", TARGET, False, "x", VICTIM) for i in range(30)))
    out = sends(me.receive(STRANGER, request, 1.0))
    assert out and all(s.destination == TARGET for s in out)
    assert sum(len(s.payload) for s in out) <= len(request)


def test_a_sync_naming_a_victim_is_answered_at_its_source_within_its_size() -> None:
    me = core()
    request = sync_open(named=VICTIM)
    out = sends(me.receive(STRANGER, request, 1.0))
    assert [s.destination for s in out] == [STRANGER] and not out[0].reliable
    assert len(out[0].payload) <= len(request)
    answer = decode_packet(out[0].payload)[0]
    assert isinstance(answer, Sync) and answer.leg == 1 and answer.app_state == b""
    assert 1 <= len(answer.members) < 8
    assert me.statistics().replies_capped == 1


def test_a_sync_from_the_held_address_gets_the_whole_view() -> None:
    me = core()
    out = sends(me.receive(REQUESTER, sync_open(named=VICTIM), 1.0))
    assert [s.destination for s in out] == [REQUESTER] and out[0].reliable  # too big for UDP
    answer = decode_packet(out[0].payload)[0]
    assert isinstance(answer, Sync) and len(answer.members) == 8  # x, b0-b5 and me


def test_a_join_from_the_address_it_names_gets_the_whole_view_there() -> None:
    """A node we do not hold yet joins from its own bound port, which it names: the
    whole view goes there."""
    me = core()
    joiner = ("10.0.0.60", 7946)
    entry = ("new", joiner, 0, 0, b"")
    request = encode(Sync(0, True, "new", joiner, (("new", 0, 0, 1),), (entry,), (), b"", b""))
    out = sends(me.receive(joiner, request, 1.0, sender="new"))
    assert [s.destination for s in out] == [joiner] and out[0].reliable
    answer = decode_packet(out[0].payload)[0]
    assert isinstance(answer, Sync) and len(answer.members) >= 8
    # The same join naming a victim: its own entry does not vouch for the address it
    # names, so the answer goes to its source, within its size.
    victim_entry = ("new2", VICTIM, 0, 0, b"")
    request = encode(Sync(0, True, "new2", VICTIM, (), (victim_entry, *PADDING), (), b"", b""))
    out = sends(me.receive(joiner, request, 1.1, sender="new2"))
    assert [s.destination for s in out] == [joiner] and len(out[0].payload) <= len(request)


def test_a_join_over_a_stream_is_answered_on_the_connections_host() -> None:
    me = core()
    joiner = ("10.0.0.60", 7946)
    entry = ("new", joiner, 0, 0, b"")
    request = encode(Sync(0, True, "new", joiner, (), (entry,), (), b"", b""))
    out = sends(me.receive(("10.0.0.60", 40001), request, 1.0, reliable=True))
    assert [s.destination for s in out] == [joiner] and out[0].reliable
    # From another host: merged, not answered; no connection to the named address.
    request = encode(Sync(0, True, "new3", VICTIM, (), (), (), b"", b""))
    assert sends(me.receive(("10.0.0.66", 40001), request, 1.1, reliable=True)) == []
    assert me.statistics().replies_refused == 1


def test_a_sync_in_another_members_name_is_refused_and_not_merged() -> None:
    me = core()
    entry = ("x", VICTIM, 7, 0, b"")
    request = encode(Sync(0, False, "x", VICTIM, (), (entry,), (), b"", b""))
    assert sends(me.receive(REQUESTER, request, 1.0, sender="b0")) == []
    held = me.member("x")
    assert held is not None and held.incarnation == 0
    assert me.statistics().replies_refused == 1


def test_a_closing_leg_goes_under_the_same_rule() -> None:
    """Leg 1 (the replier's answer) names where to send leg 2: from elsewhere than the
    replier's held address, leg 2 goes to the packet's source, within its size."""
    me = core()
    reply = encode(Sync(1, False, "x", VICTIM, (), (), ("b0", "b1", "b2"), b"", b""))
    out = sends(me.receive(STRANGER, reply, 1.0))
    assert [s.destination for s in out] == [STRANGER] and len(out[0].payload) <= len(reply)
    out = sends(me.receive(REQUESTER, reply, 1.1))
    answer = decode_packet(out[0].payload)[0]
    assert [s.destination for s in out] == [REQUESTER]
    assert isinstance(answer, Sync) and answer.leg == 2 and len(answer.members) == 3


def test_a_legacy_push_pull_naming_a_victim_is_answered_at_its_source_within_its_size() -> None:
    me = core()
    request = encode(PushPull(False, False, "x", VICTIM, PADDING))
    out = sends(me.receive(STRANGER, request, 1.0))
    assert [s.destination for s in out] == [STRANGER] and len(out[0].payload) <= len(request)
    out = sends(me.receive(REQUESTER, request, 1.1))
    answer = decode_packet(out[0].payload)[0]
    assert [s.destination for s in out] == [REQUESTER]
    assert isinstance(answer, PushPull) and len(answer.members) == 8


def test_a_stale_alive_relayed_by_another_tells_nobody() -> None:
    """An alive about a reaped member, naming a victim: the address is told the member
    is dead only when the rumor came from there (the member itself)."""
    me = core()
    me.receive(REQUESTER, encode(Dead("b5", 0, "x")), 1.0)
    me.tick(1.0 + TEST_CONFIG.dead_retention)  # reaped
    assert me.member("b5") is None
    stale = encode(Alive("b5", 0, VICTIM, b""))
    assert sends(me.receive(STRANGER, stale, 100.0)) == []
    (dead,) = sends(me.receive(VICTIM, stale, 100.1))  # from the member itself
    assert dead.destination == VICTIM
    assert decode_packet(dead.payload)[0] == Dead("b5", 0, "me")


def test_a_lean_rumor_over_a_stream_pulls_from_the_named_address_bare() -> None:
    """Over a stream the member named is asked for its record: a bare pull, never with
    piggybacked rumors, whatever is queued."""
    me = core()
    lean = encode(AliveRef("new", 1, VICTIM, meta_digest(b"m" * 300)))
    (pull,) = sends(me.receive(("10.0.0.66", 40000), lean, 1.0, reliable=True))
    assert pull.destination == VICTIM and not pull.reliable
    assert [type(m) for m in decode_packet(pull.payload)] == [Pull]


ADDRESSES = st.tuples(
    st.sampled_from(["10.0.0.50", "10.0.0.99", "10.0.0.10"]),
    st.sampled_from([7946, 53, 51234]),
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, str, Address]:
    """A request: its packet, its requester, and the address it names."""
    named = draw(ADDRESSES)
    requester = draw(st.sampled_from(["x", "b0", "new"]))
    join = draw(st.booleans())
    kind = draw(st.sampled_from(["ping", "indirect", "sync0", "sync1", "push"]))
    if kind == "ping":
        return encode(Ping(3, "me", requester, named)), requester, named
    if kind == "indirect":
        target = draw(st.sampled_from(["b0", "b1", "ghost"]))
        message = IndirectPing(3, target, named, True, requester, named)
        return encode(message), requester, named
    if kind == "sync0":
        return encode(Sync(0, join, requester, named, (), (), (), b"", b"")), requester, named
    if kind == "sync1":
        message1 = Sync(1, False, requester, named, (), (), ("b0", "b1", "x"), b"", b"")
        return encode(message1), requester, named
    return encode(PushPull(join, False, requester, named, ())), requester, named


@given(
    request=requests(),
    source=ADDRESSES,
    sender=st.sampled_from([None, "x", "b0"]),
    reliable=st.booleans(),
)
def test_no_reply_goes_where_the_request_alone_points(
    request: tuple[bytes, str, Address],
    source: Address,
    sender: str | None,
    reliable: bool,
) -> None:
    """Whatever is asked: a reply goes to the packet's source, to the requester's held
    address, or (over a stream) to the named address on the source's host; only an
    indirect ping's target, at its held address, gets anything else. Anything bigger
    than the request goes only where the request provably came from."""
    payload, requester, named = request
    me = core()
    held = me.member(requester)
    held_address = held.address if held is not None else None
    out = sends(me.receive(source, payload, 1.0, reliable=reliable, sender=sender))
    if sender is not None and sender != requester:
        assert out == []
    relayed = [s for s in out if isinstance(decode_packet(s.payload)[0], Ping)]
    answers = [s for s in out if s not in relayed]
    for send in relayed:  # an indirect ping's probe: to a member we hold, at its address
        assert any(m.address == send.destination for m in me.members() if m.name != "me")
    assert sum(len(s.payload) for s in relayed) <= len(payload)
    assert not any(s.reliable for s in relayed)
    for send in answers:
        if reliable:
            assert send.destination[0] == source[0]
            assert send.destination in (named, held_address)
        else:
            assert send.destination == source
    proven = source in (held_address, named)
    if not reliable and not proven:
        assert sum(len(s.payload) for s in answers) <= len(payload)
        assert not any(s.reliable for s in answers)


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=12), st.integers(0, 3000))
def test_fit_within_takes_the_longest_prefix_that_fits(parts: list[bytes], budget: int) -> None:
    def build(k: int) -> bytes:
        return encode_packet(parts[:k])

    fitted = fit_within(build, len(parts), budget)
    if fitted is None:
        assert len(build(0)) > budget
        return
    k, packet = fitted
    assert packet == build(k) and len(packet) <= budget
    if k < len(parts):
        assert len(build(k + 1)) > budget
