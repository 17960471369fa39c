"""`TasksSpec`: the `[tasks]` table of a scenario (submissions for the lease table).

A scenario with a `[tasks]` table runs the lease table (`populi_p2p.leases`) inside
every simulated node (see `_leases.py`): tasks are submitted at a Poisson rate to
random live members, run for a virtual-time duration drawn from a distribution, and
the run checks the history of executions against the lease invariants (I1 to I4) and
reports failover times. Parsing is as strict as the rest of the scenario: an unknown key or an
impossible value is one `ScenarioError` line.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from populi_p2p.presets import PRESET_NAMES

__all__ = ["DISTRIBUTIONS", "LEASE_PRESETS", "TasksSpec", "parse_tasks"]

DISTRIBUTIONS = ("fixed", "uniform", "exponential")
LEASE_PRESETS = PRESET_NAMES


@attrs.frozen
class TasksSpec:
    """What work the simulated mesh gets, and what each node offers."""

    #: Submissions per second, cluster-wide (a Poisson process).
    rate: float = 0.5
    #: Submissions happen from `start` to `stop` seconds into the timeline (stop None:
    #: the end of the timeline; tasks still running then finish in the drain phase).
    start: float = 0.0
    stop: float | None = None
    #: At most this many tasks in the run (0: no limit).
    count_max: int = 0
    #: Run time of one task in virtual seconds: "fixed" (`duration_min`), "uniform" in
    #: [`duration_min`, `duration_max`], or "exponential" with mean `duration_mean`
    #: clipped to [`duration_min`, `duration_max`].
    distribution: str = "uniform"
    duration_min: float = 5.0
    duration_max: float = 30.0
    duration_mean: float = 15.0
    #: Fraction of executions that exit non-zero (not the node's fault): retried up to
    #: `retry_limit` times by the lease table, then failed for good.
    failure_rate: float = 0.0
    retry_limit: int = 2
    #: Fraction of tasks a user cancels, at the member that accepted it (the only one
    #: that may without an operator key), at a uniform time within twice the task's
    #: run time after its submission.
    cancel_fraction: float = 0.0
    #: Each node's lease clock runs at a rate drawn in ``1 +- clock_drift`` (the
    #: agent's `clock_margin` of 1.25 covers clocks up to 20 % apart).
    clock_drift: float = 0.0
    #: What each task asks for.
    gpus: int = 1
    vram_gib: float = 8.0
    cpu_cores: float = 1.0
    #: What every node offers: GPUs of `node_vram_gib` each, cores and RAM.
    node_gpus: int = 2
    node_vram_gib: float = 24.0
    node_cpu_cores: float = 16.0
    node_ram_gib: float = 64.0
    #: `LeaseConfig` preset: lease_renew_interval, lease_ttl, settle_time...
    lease_preset: str = "lan"
    #: After the liveness phase, keep running (bounded) until every task is finished
    #: and every live replica agrees; the final state is classified then.
    drain_bound: float = 600.0

    def __attrs_post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}")
        if self.lease_preset not in LEASE_PRESETS:
            raise ValueError(f"lease_preset must be one of {LEASE_PRESETS}")
        if not 0 < self.duration_min <= self.duration_max:
            raise ValueError("need 0 < duration_min <= duration_max")
        if not self.duration_mean > 0:
            raise ValueError("duration_mean must be > 0")
        if not 0 <= self.failure_rate <= 1:
            raise ValueError("failure_rate must be in [0, 1]")
        if not 0 <= self.cancel_fraction <= 1:
            raise ValueError("cancel_fraction must be in [0, 1]")
        if not 0 <= self.clock_drift < 0.5:
            raise ValueError("clock_drift must be in [0, 0.5)")
        if self.stop is not None and self.stop < self.start:
            raise ValueError("stop must not be before start")

    def draw_duration(self, rng: Any) -> float:
        """One task's run time, from the scenario's distribution."""
        if self.distribution == "fixed":
            return self.duration_min
        if self.distribution == "uniform":
            return float(rng.uniform(self.duration_min, self.duration_max))
        value = float(rng.expovariate(1.0 / self.duration_mean))
        return min(self.duration_max, max(self.duration_min, value))


class _Reader(Protocol):
    """The bits of `_scenario._Table` this parser uses (it lives there)."""

    where: str

    def number(self, key: str, default: float | None, *, minimum: float | None = 0.0) -> Any: ...

    def integer(self, key: str, default: int, *, minimum: int = 0) -> int: ...

    def string(self, key: str, default: str) -> str: ...

    def done(self) -> None: ...


def parse_tasks(table: _Reader | None) -> TasksSpec | None:
    """Read `[tasks]`; None when the scenario has none.

    Raises:
        ValueError: an impossible value (the caller turns it into a ScenarioError).
    """
    if table is None:
        return None
    d = TasksSpec()
    values: dict[str, Any] = {}
    for field in attrs.fields(TasksSpec):
        default = getattr(d, field.name)
        if field.name in ("distribution", "lease_preset"):
            values[field.name] = table.string(field.name, default)
        elif field.name in ("count_max", "retry_limit", "gpus", "node_gpus"):
            values[field.name] = table.integer(field.name, default)
        else:
            values[field.name] = table.number(field.name, default)
    table.done()
    try:
        return TasksSpec(**values)
    except ValueError as exc:
        raise ValueError(f"{table.where}: {exc}") from None
