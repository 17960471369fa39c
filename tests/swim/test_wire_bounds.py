"""Bounded integers (issue 7 §2): nothing a peer says can push a number past what encodes.

A signed `Suspect(victim, 2**64 - 1)` used to make the victim refute at 2**64 and crash
the driver with `OverflowError`. Every wire integer is now checked against
`swim.wire.INTEGER_MAX` (2**62) at decode; a member accused at the limit starts a new
incarnation session at 0 instead of refuting past it, and gets back in once its peers
reap the old session.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swim import (
    INCARNATION_MAX,
    IncarnationExhausted,
    Membership,
    MemberState,
    SelfRefuted,
    Send,
)
from swim.wire import (
    INTEGER_MAX,
    Ack,
    Alive,
    Dead,
    DecodeError,
    IntegerRangeError,
    Left,
    Message,
    Ping,
    PushPull,
    Suspect,
    decode_packet,
    encode,
)

from .helpers import TEST_CONFIG, Cluster, Network

ME = ("10.0.0.1", 7946)
accepted = st.integers(min_value=0, max_value=INCARNATION_MAX)
too_big = st.integers(min_value=INCARNATION_MAX + 1, max_value=2**64 - 1)


def core(incarnation: int = 0) -> Membership:
    return Membership(TEST_CONFIG, "me", ME, random.Random(1), 0.0, incarnation=incarnation)


def all_sends_decode(outputs: Sequence[object]) -> None:
    for output in outputs:
        if isinstance(output, Send):
            decode_packet(output.payload)  # raises if a refute escaped the range


def test_the_limit_leaves_headroom_for_sqlite_and_msgpack() -> None:
    assert INCARNATION_MAX == INTEGER_MAX == 2**62
    assert INCARNATION_MAX + 1 < 2**63 - 1  # SQLite INTEGER is signed 64-bit
    msgpack.packb(INCARNATION_MAX + 1)


@pytest.mark.parametrize("incarnation", [2**64 - 1, 2**63, 2**63 - 1, INCARNATION_MAX + 1])
def test_a_suspect_above_the_limit_is_dropped_and_counted(incarnation: int) -> None:
    """The issue's crash: today this raises OverflowError (or stores an unstorable value)."""
    me = core(incarnation=5)
    out = me.receive(("10.9.9.9", 1), encode(Suspect("me", incarnation, "evil")), 1.0)
    assert out == []
    assert me.incarnation == 5
    stats = me.statistics()
    assert stats.dropped_out_of_range == 1
    assert stats.dropped_malformed == 0
    assert stats.refutes == 0


@settings(max_examples=100, deadline=None)
@given(too_big, st.sampled_from(["alive", "suspect", "dead", "left", "ping", "ack", "pp"]))
def test_every_wire_integer_is_bounded_in_one_place(value: int, kind: str) -> None:
    table: dict[str, Message] = {
        "alive": Alive("x", value, ("h", 1), b""),
        "suspect": Suspect("x", value, "y"),
        "dead": Dead("x", value, "y"),
        "left": Left("x", value),
        "ping": Ping(value, "x", "y", ("h", 1)),
        "ack": Ack(value),
        "pp": PushPull(False, False, "y", ("h", 1), (("x", ("h", 1), value, 0, b""),)),
    }
    message = table[kind]
    with pytest.raises(IntegerRangeError):
        decode_packet(encode(message))
    assert issubclass(IntegerRangeError, DecodeError)


@settings(max_examples=200, deadline=None)
@given(accepted, accepted, st.sampled_from(["suspect", "dead", "left", "alive", "pp"]))
def test_no_accepted_accusation_makes_the_core_raise_or_leave_the_range(
    mine: int, accused: int, kind: str
) -> None:
    """Refute path and codec never raise on a value the decoder accepts, and stay in range."""
    me = core(incarnation=mine)
    table: dict[str, Message] = {
        "suspect": Suspect("me", accused, "evil"),
        "dead": Dead("me", accused, "evil"),
        "left": Left("me", accused),
        "alive": Alive("me", accused, ("6.6.6.6", 1), b"forged"),
        "pp": PushPull(False, True, "evil", ("h", 1), (("me", ME, accused, 1, b""),)),
    }
    message = table[kind]
    packet = encode(message)
    assert decode_packet(packet)  # accepted ...
    out = me.receive(("10.9.9.9", 1), packet, 1.0)  # ... so never raises
    assert 0 <= me.incarnation <= INCARNATION_MAX
    all_sends_decode(out)
    all_sends_decode(me.tick(5.0))
    refutes = [e for e in out if isinstance(e, SelfRefuted)]
    if accused >= mine and accused < INCARNATION_MAX:
        assert me.incarnation == accused + 1
        assert refutes == [SelfRefuted(accused + 1)]
    if accused == INCARNATION_MAX:
        assert refutes == [IncarnationExhausted(0, accused=INCARNATION_MAX)]
        assert me.incarnation == 0


@settings(max_examples=100, deadline=None)
@given(accepted)
def test_encode_decode_round_trip_over_the_accepted_range(value: int) -> None:
    messages = (
        Alive("x", value, ("h", 1), b"m"),
        Suspect("x", value, "y"),
        Ping(value, "x", "y", ("h", 2)),
        PushPull(True, False, "y", ("h", 1), (("x", ("h", 1), value, 2, b""),)),
    )
    assert decode_packet(encode(*messages)) == list(messages)


def test_refute_at_the_limit_starts_a_new_session() -> None:
    me = core(incarnation=INCARNATION_MAX)
    out = me.receive(("10.9.9.9", 1), encode(Suspect("me", INCARNATION_MAX, "evil")), 1.0)
    assert IncarnationExhausted(0, accused=INCARNATION_MAX) in out
    assert me.incarnation == 0
    assert me.statistics().incarnation_sessions == 1
    # set_meta at the limit does the same, without raising.
    capped = core(incarnation=INCARNATION_MAX)
    assert capped.set_meta(b"new", 1.0) == [IncarnationExhausted(0, accused=INCARNATION_MAX)]
    assert capped.incarnation == 0


def test_the_constructor_refuses_an_incarnation_out_of_range() -> None:
    with pytest.raises(ValueError, match="2\\*\\*62"):
        core(incarnation=INCARNATION_MAX + 1)


def test_a_member_accused_at_the_limit_gets_back_in() -> None:
    """Every peer is told node-2 is suspect at the limit: it cannot outbid that, so it
    starts over at 0, is declared dead, reaped, and then taken back as a new member."""
    cluster = Cluster(4, config=TEST_CONFIG, seed=3, network=Network())
    cluster.join_all()
    cluster.run(3.0)
    assert cluster.converged()
    for name in ("node-1", "node-3", "node-4"):
        cluster.inject(name, Suspect("node-2", INCARNATION_MAX, "evil"))
    cluster.run(1.0)
    assert cluster.nodes["node-2"].incarnation == 0
    limit = TEST_CONFIG.dead_retention + 2 * TEST_CONFIG.push_pull_interval + 30.0
    cluster.run(limit)
    assert cluster.failures_of("node-2")  # the old session was declared dead ...
    assert cluster.converged()  # ... and the new one is alive everywhere
    for observer in ("node-1", "node-3", "node-4"):
        member = cluster.member(observer, "node-2")
        assert member is not None and member.state is MemberState.ALIVE
        assert member.incarnation < 10
