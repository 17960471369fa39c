"""The precedence table, cell by cell: as data, and as behaviour of a real core."""

from __future__ import annotations

import itertools
import random

import pytest

from swim import (
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberRecovered,
    Membership,
    MemberState,
    MemberSuspected,
    MemberUpdated,
    SelfRefuted,
    SwimConfig,
)
from swim._state import PRECEDENCE, Action, Order, Rumor, Subject, decide, order_of
from swim.wire import Alive, Dead, Left, Message, Suspect, encode

CONFIG = SwimConfig.lan()
ME = ("10.0.0.1", 7946)
OTHER = ("10.0.0.2", 7946)
HELD = 5  # the incarnation we hold before the rumor

ALL_CELLS = list(itertools.product(Subject, Rumor, Order))


def expected_action(subject: Subject, rumor: Rumor, order: Order) -> Action:
    """The rules of the Theory of operation, written independently of the table."""
    if subject is Subject.UNKNOWN:
        return Action.BECOME_ALIVE if rumor is Rumor.ALIVE else Action.IGNORE
    if subject is Subject.SELF_LEFT or order is Order.OLDER:
        return Action.IGNORE
    if subject is Subject.SELF:
        if rumor is Rumor.ALIVE and order is Order.SAME:
            return Action.REFUTE_IF_CHANGED
        return Action.REFUTE
    if rumor is Rumor.ALIVE:
        return Action.BECOME_ALIVE if order is Order.NEWER else Action.IGNORE
    if subject in (Subject.DEAD, Subject.LEFT):
        return Action.IGNORE
    if rumor is Rumor.SUSPECT:
        if subject is Subject.SUSPECT and order is Order.SAME:
            return Action.CONFIRM
        return Action.BECOME_SUSPECT
    return Action.BECOME_DEAD if rumor is Rumor.DEAD else Action.BECOME_LEFT


def test_table_has_every_cell() -> None:
    assert len(PRECEDENCE) * 3 == len(ALL_CELLS) == 84


@pytest.mark.parametrize(("subject", "rumor", "order"), ALL_CELLS)
def test_table_matches_theory_of_operation(subject: Subject, rumor: Rumor, order: Order) -> None:
    assert decide(subject, rumor, order) is expected_action(subject, rumor, order)


def test_order_of() -> None:
    assert [order_of(i, 5) for i in (4, 5, 6)] == [Order.OLDER, Order.SAME, Order.NEWER]


####################################################################################
# Every cell through a real core
####################################################################################


def core_holding(subject: Subject) -> tuple[Membership, str]:
    """A core whose view of the rumor's subject is `subject`, at incarnation HELD."""
    if subject in (Subject.SELF, Subject.SELF_LEFT):
        core = Membership(CONFIG, "me", ME, random.Random(1), 0.0, incarnation=HELD)
        if subject is Subject.SELF_LEFT:
            core.leave(0.0)
        return core, "me"
    core = Membership(CONFIG, "me", ME, random.Random(1), 0.0)
    if subject is not Subject.UNKNOWN:
        core.receive(OTHER, encode(Alive("m", HELD, OTHER, b"")), 0.0)
    setups: dict[Subject, Message] = {
        Subject.SUSPECT: Suspect("m", HELD, "x"),
        Subject.DEAD: Dead("m", HELD, "x"),
        Subject.LEFT: Left("m", HELD),
    }
    setup = setups.get(subject)
    if setup is not None:
        core.receive(OTHER, encode(setup), 0.0)
    return core, "m"


def rumor_message(rumor: Rumor, name: str, incarnation: int) -> Message:
    address = ME if name == "me" else OTHER
    messages: dict[Rumor, Message] = {
        Rumor.ALIVE: Alive(name, incarnation, address, b""),
        Rumor.SUSPECT: Suspect(name, incarnation, "y"),
        Rumor.DEAD: Dead(name, incarnation, "y"),
        Rumor.LEFT: Left(name, incarnation),
    }
    return messages[rumor]


@pytest.mark.parametrize(("subject", "rumor", "order"), ALL_CELLS)
def test_core_applies_every_cell(subject: Subject, rumor: Rumor, order: Order) -> None:
    core, name = core_holding(subject)
    before = core.member(name)
    incarnation = HELD - 1 + order.value
    outputs = core.receive(OTHER, encode(rumor_message(rumor, name, incarnation)), 1.0)
    events = [o for o in outputs if not hasattr(o, "payload")]
    after = core.member(name)
    action = PRECEDENCE[(subject, rumor)][order]

    if action in (Action.IGNORE, Action.REFUTE_IF_CHANGED):  # same address and meta
        assert after == before
        assert events == []
        return
    assert after is not None
    if action is Action.REFUTE:
        assert core.incarnation == max(HELD, incarnation) + 1
        assert events == [SelfRefuted(core.incarnation)]
        assert after.state is MemberState.ALIVE
        return
    expected_event: type[object] | None
    expected_state, expected_event = {
        Action.BECOME_ALIVE: (MemberState.ALIVE, None),
        Action.BECOME_SUSPECT: (MemberState.SUSPECT, MemberSuspected),
        Action.CONFIRM: (MemberState.SUSPECT, None),
        Action.BECOME_DEAD: (MemberState.DEAD, MemberFailed),
        Action.BECOME_LEFT: (MemberState.LEFT, MemberLeft),
    }[action]
    assert after.state is expected_state
    assert after.incarnation == incarnation
    if action is Action.BECOME_ALIVE:
        expected_event = {
            Subject.UNKNOWN: MemberJoined,
            Subject.LEFT: MemberJoined,
            Subject.SUSPECT: MemberRecovered,
            Subject.DEAD: MemberRecovered,
            Subject.ALIVE: None,  # newer incarnation, same address and meta: silent
        }[subject]
    assert [type(e) for e in events] == ([expected_event] if expected_event else [])


def test_alive_about_us_at_our_incarnation_with_other_meta_is_refuted() -> None:
    core, _ = core_holding(Subject.SELF)
    outputs = core.receive(OTHER, encode(Alive("me", HELD, ME, b"old run")), 1.0)
    assert SelfRefuted(HELD + 1) in outputs


def test_alive_with_newer_incarnation_and_new_meta_is_an_update() -> None:
    core, _ = core_holding(Subject.ALIVE)
    outputs = core.receive(OTHER, encode(Alive("m", HELD + 1, OTHER, b"v2")), 1.0)
    updated = [o for o in outputs if isinstance(o, MemberUpdated)]
    assert len(updated) == 1 and updated[0].member.meta == b"v2"


####################################################################################
# A newer suspicion is a new suspicion
####################################################################################


def run_until(core: Membership, until: float) -> list[object]:
    """Tick the core at each of its deadlines up to `until`; the events it emitted."""
    events: list[object] = []
    while (deadline := core.next_deadline()) is not None and deadline <= until:
        events += [o for o in core.tick(deadline) if not hasattr(o, "payload")]
    events += [o for o in core.tick(until) if not hasattr(o, "payload")]
    return events


def test_a_suspect_at_a_newer_incarnation_gets_its_own_full_timer() -> None:
    """The start storm's false death: we suspect m at 4; m refutes (alive at 5, which we
    miss) and is accused again at 5. The old timer must not declare m dead at 5, which
    would beat m's own alive at 5 in every other view: the new accusation gets its own
    window, in which m's refutation (alive at 6) still saves it."""
    length = first_suspicion_length(CONFIG)
    core = Membership(CONFIG, "me", ME, random.Random(1), 0.0)
    core.receive(OTHER, encode(Alive("m", 4, OTHER, b"")), 0.0)
    core.receive(OTHER, encode(Suspect("m", 4, "x")), 0.0)
    assert not any(isinstance(e, MemberFailed) for e in run_until(core, length / 2))
    outputs = core.receive(OTHER, encode(Suspect("m", 5, "y")), length / 2)
    assert [type(o) for o in outputs if not hasattr(o, "payload")] == [MemberSuspected]
    # Past the old suspicion's end: still suspect, at 5.
    events = run_until(core, length + (length / 4))
    member = core.member("m")
    assert member is not None and member.state is MemberState.SUSPECT
    assert member.incarnation == 5 and not any(isinstance(e, MemberFailed) for e in events)
    core.receive(OTHER, encode(Alive("m", 6, OTHER, b"")), length + (length / 4))
    member = core.member("m")
    assert member is not None and member.state is MemberState.ALIVE


def test_the_old_timer_no_longer_fires_after_a_newer_suspicion() -> None:
    """Without the new accusation's refutation, m is declared dead when the new
    suspicion runs out, not when the old one would have."""
    core = Membership(CONFIG, "me", ME, random.Random(1), 0.0)
    core.receive(OTHER, encode(Alive("m", 4, OTHER, b"")), 0.0)
    length = first_suspicion_length(CONFIG)
    core.receive(OTHER, encode(Suspect("m", 4, "x")), 0.0)
    run_until(core, length / 2)
    core.receive(OTHER, encode(Suspect("m", 5, "y")), length / 2)
    member = core.member("m")
    assert member is not None and member.state is MemberState.SUSPECT
    dead_at = None
    now = length / 2
    while dead_at is None and now < 600.0:
        deadline = core.next_deadline()
        assert deadline is not None
        now = deadline
        if any(isinstance(o, MemberFailed) for o in core.tick(now)):
            dead_at = now
    assert dead_at is not None
    # The new suspicion started halfway through the old one and, with one accuser,
    # lasts as long: it ends half a suspicion later than the old timer would have.
    assert dead_at >= length / 2 + length - 1e-6
    dead = core.member("m")
    assert dead is not None and dead.incarnation == 5


def first_suspicion_length(config: SwimConfig) -> float:
    """How long a lone accusation about m lasts in a core that holds m only."""
    core = Membership(config, "me", ME, random.Random(1), 0.0)
    core.receive(OTHER, encode(Alive("m", 4, OTHER, b"")), 0.0)
    core.receive(OTHER, encode(Suspect("m", 4, "x")), 0.0)
    now = 0.0
    while True:
        deadline = core.next_deadline()
        assert deadline is not None
        now = deadline
        if any(isinstance(o, MemberFailed) for o in core.tick(now)):
            return now
