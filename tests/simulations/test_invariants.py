"""`simulations._invariants.IncarnationCheck`: incarnations never go down, as the node
sees itself, as others see it, or across a restart (a fake simulator, events fed in)."""

from __future__ import annotations

import os

import pytest

from simulations._engine import InvariantViolation, NodeStatus
from simulations._invariants import IncarnationCheck
from swim import Member, MemberJoined, MemberState, MemberUpdated, SelfRefuted

# A stand-in simulator cannot pass for the compiled `Simulator` (mypyc checks the type):
# on the compiled build the real runs in test_runner*.py exercise the check instead.
pytestmark = pytest.mark.skipif(
    bool(os.environ.get("POPULI_MYPYC_BUILD")),
    reason="a fake simulator cannot stand in for the compiled one",
)


class FakeSim:
    def __init__(self, *names: str) -> None:
        self.names = list(names)
        self.name_index = {name: i for i, name in enumerate(names)}
        self.starts: dict[int, int] = {}

    def start_incarnation(self, node: int) -> int:
        return self.starts.get(node, 0)


class FakeCore:
    def __init__(self, incarnation: int) -> None:
        self.incarnation = incarnation


def member(name: str, incarnation: int) -> Member:
    return Member(name, ("h", 1), MemberState.ALIVE, incarnation, b"", 0.0)


def check(*names: str) -> tuple[IncarnationCheck, FakeSim]:
    sim = FakeSim(*names)
    return IncarnationCheck(sim), sim  # type: ignore[arg-type]


def test_rising_incarnations_pass_and_are_counted() -> None:
    c, _ = check("a", "b")
    c.on_event(1.0, 0, MemberJoined(member("b", 0)))
    c.on_event(2.0, 0, MemberUpdated(member("b", 3)))
    c.on_event(2.0, 0, SelfRefuted(1))
    c.after_step(2.0, 0, FakeCore(1))  # type: ignore[arg-type]
    c.on_event(2.0, 0, MemberJoined(member("stranger", 0)))  # not simulated: skipped
    assert c.checks == 5


def test_seeing_another_go_down_is_a_violation_naming_both() -> None:
    c, _ = check("a", "b")
    c.on_event(1.0, 0, MemberUpdated(member("b", 3)))
    with pytest.raises(
        InvariantViolation, match=r"t=2\.000000s: a saw b's incarnation go down from 3 to 2"
    ):
        c.on_event(2.0, 0, MemberUpdated(member("b", 2)))


def test_a_refute_that_does_not_rise_is_a_violation() -> None:
    c, _ = check("a")
    c.on_event(1.0, 0, SelfRefuted(2))
    with pytest.raises(InvariantViolation, match="a refuted with incarnation 2 <= 2"):
        c.on_event(2.0, 0, SelfRefuted(2))


def test_a_core_whose_own_incarnation_drops_is_a_violation() -> None:
    c, _ = check("a")
    c.after_step(1.0, 0, FakeCore(4))  # type: ignore[arg-type]
    with pytest.raises(InvariantViolation, match="own incarnation went down from 4 to 3"):
        c.after_step(2.0, 0, FakeCore(3))  # type: ignore[arg-type]


@pytest.mark.parametrize(("start", "ok"), [(5, True), (4, False)])
def test_a_restart_must_come_back_above_its_previous_life(start: int, ok: bool) -> None:
    c, sim = check("a", "b")
    c.after_step(1.0, 0, FakeCore(4))  # type: ignore[arg-type]
    c.on_event(1.0, 0, MemberUpdated(member("b", 9)))
    c.on_status(2.0, 0, NodeStatus.UP, NodeStatus.DOWN)
    sim.starts[0] = start
    if not ok:
        with pytest.raises(InvariantViolation, match="restarted with incarnation 4, not above"):
            c.on_status(3.0, 0, NodeStatus.DOWN, NodeStatus.UP)
        return
    c.on_status(3.0, 0, NodeStatus.DOWN, NodeStatus.UP)
    # A fresh core knows nobody: hearing b at a lower incarnation is no violation.
    c.on_event(4.0, 0, MemberJoined(member("b", 0)))
    c.after_step(4.0, 0, FakeCore(start))  # type: ignore[arg-type]
