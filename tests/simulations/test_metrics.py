"""`Metrics`: the measures rebuilt from the events, checked against a stand-in simulator.

The simulator here is a few lists: which node is up, what it has sent, which paths are
cut. Each test drives `on_status` and `on_event` as the engine would and reads the
measures back; a Hypothesis test checks the O(1) count of wrong beliefs against the
count by brute force after any sequence of changes.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulations._engine import NodeStatus
from simulations._metrics import Metrics, _max, _mean
from swim import (
    Member,
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberState,
    MemberSuspected,
    MemberUpdated,
    SelfRefuted,
)

UP, DOWN, SLOW = NodeStatus.UP, NodeStatus.DOWN, NodeStatus.SLOW
PAUSED, LEAVING = NodeStatus.PAUSED, NodeStatus.LEAVING
EVENT_OF = {
    MemberState.ALIVE: MemberJoined,
    MemberState.SUSPECT: MemberSuspected,
    MemberState.DEAD: MemberFailed,
    MemberState.LEFT: MemberLeft,
}


class Network:
    def __init__(self) -> None:
        self.cut: set[tuple[int, int]] = set()

    def reachable(self, src: int, dst: int) -> bool:
        return (src, dst) not in self.cut


class Sim:
    """What `Metrics` reads of a `Simulator`."""

    def __init__(self, nodes: int) -> None:
        self.names = [f"m{i}" for i in range(nodes)]
        self.name_index = {name: i for i, name in enumerate(self.names)}
        self.statuses = [DOWN] * nodes
        self.incarnations = [0] * nodes
        self.network = Network()
        self.sent_messages = [0] * nodes
        self.sent_bytes = [0] * nodes
        self.sealed_bytes = [0] * nodes
        self.stopped = 0

    def status(self, node: int) -> NodeStatus:
        return self.statuses[node]

    def start_incarnation(self, node: int) -> int:
        return self.incarnations[node]

    def stop(self) -> None:
        self.stopped += 1


class World:
    def __init__(self, nodes: int, *, up: bool = True) -> None:
        self.sim = Sim(nodes)
        self.metrics = Metrics(self.sim, capacity=nodes)
        if up:
            for node in range(nodes):
                self.set(0.0, node, UP)

    def set(self, now: float, node: int, status: NodeStatus) -> None:
        old = self.sim.statuses[node]
        self.sim.statuses[node] = status
        self.metrics.on_status(now, node, old, status)

    def see(
        self, now: float, observer: int, subject: int, state: MemberState,
        incarnation: int = 0, meta: bytes = b"", event: type | None = None,
    ) -> None:  # fmt: skip
        member = Member(self.sim.names[subject], ("10.0.0.1", 7946), state, incarnation, meta)
        self.metrics.on_event(now, observer, (event or EVENT_OF[state])(member))

    def all_see(self, now: float, subject: int, state: MemberState, **kw: Any) -> None:
        for observer in range(len(self.sim.names)):
            if observer != subject:
                self.see(now, observer, subject, state, **kw)


def brute_force(world: World) -> tuple[int, int]:
    """(wrong beliefs, suspicions held) over the member observers, by definition."""
    m = world.metrics
    n = len(world.sim.names)
    members = [i for i in range(n) if world.sim.statuses[i].is_member]
    wrong = suspects = 0
    for i in members:
        for j in range(n):
            if j == i:
                continue
            belief = m.view_of(i, j)
            if j in members:
                wrong += belief != MemberState.ALIVE + 1
            else:
                wrong += belief in (MemberState.ALIVE + 1, MemberState.SUSPECT + 1)
            suspects += belief == MemberState.SUSPECT + 1
    return wrong, suspects


####################################################################################
# Views and the count of wrong beliefs


def test_members_that_know_nobody_are_all_wrong_until_they_see_each_other() -> None:
    world = World(3)
    assert world.metrics.wrong == 6 and not world.metrics.converged
    for subject in range(3):
        world.all_see(1.0, subject, MemberState.ALIVE)
    assert world.metrics.wrong == 0 and world.metrics.converged
    assert world.metrics.alive_count(0) == 2
    assert world.metrics.holds(0, 1) and world.metrics.view_of(0, 1) == 1


def test_a_crash_makes_live_beliefs_stale_until_they_are_dropped() -> None:
    world = World(3)
    world.metrics.assume_converged()
    assert world.metrics.wrong == 0
    world.set(5.0, 2, DOWN)
    assert world.metrics.wrong == 2  # 0 and 1 still hold 2
    world.see(6.0, 0, 2, MemberState.SUSPECT)
    assert world.metrics.wrong == 2  # a suspect is still held
    world.see(7.0, 0, 2, MemberState.DEAD)
    world.see(7.0, 1, 2, MemberState.LEFT)
    assert world.metrics.wrong == 0


def test_a_restarted_node_starts_with_an_empty_view() -> None:
    world = World(2)
    world.metrics.assume_converged()
    world.set(1.0, 1, DOWN)
    world.set(2.0, 1, UP)
    assert world.metrics.view_of(1, 0) == 0
    assert world.metrics.wrong == 1  # 1 does not know 0 yet; 0 still sees 1 alive
    world.see(3.0, 1, 0, MemberState.ALIVE)
    assert world.metrics.converged


def test_events_about_oneself_and_strangers_change_no_view() -> None:
    world = World(2)
    world.see(1.0, 0, 0, MemberState.DEAD)
    member = Member("stranger", ("10.9.9.9", 1), MemberState.ALIVE, 0)
    world.metrics.on_event(1.0, 0, MemberJoined(member))
    assert world.metrics.view_of(0, 0) == 0 and world.metrics.wrong == 2


@st.composite
def histories(draw: st.DrawFn) -> tuple[int, list[tuple[Any, ...]]]:
    nodes = draw(st.integers(2, 5))
    node = st.integers(0, nodes - 1)
    step = st.one_of(
        st.tuples(st.just("status"), node, st.sampled_from([UP, DOWN, SLOW, PAUSED, LEAVING])),
        st.tuples(st.just("event"), node, node, st.sampled_from(list(EVENT_OF))),
        st.tuples(st.just("converged")),
    )
    return nodes, draw(st.lists(step, max_size=40))


@given(histories())
def test_the_wrong_count_is_the_brute_force_count_after_any_history(
    history: tuple[int, list[tuple[Any, ...]]],
) -> None:
    nodes, steps = history
    world = World(nodes)
    for now, step in enumerate(steps):
        if step[0] == "status":
            world.set(float(now), step[1], step[2])
        elif step[0] == "event":
            if world.sim.statuses[step[1]] != DOWN:  # a down node emits nothing
                world.see(float(now), step[1], step[2], step[3])
        else:
            world.metrics.assume_converged()
        world.metrics.sample(float(now))
        wrong, suspects = brute_force(world)
        assert world.metrics.wrong == wrong
        assert world.metrics.samples[-1].suspects == suspects
        assert world.metrics.samples[-1].members == sum(s.is_member for s in world.sim.statuses)


####################################################################################
# Detections of real failures


def test_a_crash_is_timed_to_first_and_to_every_detection() -> None:
    world = World(3)
    world.metrics.assume_converged()
    world.set(10.0, 2, DOWN)
    (crash,) = world.metrics.detections
    assert (crash.kind, crash.at, crash.observers, crash.pending) == ("crash", 10.0, 2, {0, 1})
    world.see(11.0, 0, 2, MemberState.SUSPECT)
    world.see(12.0, 0, 2, MemberState.DEAD)
    assert (crash.first_suspected, crash.first_detected, crash.outcome) == (11.0, 12.0, "open")
    world.see(14.0, 1, 2, MemberState.DEAD)
    assert (crash.all_detected, crash.outcome) == (14.0, "detected")
    row = crash.as_dict(probe_interval=0.5)
    assert row["first_suspected_after"] == 1.0 and row["first_detected_after"] == 2.0
    assert row["all_detected_after"] == 4.0 and row["all_detected_periods"] == 8.0
    assert row["dissemination_after_first"] == 2.0


@pytest.mark.parametrize(
    ("status", "kind"), [(DOWN, "crash"), (PAUSED, "pause"), (LEAVING, "leave")]
)
def test_each_way_out_is_its_own_kind(status: NodeStatus, kind: str) -> None:
    world = World(3)
    world.metrics.assume_converged()
    world.set(1.0, 0, status)
    assert [d.kind for d in world.metrics.detections] == [kind]


def test_a_leave_is_detected_by_the_left_events() -> None:
    world = World(3)
    world.metrics.assume_converged()
    world.set(1.0, 0, LEAVING)
    world.all_see(2.0, 0, MemberState.LEFT)
    (leave,) = world.metrics.detections
    assert (leave.first_detected, leave.all_detected, leave.outcome) == (2.0, 2.0, "detected")


def test_a_node_back_before_everyone_noticed_has_returned() -> None:
    world = World(3)
    world.metrics.assume_converged()
    world.set(1.0, 2, PAUSED)
    world.see(2.0, 0, 2, MemberState.DEAD)
    world.set(3.0, 2, UP)
    (pause,) = world.metrics.detections
    assert pause.outcome == "returned" and pause.all_detected is None


def test_an_observer_that_goes_down_no_longer_has_to_notice() -> None:
    world = World(3)
    world.metrics.assume_converged()
    world.set(1.0, 2, DOWN)
    world.see(2.0, 0, 2, MemberState.DEAD)
    world.set(3.0, 1, DOWN)
    first = world.metrics.detections[0]
    assert (first.outcome, first.all_detected) == ("detected", 3.0)


def test_a_node_nobody_held_is_detected_at_once() -> None:
    world = World(2)  # nobody knows anybody
    world.set(4.0, 1, DOWN)
    (crash,) = world.metrics.detections
    assert (crash.observers, crash.outcome, crash.all_detected) == (0, "detected", 4.0)


####################################################################################
# False positives


def test_a_healthy_member_declared_dead_is_one_episode_and_each_declaration_counts() -> None:
    world = World(3)
    world.metrics.assume_converged()
    world.see(1.0, 0, 2, MemberState.DEAD, incarnation=0)
    world.see(2.0, 1, 2, MemberState.DEAD, incarnation=0)
    m = world.metrics
    assert (m.false_episodes, m.false_declarations, m.true_declarations) == (1, 2, 0)
    world.see(3.0, 0, 1, MemberState.SUSPECT)
    assert m.false_suspicions == 1
    world.see(3.5, 2, 1, MemberState.SUSPECT)  # the same (node, incarnation): once
    assert m.false_suspicions == 1


def test_a_slow_member_declared_dead_is_counted_apart() -> None:
    world = World(3)
    world.set(0.0, 2, SLOW)
    world.see(1.0, 0, 2, MemberState.DEAD)
    assert (world.metrics.false_episodes_slow, world.metrics.false_episodes) == (1, 0)
    assert world.metrics.false_declarations == 1


def test_an_accusation_across_a_partition_is_neither_true_nor_false() -> None:
    world = World(3)
    world.sim.network.cut.add((2, 0))  # one way is enough
    world.see(1.0, 0, 2, MemberState.SUSPECT)
    world.sim.network.cut.clear()
    world.see(5.0, 0, 2, MemberState.DEAD)  # the suspicion's cause sticks
    m = world.metrics
    assert (m.partition_episodes, m.false_episodes, m.false_declarations) == (1, 0, 0)
    assert (m.false_suspicions, m.true_declarations) == (0, 0)


@pytest.mark.parametrize("why", ["down", "old incarnation"])
def test_a_down_node_or_a_past_life_is_a_true_declaration(why: str) -> None:
    world = World(3)
    if why == "down":
        world.set(1.0, 2, DOWN)
    else:
        world.sim.incarnations[2] = 5
    world.see(2.0, 0, 2, MemberState.DEAD, incarnation=4)
    m = world.metrics
    assert (m.true_declarations, m.false_episodes, m.false_declarations) == (1, 0, 0)


def test_a_suspicion_of_a_healthy_member_stays_false_if_it_then_crashes() -> None:
    world = World(3)
    world.see(1.0, 0, 2, MemberState.SUSPECT)
    world.set(2.0, 2, DOWN)
    world.see(3.0, 0, 2, MemberState.DEAD)
    assert world.metrics.false_episodes == 1
    assert world.metrics.detections[0].first_detected == 3.0  # still times the crash


def test_only_the_window_is_counted() -> None:
    world = World(3)
    world.see(1.0, 0, 2, MemberState.DEAD, incarnation=1)
    world.metrics.on_event(1.0, 2, SelfRefuted(2))
    assert (world.metrics.false_episodes, world.metrics.refutes) == (1, 1)
    world.metrics.open_window(10.0)
    assert (world.metrics.false_episodes, world.metrics.refutes) == (0, 0)
    world.metrics.close_window(20.0)
    world.see(21.0, 0, 1, MemberState.DEAD, incarnation=1)
    world.see(21.0, 0, 1, MemberState.SUSPECT, incarnation=2)
    m = world.metrics
    assert (m.false_episodes, m.false_declarations, m.false_suspicions) == (0, 0, 0)


####################################################################################
# Updates, convergence and the summary


def test_an_update_is_timed_until_every_other_member_has_it() -> None:
    world = World(3)
    world.metrics.note_update(1.0, 0, b"v2")
    (update,) = world.metrics.updates
    assert update.pending == {1, 2}
    world.see(2.0, 1, 0, MemberState.ALIVE, meta=b"v1", event=MemberUpdated)  # an older one
    world.see(2.5, 1, 0, MemberState.ALIVE, meta=b"v2", event=MemberUpdated)
    assert update.outcome == "open"
    world.see(4.0, 2, 0, MemberState.ALIVE, meta=b"v2", event=MemberUpdated)
    assert (update.outcome, update.all_seen) == ("seen", 4.0)
    assert update.as_dict(probe_interval=0.5)["all_seen_periods"] == 6.0


def test_an_update_whose_publisher_goes_down_is_not_measurable() -> None:
    world = World(3)
    world.metrics.note_update(1.0, 0, b"v2")
    world.set(2.0, 0, DOWN)
    assert world.metrics.updates[0].outcome == "publisher down"
    world.metrics.note_update(3.0, 1, b"x")
    world.set(4.0, 2, DOWN)  # the last one that had to see it
    assert world.metrics.updates[1].outcome == "seen"


def test_convergence_is_timed_and_can_stop_the_run() -> None:
    world = World(2)
    world.metrics.expect_convergence(1.0, "heal", stop=True)
    (record,) = world.metrics.convergences
    assert record.converged is None and world.sim.stopped == 0
    world.see(2.0, 0, 1, MemberState.ALIVE)
    assert record.converged is None
    world.see(3.0, 1, 0, MemberState.ALIVE)
    assert record.as_dict() == {"label": "heal", "at": 1.0, "converged_after": 2.0}
    assert world.sim.stopped == 1
    world.metrics.expect_convergence(5.0, "already")
    assert world.metrics.convergences[1].converged == 5.0 and world.sim.stopped == 1


def test_rates_are_per_member_second_within_the_window() -> None:
    world = World(2)
    world.sim.sent_messages[:] = [100, 100]  # before the window: not counted
    world.metrics.open_window(10.0)
    world.sim.sent_messages[:] = [130, 110]
    world.sim.sent_bytes[:] = [400, 0]
    world.set(15.0, 1, DOWN)  # 2 members for 5 s, then 1 for 5 s: 15 member-seconds
    world.metrics.close_window(20.0)
    world.sim.sent_messages[:] = [999, 999]  # after the window: not counted
    summary = world.metrics.summary(30.0, probe_interval=1.0)
    assert summary["window_seconds"] == 10.0
    assert summary["member_hours"] == pytest.approx(15.0 / 3600)
    assert summary["messages"] == 40 and summary["bytes"] == 400
    assert summary["messages_per_member_second"] == pytest.approx(40 / 15)
    assert summary["sealed_bytes"] is None and summary["sealed_bytes_per_member_second"] is None
    assert summary["members_end"] == 1


def test_the_summary_sorts_crashes_by_outcome() -> None:
    world = World(4)
    world.metrics.assume_converged()
    world.set(1.0, 1, DOWN)
    world.all_see(3.0, 1, MemberState.DEAD)  # detected: 2 s
    world.set(4.0, 2, DOWN)
    world.set(5.0, 2, UP)  # returned
    world.set(6.0, 3, DOWN)  # still open
    world.set(7.0, 2, PAUSED)  # a pause: not a crash (0 still has to notice 3)
    detection = world.metrics.summary(10.0, probe_interval=0.5)["detection"]
    assert detection["crashes"] == 3
    assert detection["first_detected_mean"] == 2.0 and detection["all_detected_periods_mean"] == 4.0
    assert (detection["restarted_first"], detection["still_open"], detection["undetected"]) == (
        1,
        1,
        2,
    )


def test_means_skip_missing_values() -> None:
    assert _mean([1.0, None, math.nan, 3.0]) == 2.0 and _mean([None]) is None
    assert _max([None, 2.0, 1.0]) == 2.0 and _max([]) is None
