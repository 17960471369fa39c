"""`swim._rumors`: how one core applies alive, suspect, dead and left rumors, and how
it refutes the ones about itself (single core, rumors injected as packets)."""

from __future__ import annotations

import random
from typing import Any

import attrs
import pytest

from swim import (
    IncarnationExhausted,
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberRecovered,
    Membership,
    MemberState,
    MemberSuspected,
    MemberUpdated,
    SelfRefuted,
    Send,
)
from swim.wire import INCARNATION_MAX, Alive, Dead, Left, Suspect, decode_packet, encode

from .helpers import TEST_CONFIG

SOURCE = ("10.9.9.9", 1)


def core() -> Membership:
    return Membership(TEST_CONFIG, "me", ("10.0.0.1", 1), random.Random(1), 0.0)


def hear(core: Membership, *messages: Any, now: float = 0.0) -> list[object]:
    return list(core.receive(SOURCE, encode(*messages), now))


def kinds(outputs: list[object]) -> list[type]:
    return [type(o) for o in outputs if not isinstance(o, Send)]


def state(core: Membership, name: str) -> tuple[MemberState, int] | None:
    member = core.member(name)
    return None if member is None else (member.state, member.incarnation)


def test_alive_about_a_stranger_joins_it() -> None:
    c = core()
    assert kinds(hear(c, Alive("a", 3, ("10.0.1.1", 1), b"x"))) == [MemberJoined]
    assert state(c, "a") == (MemberState.ALIVE, 3)
    assert c.member("a").meta == b"x"  # type: ignore[union-attr]


def test_alive_with_new_metadata_updates_and_the_same_alive_does_nothing() -> None:
    c = core()
    hear(c, Alive("a", 0, ("10.0.1.1", 1), b"x"))
    assert kinds(hear(c, Alive("a", 0, ("10.0.1.1", 1), b"x"))) == []
    assert kinds(hear(c, Alive("a", 1, ("10.0.1.1", 1), b"y"))) == [MemberUpdated]
    assert state(c, "a") == (MemberState.ALIVE, 1)


def test_suspect_then_alive_above_it_recovers() -> None:
    c = core()
    hear(c, Alive("a", 2, ("10.0.1.1", 1), b""), Alive("b", 0, ("10.0.1.2", 1), b""))
    assert kinds(hear(c, Suspect("a", 2, "b"))) == [MemberSuspected]
    assert state(c, "a") == (MemberState.SUSPECT, 2)
    assert kinds(hear(c, Alive("a", 2, ("10.0.1.1", 1), b""))) == []  # not above it
    assert kinds(hear(c, Alive("a", 3, ("10.0.1.1", 1), b""))) == [MemberRecovered]
    assert state(c, "a") == (MemberState.ALIVE, 3)


def test_an_older_accusation_is_ignored() -> None:
    c = core()
    hear(c, Alive("a", 5, ("10.0.1.1", 1), b""))
    assert kinds(hear(c, Suspect("a", 4, "x"), Dead("a", 4, "x"))) == []
    assert state(c, "a") == (MemberState.ALIVE, 5)


def test_dead_and_left_are_final_at_their_incarnation() -> None:
    c = core()
    hear(c, Alive("a", 0, ("10.0.1.1", 1), b""), Alive("b", 0, ("10.0.1.2", 1), b""))
    assert kinds(hear(c, Dead("a", 0, "x"))) == [MemberFailed]
    assert kinds(hear(c, Left("b", 0))) == [MemberLeft]
    assert kinds(hear(c, Alive("a", 0, ("10.0.1.1", 1), b""))) == []
    assert state(c, "a") == (MemberState.DEAD, 0)
    assert state(c, "b") == (MemberState.LEFT, 0)
    # A left member that comes back above its incarnation joins again.
    assert kinds(hear(c, Alive("b", 1, ("10.0.1.2", 1), b""))) == [MemberJoined]


def test_metadata_over_the_limit_is_dropped_and_counted() -> None:
    config = attrs.evolve(TEST_CONFIG, meta_size_max=4)
    c = Membership(config, "me", ("10.0.0.1", 1), random.Random(1), 0.0)
    assert hear(c, Alive("a", 0, ("10.0.1.1", 1), b"12345")) == []
    assert c.member("a") is None
    assert c.statistics().dropped_invalid == 1


@pytest.mark.parametrize("accusation", [Suspect("me", 4, "a"), Dead("me", 4, "a")])
def test_an_accusation_about_us_is_refuted_above_it(accusation: object) -> None:
    c = core()
    hear(c, Alive("a", 0, ("10.0.1.1", 1), b""))
    outputs = hear(c, accusation)
    assert [o for o in outputs if isinstance(o, SelfRefuted)] == [SelfRefuted(5)]
    assert c.incarnation == 5
    assert c.statistics().refutes == 1


def test_an_alive_about_us_with_our_own_record_is_no_accusation() -> None:
    c = core()
    assert hear(c, Alive("me", 0, ("10.0.0.1", 1), b"")) == []
    assert c.incarnation == 0
    # The same incarnation with another address is someone else's claim: outbid it.
    outputs = hear(c, Alive("me", 0, ("10.6.6.6", 1), b""))
    assert SelfRefuted(1) in outputs


def test_an_accusation_at_the_limit_starts_a_new_session_at_zero() -> None:
    c = core()
    outputs = hear(c, Suspect("me", INCARNATION_MAX, "a"))
    assert [o for o in outputs if isinstance(o, SelfRefuted)] == [
        IncarnationExhausted(0, accused=INCARNATION_MAX)
    ]
    assert c.incarnation == 0
    assert c.statistics().incarnation_sessions == 1


def test_a_suspicion_of_a_left_member_is_answered_with_its_left() -> None:
    c = core()
    hear(c, Alive("a", 0, ("10.0.1.1", 1), b""), Alive("b", 0, ("10.0.1.2", 1), b""))
    hear(c, Left("a", 0))
    outputs = hear(c, Suspect("a", 0, "b"))
    reminders = [
        o for o in outputs if isinstance(o, Send) and Left("a", 0) in list(decode_packet(o.payload))
    ]
    assert [r.destination for r in reminders] == [("10.0.1.2", 1)]
    assert c.statistics().left_reminders == 1
    # An accuser we do not hold is not reminded.
    hear(c, Suspect("a", 0, "stranger"))
    assert c.statistics().left_reminders == 1


def test_suspect_broadcasts_are_queued_for_gossip() -> None:
    c = core()
    hear(c, Alive("a", 0, ("10.0.1.1", 1), b""), Alive("b", 0, ("10.0.1.2", 1), b""))
    hear(c, Suspect("a", 0, "b"))
    gossip: list[object] = []
    while (deadline := c.next_deadline()) is not None and deadline < 0.5:
        for out in c.tick(deadline):
            if isinstance(out, Send):
                gossip += list(decode_packet(out.payload))
    assert Suspect("a", 0, "b") in gossip
