"""`swim._timers`: which heap entries still hold, what each kind does when due, and the
reap (single core, rumors injected, the clock moved by hand)."""

from __future__ import annotations

import random

import attrs

from swim import Membership, MemberState
from swim.wire import INCARNATION_MAX, Alive, Dead, Suspect, encode

from .helpers import TEST_CONFIG

SOURCE = ("10.9.9.9", 1)


def core(**config: object) -> Membership:
    settings = attrs.evolve(TEST_CONFIG, **config)  # type: ignore[arg-type]
    return Membership(settings, "me", ("10.0.0.1", 1), random.Random(5), 0.0)


def alive(name: str, incarnation: int = 0) -> Alive:
    return Alive(name, incarnation, (f"10.0.2.{len(name)}", 1), b"")


def run_until(c: Membership, until: float) -> None:
    while (deadline := c.next_deadline()) is not None and deadline <= until:
        c.tick(deadline)


def test_a_dead_member_is_reaped_after_the_retention_and_its_incarnation_kept() -> None:
    c = core(dead_retention=10.0)
    c.receive(SOURCE, encode(alive("a", 4), Dead("a", 4, "x")), 1.0)
    run_until(c, 10.9)
    assert c.member("a") is not None
    run_until(c, 11.0)
    assert c.member("a") is None
    assert c.statistics().members_reaped == 1
    # A rumor at or below the reaped incarnation cannot bring it back ...
    c.receive(SOURCE, encode(alive("a", 4)), 12.0)
    assert c.member("a") is None
    assert c.statistics().stale_rumors_ignored == 1
    # ... one above it can.
    c.receive(SOURCE, encode(alive("a", 5)), 12.0)
    assert c.member("a") is not None


def suspect_a(c: Membership) -> float:
    """`a` suspected at 0.0; when its suspicion runs out."""
    c.receive(SOURCE, encode(alive("a"), alive("b"), Suspect("a", 0, "b")), 0.0)
    suspicion = c._members["a"].suspicion
    assert suspicion is not None
    return suspicion.deadline


def test_a_suspicion_that_runs_out_declares_the_member_dead() -> None:
    c = core(dynamic_suspicion_enabled=False)
    deadline = suspect_a(c)
    run_until(c, deadline - 0.001)
    assert c.member("a").state is MemberState.SUSPECT  # type: ignore[union-attr]
    run_until(c, deadline)
    assert c.member("a").state is MemberState.DEAD  # type: ignore[union-attr]
    assert c.statistics().members_failed == 1


def test_a_refuted_suspicion_does_not_fire() -> None:
    c = core(dynamic_suspicion_enabled=False)
    deadline = suspect_a(c)
    c.receive(SOURCE, encode(alive("a", 1)), 0.1)  # refuted: its timer is stale now
    run_until(c, deadline + 0.001)
    assert c.member("a").state is not MemberState.DEAD  # type: ignore[union-attr]
    assert c.statistics().members_failed == 0


def test_the_reaped_memory_forgets_the_oldest_first() -> None:
    c = core(dead_retention=1.0, reaped_memory_max=2)
    for i, name in enumerate(("a", "bb", "ccc")):
        c.receive(SOURCE, encode(alive(name, 3), Dead(name, 3, "x")), float(i))
    run_until(c, 10.0)
    assert c.num_members() == 1
    # "a" was forgotten (the oldest), so its old incarnation is welcome again.
    c.receive(SOURCE, encode(alive("a", 3), alive("bb", 3)), 11.0)
    assert c.member("a") is not None
    assert c.member("bb") is None


def test_a_record_reaped_at_the_limit_is_not_remembered() -> None:
    c = core(dead_retention=1.0)
    c.receive(SOURCE, encode(alive("a", INCARNATION_MAX), Dead("a", INCARNATION_MAX, "x")), 0.0)
    run_until(c, 5.0)
    assert c.member("a") is None
    c.receive(SOURCE, encode(alive("a", 0)), 6.0)  # its new session, back at 0
    assert c.member("a") is not None


def test_many_reaps_compact_the_name_list() -> None:
    c = core(dead_retention=1.0)
    names = [f"n{i}" for i in range(40)]
    c.receive(SOURCE, encode(*(alive(n) for n in names)), 0.0)
    assert len(c._names) == 41
    c.receive(SOURCE, encode(*(Dead(n, 0, "x") for n in names)), 0.0)
    run_until(c, 5.0)
    assert c.num_members() == 1
    # Compacted at the 33rd reap (over 32 stale, and over half the list): what was
    # left then (us and 7 members) stays listed until the next compaction.
    assert len(c._names) == 1 + 40 - 33
    c._check_invariants()
