"""`LeaseHistory`: what really happened to the simulated tasks, and its invariants.

The simulated nodes never see this. It records every execution of every task (task,
epoch, node, start and end in global virtual time) as the simulated executors carry
them out, when a success or cancel became final at a majority of a task's replicas
(read from the granters' "disks", where each record is persisted before it is
answered), and which submits the accepting node acknowledged; then it checks the
history against the invariants of docs/leases.md, as `tests/leases/agent_harness.py`
does for the idealized cluster:

- **I1** no two executions of one task overlap in time;
- **I2** nothing starts after a success or cancel was final at a majority of the
  task's replicas;
- **I3** every acknowledged submit ends finished (succeeded, failed for good or
  cancelled) on every live node, once the run has healed and drained;
- **I4** every live node's table then holds the same phase and epoch for it.

A task none of whose replica majorities is up at the end (its replicas left for good,
or are down) cannot finish by design: it is counted as *stranded*, not as I3.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

import attrs

from populi_p2p.leases import LeaseTable
from populi_p2p.leases.grants import Ended, GrantRecord
from populi_p2p.leases.quorum import is_quorum

__all__ = ["INVARIANTS", "Execution", "LeaseHistory"]

INVARIANTS: Final = ("I1", "I2", "I3", "I4")
#: Violations kept as text in the run's measures (all are counted).
EXAMPLES_MAX: Final = 5


@attrs.define
class Execution:
    """One run of a task's process on one node, in global virtual time."""

    task: str
    epoch: int
    node: str
    start: float
    end: float | None = None
    how: str = ""  # exited, stopped (StopTask), fenced (the executor's deadline), crashed


@attrs.define
class _Task:
    number: int
    submitted: float
    duration: float
    replicas: tuple[str, ...] = ()
    acked: float | None = None
    final_at: float | None = None
    first_start: float | None = None
    #: Global time an owner crashed while executing it, until the next start.
    crashed: float | None = None


class LeaseHistory:
    """Ground truth of one run: executions, finality, acknowledgements, failovers."""

    def __init__(self) -> None:
        self.tasks: dict[str, _Task] = {}
        self.executions: dict[str, list[Execution]] = {}
        self.violations: dict[str, list[str]] = {name: [] for name in INVARIANTS}
        self.failovers: list[float] = []

    ####################################################################################
    # Recording

    def submitted(self, tid: str, number: int, now: float, duration: float) -> None:
        self.tasks[tid] = _Task(number, now, duration)
        self.executions[tid] = []

    def acknowledged(self, tid: str, replicas: tuple[str, ...], now: float) -> None:
        task = self.tasks.get(tid)
        if task is not None and task.acked is None:
            task.acked, task.replicas = now, replicas

    def persisted(self, rec: GrantRecord, disks: Mapping[str, Mapping[str, GrantRecord]],
                  now: float) -> None:  # fmt: skip
        """A granter wrote `rec`: is a success or cancel now final at a majority?"""
        task = self.tasks.get(rec.task_id)
        if task is None or task.final_at is not None:
            return
        replicas = rec.spec.replicas
        final = []
        for node in replicas:
            held = disks.get(node, {}).get(rec.task_id)
            if held is not None and held.final and held.ended in (Ended.SUCCEEDED, Ended.CANCELLED):
                final.append(node)
        if is_quorum(replicas, final):
            task.final_at = now

    def started(self, tid: str, epoch: int, node: str, now: float) -> Execution:
        run = Execution(tid, epoch, node, now)
        task = self.tasks.get(tid)
        if task is None:  # not one of ours (cannot happen: only we submit)
            return run
        if task.final_at is not None:
            self._violate("I2", f"{tid[:12]} started on {node} at epoch {epoch}, t={now:.3f}, "
                                f"after it was final at t={task.final_at:.3f}")  # fmt: skip
        for other in self.executions[tid]:
            if other.end is None:
                self._violate("I1", f"{tid[:12]} started on {node} at epoch {epoch}, "
                                    f"t={now:.3f}, while {other.node} runs epoch {other.epoch} "
                                    f"(since t={other.start:.3f})")  # fmt: skip
        self.executions[tid].append(run)
        if task.first_start is None:
            task.first_start = now
        if task.crashed is not None:
            self.failovers.append(now - task.crashed)
            task.crashed = None
        return run

    def ended(self, run: Execution, now: float, how: str) -> None:
        if run.end is None:
            run.end, run.how = now, how
            task = self.tasks.get(run.task)
            if how == "crashed" and task is not None and task.crashed is None:
                task.crashed = now

    def _violate(self, invariant: str, text: str) -> None:
        self.violations[invariant].append(text)

    ####################################################################################
    # The end

    def check_end(self, tables: Mapping[str, LeaseTable], up: Collection[str]) -> None:
        """I3 and I4 over the live nodes' tables (after the drain)."""
        for tid, task in self.tasks.items():
            if task.acked is None:
                continue
            if task.replicas and not is_quorum(task.replicas, up):
                continue  # stranded: counted in `stranded()`
            entries = [t.get(tid) for t in tables.values()]
            held = sorted({"-" if e is None else f"{e.phase.name}@{e.epoch}" for e in entries})
            if len(held) != 1:
                self._violate("I4", f"{tid[:12]}: live tables differ: {held}")
            if any(e is None or not e.finished() for e in entries):
                self._violate("I3", f"{tid[:12]}: acknowledged, not finished everywhere: {held}")

    def stranded(self, up: Collection[str]) -> int:
        """Acknowledged tasks without a live majority of replicas at the end."""
        return sum(
            1
            for t in self.tasks.values()
            if t.acked is not None
            and t.replicas
            and not is_quorum(t.replicas, up)
        )

    def counts(self) -> dict[str, int]:
        return {name: len(found) for name, found in self.violations.items()}

    def summary(self) -> dict[str, Any]:
        tasks = list(self.tasks.values())
        starts = sum(len(runs) for runs in self.executions.values())
        first = [t.first_start - t.submitted for t in tasks if t.first_start is not None]
        ends: dict[str, int] = {}
        for runs in self.executions.values():
            for run in runs:
                ends[run.how or "running"] = ends.get(run.how or "running", 0) + 1
        return {
            "invariants": self.counts(),
            "violations": sum(self.counts().values()),
            "violation_examples": [v for name in INVARIANTS for v in self.violations[name]][
                :EXAMPLES_MAX
            ],
            "acknowledged": sum(1 for t in tasks if t.acked is not None),
            "executions": starts,
            "execution_ends": ends,
            "starts_per_task": starts / len(tasks) if tasks else None,
            "first_start_mean": _mean(first),
            "failovers": len(self.failovers),
            "failover_mean": _mean(self.failovers),
            "failover_max": max(self.failovers, default=None),
            "failover_times": [round(t, 3) for t in self.failovers],
            "crashed_owners_not_failed_over": sum(1 for t in tasks if t.crashed is not None),
        }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
