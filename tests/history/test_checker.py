"""The history checker on hand-made histories: a clean one passes, and each invariant
catches the history that breaks it (and only that one). The last test runs the real
probe twice at once and checks that the checker sees the overlap."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from .checker import (
    Ack,
    Killed,
    NodeTable,
    ProbeEvent,
    Report,
    Row,
    Submit,
    check,
    load_events,
    runs_from,
)
from .probe import __file__ as PROBE

A = "a" * 32
B = "b" * 32


def ev(task: str, event: str, t: float, pid: int, epoch: int = 1, **kw: object) -> ProbeEvent:
    fields = {"seconds": 2.0, "ppid": 100, **kw}
    return ProbeEvent(task, epoch, event, t, pid, **fields)  # type: ignore[arg-type]


def run(task: str, start: float, pid: int, epoch: int = 1, end: float | None = None,
        **kw: object) -> list[ProbeEvent]:  # fmt: skip
    out = [ev(task, "start", start, pid, epoch, **kw)]
    if end is not None:
        out.append(ev(task, "end", end, pid, epoch, **kw))
    return out


def row(task: str, phase: str = "succeeded", epoch: int = 1, code: int | None = 0) -> Row:
    return Row(task, phase, epoch, code, finished=phase in ("succeeded", "failed", "cancelled"))


def tables(*rows: Row, nodes: tuple[str, ...] = ("n0", "n1", "n2")) -> list[NodeTable]:
    return [NodeTable(n, {r.task: r for r in rows}) for n in nodes]


SUBMITS = [Submit(A, True, 10.0), Submit(B, True, 10.1)]
CLEAN_EVENTS = [*run(A, 10.5, 1001, end=12.5), *run(B, 10.6, 1002, end=12.6)]
CLEAN_ACKS = [Ack(A, "success", 13.0), Ack(B, "success", 13.0)]


def invariants(report: Report) -> dict[str, int]:
    return {k: n for k, n in report.by_invariant().items() if n}


def test_a_clean_history_passes() -> None:
    # A killed daemon whose task died with it (0.3 s), and the task re-run after it.
    killed = Killed("n3", 300, 11.0, {2001: 11.3}, 13.0)
    events = [
        *run(A, 10.2, 2001, ppid=300),  # killed at 11.0 with its daemon: no end line
        *run(A, 11.8, 1001, epoch=2, end=13.8),
        *run(B, 10.6, 1002, end=12.6),
    ]
    acks = [Ack(A, "success", 14.0), Ack(B, "success", 13.0)]
    report = check(events, SUBMITS, acks, tables(row(A, epoch=2), row(B)), [killed])
    assert report.ok, report.lines()
    assert (report.tasks, report.acknowledged, report.runs) == (2, 2, 3)
    assert (report.extra_runs, report.same_epoch_runs, report.overlap_records) == (1, 0, 0)
    assert report.lines()[0].endswith("I1 0, I2 0, I3 0, I4 0, I5 0")


def test_i1_a_run_that_found_the_lock_held() -> None:
    events = [
        *run(A, 10.5, 1001, end=12.5),
        ev(A, "overlap", 11.0, 1003, epoch=2, locked=False),
        *run(A, 11.0, 1003, epoch=2, end=13.0, locked=False),
        *run(B, 10.6, 1002, end=12.6),
    ]
    report = check(events, SUBMITS, CLEAN_ACKS, tables(row(A, epoch=2), row(B)))
    assert invariants(report) == {"I1": 1}
    (v,) = report.violations
    assert v.task == A and "found the lock held" in str(v) and "pid 1001" in str(v)
    assert report.overlap_records == 1 and report.same_epoch_runs == 0


def test_i1_by_times_when_the_earlier_run_held_no_lock() -> None:
    # 1001 and 1003 overlapped (1003 saw the lock held); 1001 died at 11.5, releasing
    # the lock; 1004 took it at 12.0 while 1003, which holds nothing, still ran.
    events = [
        *run(A, 10.5, 1001),
        ev(A, "overlap", 11.0, 1003, locked=False),
        *run(A, 11.0, 1003, end=13.0, locked=False),
        *run(A, 12.0, 1004, end=14.0),
        *run(B, 10.6, 1002, end=12.6),
    ]
    acks = [Ack(A, "success", 14.5), Ack(B, "success", 13.0)]
    report = check(events, SUBMITS, acks, tables(row(A), row(B)))
    assert invariants(report) == {"I1": 2}
    assert "pid 1004" in str(report.violations[1]) and "pid 1003" in str(report.violations[1])
    assert report.same_epoch_runs == 2


def test_i1_a_run_without_an_end_line_is_alive_until_it_is_known_dead() -> None:
    # 1001 wrote no end line; 1003 (no lock either) starts within 1001's planned 2 s.
    unlocked = [*run(A, 10.0, 1001, locked=False), *run(A, 11.5, 1003, epoch=2, locked=False)]
    overlapping = runs_from(unlocked)
    assert overlapping[0].ends_by == 12.0  # start + SECONDS: the latest it could live
    report = check(unlocked, SUBMITS[:1], [], tables(row(A, epoch=2, phase="failed", code=1)))
    assert invariants(report) == {"I1": 1}
    assert "no end line; until 12.000" in str(report.violations[0])
    # Seen gone at 11.2 (its daemon was killed): then 1003 came after it.
    killed = Killed("n3", 100, 11.0, {1001: 11.2}, 13.0)
    assert runs_from(unlocked, [killed])[0].ends_by == 11.2
    report = check(unlocked, SUBMITS[:1], [], tables(row(A, epoch=2, phase="failed", code=1)),
                   [killed])  # fmt: skip
    assert report.ok, report.lines()
    # Or seen gone by the harness's polling, at 11.1 at the latest.
    assert runs_from(unlocked, seen_gone={1001: 11.1})[0].ends_by == 11.1
    assert check(unlocked, SUBMITS[:1], [], tables(row(A, epoch=2, phase="failed", code=1)),
                 seen_gone={1001: 11.1}).ok  # fmt: skip
    # A later run that took the lock proves the earlier lock holder dead.
    locked = [*run(A, 10.0, 1001), *run(A, 11.5, 1003, epoch=2, end=13.5)]
    assert runs_from(locked)[0].ends_by == 11.5


def test_i1_an_overlap_line_without_its_start_line_still_counts() -> None:
    # 1003 was killed between its overlap line and its start line.
    events = [*run(A, 10.0, 1001, end=12.0), ev(A, "overlap", 11.0, 1003, locked=False)]
    report = check(events, SUBMITS[:1], [Ack(A, "success", 12.5)], tables(row(A)))
    assert invariants(report) == {"I1": 1} and report.runs == 2
    assert "run pid 1003 epoch 1" in str(report.violations[0])


def test_i2_a_start_after_the_cancel_or_success_was_acknowledged() -> None:
    events = [*CLEAN_EVENTS, *run(B, 13.5, 1005, epoch=2, end=15.5)]
    acks = [Ack(A, "cancel", 11.0), Ack(A, "success", 12.8), Ack(B, "success", 13.0)]
    cancelled = row(A, "cancelled", code=None)
    report = check(events, SUBMITS, acks, tables(cancelled, row(B, epoch=2)))
    assert invariants(report) == {"I2": 1}
    assert "0.500 s after the success was acknowledged" in str(report.violations[0])
    # The cancel at 11.0 came after A's only start (10.5): nothing for I2 there.
    assert report.violations[0].task == B


def test_i3_acknowledged_tasks_must_end_and_successes_must_come_from_a_run() -> None:
    c = "c" * 32
    d = "d" * 32
    submits = [*SUBMITS, Submit(c, True, 10.2), Submit(d, False, 10.3), Submit(None, False, 10.4)]
    rows = [row(A), row(B, "running", code=None), row(c, epoch=3)]
    report = check(CLEAN_EVENTS, submits, CLEAN_ACKS, tables(*rows))
    assert invariants(report) == {"I3": 2}  # d was never acknowledged: nothing owed
    assert (report.tasks, report.acknowledged, report.never_ran) == (4, 3, 1)  # c
    lines = [str(v) for v in report.violations]
    assert lines[0].startswith(f"I3 task {B[:12]}: not finished on n0: running epoch 1")
    assert "succeeded (exit 0) at epoch 3, but no run of it ended" in lines[1]
    lost = check(CLEAN_EVENTS, SUBMITS, CLEAN_ACKS, tables(row(B)))
    assert [str(v) for v in lost.violations] == [
        f"I3 task {A[:12]}: acknowledged, but in no final table"
    ]


def test_i4_every_node_holds_the_same_final_entry() -> None:
    split = [
        NodeTable("n0", {A: row(A), B: row(B)}),
        NodeTable("n1", {A: row(A, epoch=2), B: row(B)}),
        NodeTable("n2", {A: row(A)}),
    ]
    events = [*CLEAN_EVENTS, *run(A, 13.0, 1009, epoch=2, end=13.5)]
    acks = [Ack(A, "success", 14.0), Ack(B, "success", 13.0)]
    report = check(events, SUBMITS, acks, split)
    by = invariants(report)
    assert by["I4"] == 2
    lines = [str(v) for v in report.violations if v.invariant == "I4"]
    assert lines[0] == (
        f"I4 task {A[:12]}: nodes disagree: succeeded/1/exit 0 on n0, n2; succeeded/2/exit 0 on n1"
    )
    assert "absent on n2" in lines[1]
    assert by == {"I3": 1, "I4": 2}  # B absent on n2 is also unfinished there


def test_i5_task_processes_must_not_outlive_their_daemon() -> None:
    late = Killed("n3", 300, 11.0, {2001: 12.5, 2002: 11.4, 2003: None}, 14.0)
    events = [
        *run(A, 10.2, 2001, ppid=300),
        *run(A, 12.6, 1001, epoch=2, end=14.6),
        *run(B, 10.6, 2004, ppid=300, end=12.6),  # not watched, but its end line shows it
        *run(B, 12.0, 1005, epoch=2, ppid=301, end=12.9),  # another daemon's: not I5's
    ]
    acks = [Ack(A, "success", 15.0), Ack(B, "success", 13.0)]
    report = check(events, SUBMITS, acks, tables(row(A, epoch=2), row(B, epoch=2)), [late])
    lines = [str(v) for v in report.violations]
    assert invariants(report) == {"I1": 1, "I5": 3}, lines
    assert "I5: task pid 2001 of n3 gone 1.50 s after (grace 1.0 s)" in lines
    assert "I5: task pid 2003 of n3 still alive 3.0 s after the kill (grace 1.0 s)" in lines
    assert any(s.startswith(f"I5 task {B[:12]}: run pid 2004") for s in lines)
    assert any(s.startswith(f"I1 task {B[:12]}: run pid 1005") for s in lines)  # 2004 ran on


def test_the_probe_records_a_second_live_run_as_an_overlap(tmp_path: Path) -> None:
    env = {**os.environ, "POPULI_TASK_ID": A, "POPULI_TASK_EPOCH": "1"}
    first = subprocess.Popen([sys.executable, PROBE, str(tmp_path), "30"], env=env)
    try:
        deadline = time.monotonic() + 20
        while not any(e.event == "start" for e in load_events(tmp_path)):
            assert first.poll() is None and time.monotonic() < deadline, "no start line"
            time.sleep(0.02)  # polling the probe's log, with a deadline
        second = {**env, "POPULI_TASK_EPOCH": "2"}
        done = subprocess.run([sys.executable, PROBE, str(tmp_path), "0", "3"], env=second)
        assert done.returncode == 3
    finally:
        first.kill()
        first.wait()
    events = load_events(tmp_path)
    assert [(e.epoch, e.event) for e in events] == [(1, "start"), (2, "overlap"), (2, "start"),
                                                    (2, "end")]  # fmt: skip
    assert events[0].pid == first.pid != events[1].pid == events[-1].pid
    assert events[0].ppid == os.getpid() and events[0].locked and not events[-1].locked
    report = check(events, [Submit(A, True, 0.0)], [], [])
    assert invariants(report) == {"I1": 1, "I3": 1}
