"""Check a history of task runs against populi's one-owner promise, Jepsen style.

The history is what really happened, recorded from outside the daemons (STYLE.md
lesson 21): the probe's lines (`probe.py`: each run's start and end, and an `overlap`
line when a run found another run of its task alive), what the client saw (each
submit and whether it was acknowledged, each cancel or success acknowledged to it),
each surviving node's final task table, and, for each daemon killed with SIGKILL, the
process groups of its tasks and when each was seen gone. The checks are pure functions
of that history; `check` runs them all and returns a `Report`.

Invariants:

* **I1** no two runs of one task are alive at the same time;
* **I2** no run starts after the task's success or cancel was acknowledged to the client;
* **I3** every acknowledged submit ends succeeded, failed or cancelled in every final
  table, and a success is backed by a run of that epoch that ended;
* **I4** every node holds the same final (phase, epoch, exit code) for each task;
* **I5** no task process outlives its daemon by more than `grace` (1 s).

Theory of operation (I1). Two runs overlap iff one starts while the other is alive, so
the probe's lock is the exact witness: a run that cannot take `flock(LOCK_EX)` on its
task's lock file started while another run held it (the kernel drops the lock only
when its holder dies; the probe never closes it). Every `overlap` line is one
violation. Start and end times add what the lock cannot see: a run that itself failed
to lock holds nothing, so a later run can take the lock while it is still alive. A run
has a known end (its `end` line) or else died at some unknown moment; for it
`Run.ends_by` is the *latest* moment it could have been alive, the earliest of: its
planned end (start + SECONDS, after which it would have written `end`), a moment the
harness saw its process gone (`Killed`, `seen_gone`), and, if it held the lock, the
start of the next run that took the lock (which proves it dead by then). Treating a
run as alive until `ends_by` is conservative: an overlap is never missed, and one can
be over-reported only for a run that died unobserved without a later locking run.
Taking the last line's time (its start) instead would miss every overlap with a run
that was killed before writing `end`. (Check once no probe is alive: a run still
sleeping has no end line yet.)

All times are `time.time()` on one machine (probe, harness and client share a clock).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import attrs

__all__ = [
    "INVARIANTS",
    "TERMINAL",
    "Ack",
    "Killed",
    "NodeTable",
    "ProbeEvent",
    "Report",
    "Row",
    "Run",
    "Submit",
    "Violation",
    "check",
    "check_after_ack",
    "check_agreement",
    "check_orphans",
    "check_outcomes",
    "check_overlaps",
    "load_events",
    "runs_from",
]

INVARIANTS: Final = {
    "I1": "no two runs of a task overlap in time",
    "I2": "nothing starts after the task's success or cancel was acknowledged",
    "I3": "every acknowledged submit ends succeeded, failed or cancelled",
    "I4": "every node holds the same final entry for each task",
    "I5": "no task process outlives its daemon by more than the grace",
}
#: Final phases a table row may end in (with `finished` true).
TERMINAL: Final = frozenset({"succeeded", "failed", "cancelled"})
#: How long a task process may outlive its killed daemon (I5).
GRACE_S: Final = 1.0

Event = Literal["start", "end", "overlap"]


####
# The history


@attrs.frozen
class ProbeEvent:
    """One line of a probe log (see `probe.py`)."""

    task: str
    epoch: int
    event: Event
    time: float
    pid: int
    ppid: int = 0
    node: str | None = None
    seconds: float = 0.0
    locked: bool = True

    @classmethod
    def from_json(cls, fields: Mapping[str, Any]) -> ProbeEvent:
        return cls(
            task=str(fields["task"]),
            epoch=int(fields["epoch"]),
            event=fields["event"],
            time=float(fields["time"]),
            pid=int(fields["pid"]),
            ppid=int(fields.get("ppid", 0)),
            node=fields.get("node"),
            seconds=float(fields.get("seconds", 0.0)),
            locked=bool(fields.get("locked", True)),
        )


@attrs.frozen
class Submit:
    """A submit as the client saw it: `task` is None when no id came back at all;
    `acknowledged` is False when the daemon answered with an error (even one naming
    the stored task); `time` is when the call returned."""

    task: str | None
    acknowledged: bool
    time: float


@attrs.frozen
class Ack:
    """A cancel, or a success, acknowledged to the client at `time` (the cancel call
    returned, or a poll first showed the task succeeded)."""

    task: str
    kind: Literal["cancel", "success"]
    time: float


@attrs.frozen
class Row:
    """One task in one node's final table (a row of ``populi-node tasks --json``)."""

    task: str
    phase: str
    epoch: int
    exit_code: int | None
    finished: bool
    owner: str | None = None

    @classmethod
    def from_api(cls, row: Mapping[str, Any]) -> Row:
        code = row.get("exit_code")
        return cls(
            task=str(row["id"]),
            phase=str(row["phase"]),
            epoch=int(row["epoch"]),
            exit_code=None if code is None else int(code),
            finished=bool(row.get("finished", False)),
            owner=row.get("owner"),
        )


@attrs.frozen
class NodeTable:
    """A node's final task table, once the mesh healed."""

    node: str
    rows: Mapping[str, Row]

    @classmethod
    def from_api(cls, node: str, rows: Iterable[Mapping[str, Any]]) -> NodeTable:
        parsed = (Row.from_api(r) for r in rows)
        return cls(node, {r.task: r for r in parsed})


@attrs.frozen
class Killed:
    """A daemon killed with SIGKILL at `killed_at`: its pid, the process groups of the
    tasks it ran then, and when the harness saw each group gone (None: still alive when
    it stopped watching, at `watched_until`)."""

    node: str
    pid: int
    killed_at: float
    gone_at: Mapping[int, float | None]
    watched_until: float


@attrs.frozen
class Run:
    """One run of a task, rebuilt from its probe lines (see the module docstring for
    `ends_by`)."""

    task: str
    epoch: int
    pid: int
    ppid: int
    node: str | None
    start: float
    end: float | None
    ends_by: float
    locked: bool
    overlap_at: float | None

    def describe(self) -> str:
        where = self.node or f"daemon pid {self.ppid}"
        return f"run pid {self.pid} epoch {self.epoch} on {where} at {self.start:.3f}"


@attrs.frozen
class Violation:
    invariant: str
    task: str | None
    message: str

    def __str__(self) -> str:
        task = f" task {self.task[:12]}" if self.task else ""
        return f"{self.invariant}{task}: {self.message}"


@attrs.frozen
class Report:
    """What `check` found: counts, and one readable line per violation."""

    tasks: int
    acknowledged: int
    never_ran: int
    runs: int
    extra_runs: int
    same_epoch_runs: int
    overlap_records: int
    violations: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_invariant(self) -> dict[str, int]:
        counts = dict.fromkeys(INVARIANTS, 0)
        for v in self.violations:
            counts[v.invariant] += 1
        return counts

    def summary(self) -> str:
        counts = ", ".join(f"{k} {n}" for k, n in self.by_invariant().items())
        return (
            f"{self.tasks} tasks ({self.acknowledged} acknowledged, {self.never_ran} of them"
            f" never ran), {self.runs} runs"
            f" ({self.extra_runs} beyond one per task, {self.same_epoch_runs} at an epoch"
            f" already run, {self.overlap_records} found their task's lock held);"
            f" violations: {counts}"
        )

    def lines(self, limit: int | None = None) -> list[str]:
        shown = self.violations if limit is None else self.violations[:limit]
        out = [self.summary(), *(f"  {v}" for v in shown)]
        if len(shown) < len(self.violations):
            out.append(f"  ... and {len(self.violations) - len(shown)} more")
        return out


####
# Rebuilding runs


def load_events(logdir: Path) -> list[ProbeEvent]:
    """Every probe line under `logdir` (``*.log``); a torn or foreign line is skipped."""
    out = []
    for path in sorted(logdir.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                out.append(ProbeEvent.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue
    return sorted(out, key=lambda e: e.time)


def runs_from(
    events: Iterable[ProbeEvent],
    killed: Sequence[Killed] = (),
    seen_gone: Mapping[int, float] | None = None,
) -> list[Run]:
    """The runs of every task, by start time, with `ends_by` as documented above.

    `seen_gone` maps a probe's pid to a moment the harness saw it gone (polling), the
    killed daemons' `gone_at` are added to it; either bounds a run with no end line.
    A run cut short between its `overlap` and `start` lines starts at its overlap."""
    gone: dict[int, float] = dict(seen_gone or {})
    for k in killed:
        for pid, when in k.gone_at.items():
            if when is not None:
                gone[pid] = min(when, gone.get(pid, when))
    by_pid: dict[tuple[str, int], list[ProbeEvent]] = defaultdict(list)
    for e in events:
        by_pid[(e.task, e.pid)].append(e)
    partial: dict[str, list[Run]] = defaultdict(list)
    for (task, pid), lines in by_pid.items():
        start = next((e for e in lines if e.event == "start"), lines[0])
        end = next((e.time for e in lines if e.event == "end"), None)
        overlap = next((e.time for e in lines if e.event == "overlap"), None)
        if start.event == "end":
            continue  # a foreign or torn log: an end with no start
        latest = start.time + start.seconds if end is None else end
        if end is None and pid in gone:
            latest = min(latest, gone[pid])
        run = Run(task, start.epoch, pid, start.ppid, start.node, start.time, end, latest,
                  start.locked, overlap)  # fmt: skip
        partial[task].append(run)
    out: list[Run] = []
    for runs in partial.values():
        runs.sort(key=lambda r: (r.start, r.pid))
        for i, r in enumerate(runs):
            if r.end is None and r.locked:
                later = [s.start for s in runs[i + 1 :] if s.locked]
                if later:
                    r = attrs.evolve(r, ends_by=min(r.ends_by, later[0]))
            out.append(r)
    return sorted(out, key=lambda r: (r.start, r.pid))


def _by_task(runs: Iterable[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        out[r.task].append(r)
    return out


####
# The invariants


def check_overlaps(runs: Sequence[Run]) -> list[Violation]:
    """I1: each run that found its task's lock held, and each other run that started
    while an earlier run was alive by its times (an earlier run without the lock, which
    the lock cannot witness, or one whose `end` line says so)."""
    out = []
    for task, mine in _by_task(runs).items():
        for i, b in enumerate(mine):
            alive = [a for a in mine[:i] if a.start <= b.start < a.ends_by]
            if b.overlap_at is not None:
                others = ", ".join(a.describe() for a in alive) or "an unrecorded run"
                out.append(Violation("I1", task, f"{b.describe()} found the lock held ({others})"))
                continue
            for a in alive:  # a locked run's ends_by stops at b's start: never here
                known = "" if a.end is not None else f" (no end line; until {a.ends_by:.3f})"
                out.append(Violation("I1", task, f"{b.describe()} while {a.describe()}{known}"))
    return out


def check_after_ack(runs: Sequence[Run], acks: Iterable[Ack]) -> list[Violation]:
    """I2: every run that started after its task's first acknowledged success or cancel."""
    first: dict[str, Ack] = {}
    for a in sorted(acks, key=lambda a: a.time):
        first.setdefault(a.task, a)
    out = []
    for r in runs:
        ack = first.get(r.task)
        if ack is not None and r.start > ack.time:
            late = r.start - ack.time
            message = f"{r.describe()}, {late:.3f} s after the {ack.kind} was acknowledged"
            out.append(Violation("I2", r.task, message))
    return out


def check_outcomes(
    submits: Iterable[Submit], tables: Sequence[NodeTable], runs: Sequence[Run] | None = None
) -> list[Violation]:
    """I3: each acknowledged submit is finished (succeeded, failed or cancelled) in every
    table; with `runs` (every task ran the probe), a success must come from a run of the
    accepted epoch that wrote its end line."""
    ended = {(r.task, r.epoch) for r in runs or () if r.end is not None}
    out = []
    for task in sorted({s.task for s in submits if s.acknowledged and s.task is not None}):
        rows = {t.node: t.rows.get(task) for t in tables}
        if not any(rows.values()):
            out.append(Violation("I3", task, "acknowledged, but in no final table"))
            continue
        open_ = [
            f"{node}: {'absent' if row is None else f'{row.phase} epoch {row.epoch}'}"
            for node, row in sorted(rows.items())
            if row is None or not row.finished or row.phase not in TERMINAL
        ]
        if open_:
            out.append(Violation("I3", task, "not finished on " + ", ".join(open_)))
        won = {(r.epoch, r.exit_code) for r in rows.values() if r and r.phase == "succeeded"}
        for epoch, code in sorted(won, key=str):
            if runs is not None and (task, epoch) not in ended:
                message = f"succeeded (exit {code}) at epoch {epoch}, but no run of it ended"
                out.append(Violation("I3", task, message))
    return out


def check_agreement(tables: Sequence[NodeTable]) -> list[Violation]:
    """I4: one (phase, epoch, exit code) per task across every table that should hold it
    (a row missing on one node counts as a disagreement)."""
    out = []
    tasks = sorted({task for t in tables for task in t.rows})
    for task in tasks:
        seen: dict[str, list[str]] = defaultdict(list)
        for t in tables:
            row = t.rows.get(task)
            key = "absent" if row is None else f"{row.phase}/{row.epoch}/exit {row.exit_code}"
            seen[key].append(t.node)
        if len(seen) > 1:
            parts = "; ".join(f"{k} on {', '.join(v)}" for k, v in sorted(seen.items()))
            out.append(Violation("I4", task, f"nodes disagree: {parts}"))
    return out


def check_orphans(
    killed: Sequence[Killed], runs: Sequence[Run], grace: float = GRACE_S
) -> list[Violation]:
    """I5: each task process group of a killed daemon gone within `grace`, and no run
    the daemon started wrote its end line later than `grace` after the kill."""
    out = []
    for k in killed:
        late: set[int] = set()
        for pid, when in sorted(k.gone_at.items()):
            if when is None:
                waited = k.watched_until - k.killed_at
                message = f"task pid {pid} of {k.node} still alive {waited:.1f} s after the kill"
            elif when - k.killed_at > grace:
                message = f"task pid {pid} of {k.node} gone {when - k.killed_at:.2f} s after"
            else:
                continue
            late.add(pid)
            out.append(Violation("I5", None, message + f" (grace {grace:.1f} s)"))
        for r in runs:
            if r.ppid != k.pid or r.pid in late or r.start > k.killed_at:
                continue
            if r.end is not None and r.end - k.killed_at > grace:
                message = f"{r.describe()} ended {r.end - k.killed_at:.2f} s after {k.node} died"
                out.append(Violation("I5", r.task, message))
    return out


def check(
    events: Iterable[ProbeEvent],
    submits: Sequence[Submit],
    acks: Iterable[Ack],
    tables: Sequence[NodeTable],
    killed: Sequence[Killed] = (),
    grace: float = GRACE_S,
    seen_gone: Mapping[int, float] | None = None,
) -> Report:
    """Every invariant over one history (every submitted task runs the probe).

    Args:
        events: every probe line (`load_events`).
        submits: every submit as the client saw it.
        acks: the successes and cancels acknowledged to the client.
        tables: the final table of every live node, once healed.
        killed: each daemon killed with SIGKILL, with its task groups' deaths.
        grace: how long a task may outlive its killed daemon (I5).
        seen_gone: probe pid -> a moment it was seen gone (bounds a run with no end).

    Returns:
        The `Report`: counts, and a readable line per violation.
    """
    events = list(events)
    runs = runs_from(events, killed, seen_gone)
    violations = [
        *check_overlaps(runs),
        *check_after_ack(runs, acks),
        *check_outcomes(submits, tables, runs),
        *check_agreement(tables),
        *check_orphans(killed, runs, grace),
    ]
    epochs = [(r.task, r.epoch) for r in runs]
    tasks = {s.task for s in submits if s.task is not None}
    acknowledged = {s.task for s in submits if s.acknowledged and s.task}
    return Report(
        tasks=len(tasks),
        acknowledged=len(acknowledged),
        never_ran=len(acknowledged - {r.task for r in runs}),
        runs=len(runs),
        extra_runs=len(runs) - len({r.task for r in runs}),
        same_epoch_runs=len(epochs) - len(set(epochs)),
        overlap_records=sum(1 for e in events if e.event == "overlap"),
        violations=tuple(violations),
    )
