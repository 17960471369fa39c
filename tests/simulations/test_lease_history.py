"""`LeaseHistory`: the ground truth of a lease run and the invariants I1 to I4 over it."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.leases import TaskSpec
from populi_p2p.leases._entry import TaskPhase
from populi_p2p.leases.grants import Ended, GrantRecord
from simulations._lease_history import EXAMPLES_MAX, INVARIANTS, Execution, LeaseHistory
from tests.leases.helpers import spec

REPLICAS = ("a", "b", "c")
TID = "t" * 64


@attrs.frozen
class Entry:
    """What `check_end` reads of a table's entry."""

    phase: TaskPhase
    epoch: int
    done: bool = True

    def finished(self) -> bool:
        return self.done


class Table:
    def __init__(self, entries: dict[str, Entry]) -> None:
        self.entries = entries

    def get(self, task_id: str) -> Entry | None:
        return self.entries.get(task_id)


def history(*tids: str) -> LeaseHistory:
    h = LeaseHistory()
    for number, tid in enumerate(tids or (TID,)):
        h.submitted(tid, number, now=1.0, duration=5.0)
    return h


def record(ended: Ended, *, failures: int = 0, tid: str = TID) -> GrantRecord:
    task: TaskSpec = attrs.evolve(spec(0, retry_limit=1), replicas=REPLICAS)
    return GrantRecord(tid, task, b"sig", epoch=1, owner="a", ended=ended, failures=failures)


####################################################################################
# I1 and I2, as the executions happen


def test_back_to_back_executions_break_nothing() -> None:
    h = history()
    first = h.started(TID, 1, "a", 2.0)
    h.ended(first, 3.0, "stopped")
    h.ended(h.started(TID, 2, "b", 3.0), 4.0, "exited")
    assert h.counts() == dict.fromkeys(INVARIANTS, 0)
    assert [(r.node, r.start, r.end, r.how) for r in h.executions[TID]] == [
        ("a", 2.0, 3.0, "stopped"),
        ("b", 3.0, 4.0, "exited"),
    ]


def test_a_start_while_another_execution_runs_is_i1() -> None:
    h = history()
    h.started(TID, 1, "a", 2.0)
    h.started(TID, 2, "b", 2.5)
    assert h.counts()["I1"] == 1
    (text,) = h.violations["I1"]
    assert "started on b at epoch 2" in text and "while a runs epoch 1" in text


def test_an_end_is_recorded_once() -> None:
    h = history()
    run = h.started(TID, 1, "a", 2.0)
    h.ended(run, 3.0, "exited")
    h.ended(run, 9.0, "crashed")
    assert (run.end, run.how) == (3.0, "exited")
    assert h.tasks[TID].crashed is None  # the late "crashed" changed nothing


def test_a_start_after_finality_is_i2() -> None:
    h = history()
    h.ended(h.started(TID, 1, "a", 2.0), 3.0, "exited")
    disks = {n: {TID: record(Ended.SUCCEEDED)} for n in ("a", "b")}
    h.persisted(record(Ended.SUCCEEDED), disks, now=3.5)
    assert h.tasks[TID].final_at == 3.5
    h.started(TID, 2, "c", 4.0)
    assert h.counts() == {"I1": 0, "I2": 1, "I3": 0, "I4": 0}
    assert "after it was final at t=3.500" in h.violations["I2"][0]


@pytest.mark.parametrize(
    ("held", "final"),
    [
        ({"a": Ended.SUCCEEDED}, False),  # one of three: no majority
        ({"a": Ended.SUCCEEDED, "b": Ended.CANCELLED}, True),
        ({"a": Ended.CANCELLED, "c": Ended.CANCELLED}, True),
        ({"a": Ended.SUCCEEDED, "b": Ended.RELEASED}, False),
        ({"a": Ended.SUCCEEDED, "b": Ended.NO}, False),
        ({"a": Ended.SUCCEEDED, "zz": Ended.SUCCEEDED}, False),  # not a replica
    ],
)
def test_finality_needs_a_majority_of_replicas_holding_success_or_cancel(
    held: dict[str, Ended], final: bool
) -> None:
    h = history()
    disks = {node: {TID: record(ended)} for node, ended in held.items()}
    h.persisted(record(Ended.SUCCEEDED), disks, now=7.0)
    assert h.tasks[TID].final_at == (7.0 if final else None)


def test_failed_for_good_is_not_final_in_the_sense_of_i2() -> None:
    """A task failed past its retries runs no more, but I2 is about success or cancel."""
    h = history()
    failed = record(Ended.FAILED, failures=5)
    assert failed.final
    h.persisted(failed, {n: {TID: failed} for n in REPLICAS}, now=7.0)
    assert h.tasks[TID].final_at is None


def test_finality_is_kept_from_its_first_moment() -> None:
    h = history()
    disks = {n: {TID: record(Ended.SUCCEEDED)} for n in REPLICAS}
    h.persisted(record(Ended.SUCCEEDED), disks, now=7.0)
    h.persisted(record(Ended.SUCCEEDED), disks, now=9.0)
    assert h.tasks[TID].final_at == 7.0
    h.persisted(record(Ended.SUCCEEDED, tid="other"), disks, now=9.0)  # unknown: ignored
    assert "other" not in h.tasks


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 10)), min_size=1, max_size=8))
def test_i1_counts_each_execution_running_at_a_start(runs: list[tuple[int, int]]) -> None:
    """Executions [start, start+length) in time order (an end at t before a start at
    t): each start counts one I1 per execution still running then."""
    h = history()
    ends = [(s + n, 0, i) for i, (s, n) in enumerate(runs)]
    starts = [(s, 1, i) for i, (s, _) in enumerate(runs)]
    live: dict[int, Execution] = {}
    expected = 0
    for t, is_start, i in sorted(ends + starts):
        if is_start:
            expected += len(live)
            live[i] = h.started(TID, i + 1, f"n{i}", float(t))
        else:
            h.ended(live.pop(i), float(t), "exited")
    assert h.counts()["I1"] == expected
    assert h.summary()["executions"] == len(runs)


####################################################################################
# Acknowledgements, crashes and failovers


def test_the_first_acknowledgement_counts() -> None:
    h = history()
    h.acknowledged(TID, REPLICAS, 2.0)
    h.acknowledged(TID, ("x", "y"), 3.0)
    h.acknowledged("unknown", REPLICAS, 3.0)
    assert (h.tasks[TID].acked, h.tasks[TID].replicas) == (2.0, REPLICAS)
    assert "unknown" not in h.tasks


def test_a_crashed_owner_is_timed_until_the_next_start() -> None:
    h = history()
    h.ended(h.started(TID, 1, "a", 2.0), 5.0, "crashed")
    assert h.tasks[TID].crashed == 5.0
    assert h.summary()["crashed_owners_not_failed_over"] == 1
    h.ended(h.started(TID, 2, "b", 6.5), 8.0, "exited")
    h.started(TID, 3, "c", 9.0)  # no crash before it: no failover
    assert h.failovers == [1.5]
    summary = h.summary()
    assert summary["failovers"] == 1 and summary["failover_mean"] == 1.5
    assert summary["failover_max"] == 1.5 and summary["failover_times"] == [1.5]
    assert summary["crashed_owners_not_failed_over"] == 0
    assert summary["execution_ends"] == {"crashed": 1, "exited": 1, "running": 1}


def test_a_start_of_a_task_never_submitted_is_not_recorded() -> None:
    h = history()
    run = h.started("stranger", 1, "a", 2.0)
    assert run.task == "stranger" and "stranger" not in h.executions


####################################################################################
# I3 and I4 at the end


def test_the_end_is_clean_when_every_live_table_holds_the_same_finished_entry() -> None:
    h = history()
    h.acknowledged(TID, REPLICAS, 2.0)
    done = Entry(TaskPhase.SUCCEEDED, 2)
    h.check_end({n: Table({TID: done}) for n in REPLICAS}, up=REPLICAS)
    assert h.counts() == dict.fromkeys(INVARIANTS, 0)


def test_tables_that_differ_are_i4_and_an_unfinished_one_is_i3() -> None:
    h = history()
    h.acknowledged(TID, REPLICAS, 2.0)
    tables = {
        "a": Table({TID: Entry(TaskPhase.SUCCEEDED, 2)}),
        "b": Table({TID: Entry(TaskPhase.RUNNING, 2, done=False)}),
        "c": Table({}),
    }
    h.check_end(tables, up=REPLICAS)
    assert h.counts() == {"I1": 0, "I2": 0, "I3": 1, "I4": 1}
    assert "['-', 'RUNNING@2', 'SUCCEEDED@2']" in h.violations["I4"][0]


def test_the_same_unfinished_entry_everywhere_is_i3_alone() -> None:
    h = history()
    h.acknowledged(TID, REPLICAS, 2.0)
    running = Entry(TaskPhase.RUNNING, 1, done=False)
    h.check_end({n: Table({TID: running}) for n in REPLICAS}, up=REPLICAS)
    assert h.counts() == {"I1": 0, "I2": 0, "I3": 1, "I4": 0}


def test_unacknowledged_and_stranded_tasks_are_not_checked() -> None:
    stranded, unacked = "s" * 64, "u" * 64
    h = history(TID, stranded, unacked)
    h.acknowledged(TID, REPLICAS, 2.0)
    h.acknowledged(stranded, ("x", "y", "z"), 2.0)  # only x is up at the end
    empty = {n: Table({}) for n in REPLICAS}
    h.check_end(empty, up=("a", "b", "x"))
    assert h.counts()["I3"] == 1 and TID[:12] in h.violations["I3"][0]
    assert h.stranded(up=("a", "b", "x")) == 1
    assert h.stranded(up=("x", "y")) == 1  # now the first task's majority is down
    assert h.stranded(up=(*REPLICAS, "x", "y")) == 0


def test_the_summary_counts_and_keeps_a_few_examples() -> None:
    h = history()
    h.started(TID, 1, "a", 1.5)
    for i in range(EXAMPLES_MAX + 3):
        h.started(TID, i + 2, "b", 2.0 + i)
    summary = h.summary()
    # Each start sees every earlier one still running: 1 + 2 + ... + 8 overlaps.
    overlaps = sum(range(1, EXAMPLES_MAX + 4))
    assert summary["invariants"]["I1"] == overlaps == summary["violations"]
    assert len(summary["violation_examples"]) == EXAMPLES_MAX
    assert summary["starts_per_task"] == EXAMPLES_MAX + 4
    assert summary["first_start_mean"] == pytest.approx(1.5 - 1.0)
    assert summary["acknowledged"] == 0


def test_an_empty_history_summarizes_to_nothing() -> None:
    summary = LeaseHistory().summary()
    assert summary["starts_per_task"] is None and summary["first_start_mean"] is None
    assert summary["failover_max"] is None and summary["violations"] == 0
