"""One scenario over many seeds: every measure as a mean with a 95% confidence interval.

One seed is one sample of a random process: a difference between two single-seed runs
is as likely noise as an effect. `run_seeds` runs a scenario once per seed and
`summarize` reduces the runs to a `SeedSummary` per measure: the mean, and a Student
t-interval for it (the runs are independent, since each seed derives every random
choice of its run). The t quantiles are tabulated here rather than computed, so the
simulator needs no statistics package.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from ._runner import RunResult, run_once
from ._scenario import Scenario, override

__all__ = [
    "MEASURES",
    "SeedSummary",
    "as_json",
    "format_seeds",
    "mean_ci",
    "run_seeds",
    "summarize",
]

#: Two-sided 95% Student t quantiles (t_{0.975, df}) for df = 1 .. 30.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def _t975(df: int) -> float:
    """The 97.5% t quantile; beyond the table, the normal's 1.96 plus a 1/df correction."""
    if df <= len(_T975):
        return _T975[df - 1]
    return 1.96 + 2.4 / df


@attrs.frozen
class SeedSummary:
    """One measure over several seeds: mean and its 95% t-interval (None: no data)."""

    measure: str
    #: How many runs had a value for this measure.
    n: int
    mean: float | None
    low: float | None
    high: float | None
    #: Half the interval's width (the "±"); None with fewer than 2 values.
    half_width: float | None


def mean_ci(values: Sequence[float]) -> tuple[float | None, float | None]:
    """The mean of `values` and the half-width of its 95% t-interval.

    With no values both are None; with one value the width is None (unknown), not 0.
    """
    n = len(values)
    if n == 0:
        return None, None
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, _t975(n - 1) * math.sqrt(variance / n)


def _fp(result: RunResult, key: str) -> float:
    return float(result.measures["false_positives"][key])


def _detection(key: str) -> Callable[[RunResult], float | None]:
    def read(result: RunResult) -> float | None:
        value = result.measures["detection"][key]
        return None if value is None else float(value)

    return read


def _lease(key: str) -> Callable[[RunResult], float | None]:
    """A lease measure (scenarios with `[tasks]`); None for runs without leases."""

    def read(result: RunResult) -> float | None:
        leases = result.measures.get("leases")
        value = None if leases is None else leases[key]
        return None if value is None else float(value)

    return read


def _invariant(name: str) -> Callable[[RunResult], float | None]:
    """Violations of one lease invariant in a run (None for runs without leases)."""

    def read(result: RunResult) -> float | None:
        leases = result.measures.get("leases")
        return None if leases is None else float(leases["invariants"][name])

    return read


#: Per-run measures reduced over seeds, in print order: name -> how to read it.
MEASURES: dict[str, Callable[[RunResult], float | None]] = {
    "healthy members declared dead": lambda r: _fp(r, "episodes_healthy"),
    "slow members declared dead": lambda r: _fp(r, "episodes_slow"),
    "false dead notifications": lambda r: _fp(r, "declarations"),
    "false suspicions": lambda r: _fp(r, "suspicions"),
    "crash: first suspected (s)": _detection("first_suspected_mean"),
    "crash: first declared dead (s)": _detection("first_detected_mean"),
    "crash: declared dead by all (s)": _detection("all_detected_mean"),
    "crashes left out of the means": lambda r: float(r.measures["detection"]["undetected"]),
    "update reaches all (s)": lambda r: (
        None
        if r.measures["dissemination"]["all_seen_mean"] is None
        else float(r.measures["dissemination"]["all_seen_mean"])
    ),
    "messages per member per second": lambda r: float(r.measures["messages_per_member_second"]),
    "bytes per member per second": lambda r: float(r.measures["bytes_per_member_second"]),
    "leases: tasks submitted": _lease("submitted"),
    "leases: submission to first start (s)": _lease("first_start_mean"),
    "leases: executions per task": _lease("starts_per_task"),
    "leases: owner crash to rerun (s)": _lease("failover_mean"),
    "leases: owner crashes failed over": _lease("failovers"),
    "leases: I1 overlapping executions": _invariant("I1"),
    "leases: I2 starts after final": _invariant("I2"),
    "leases: I3 acknowledged, unfinished": _invariant("I3"),
    "leases: I4 live tables differ": _invariant("I4"),
    "leases: lease bytes per member-second": _lease("lease_bytes_per_member_second"),
}


def run_seeds(
    scenario: Scenario,
    seeds: Iterable[int],
    *,
    progress: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Run `scenario` (its sweep ignored) once per seed, in order."""
    results = []
    for seed in seeds:
        result = run_once(override(scenario, seed=seed))
        if progress is not None:
            progress(result)
        results.append(result)
    return results


def summarize(results: Sequence[RunResult]) -> list[SeedSummary]:
    """Every measure in `MEASURES` over `results`, each as mean and 95% interval."""
    summaries = []
    for name, read in MEASURES.items():
        values = [v for v in (read(r) for r in results) if v is not None and math.isfinite(v)]
        mean, half = mean_ci(values)
        low = None if mean is None or half is None else mean - half
        high = None if mean is None or half is None else mean + half
        summaries.append(SeedSummary(name, len(values), mean, low, high, half))
    return summaries


def format_seeds(results: Sequence[RunResult]) -> str:
    """A table: one line per measure, mean ± half-width of the 95% interval."""
    if not results:
        return "no runs"
    first = results[0]
    seeds = ", ".join(str(r.seed) for r in results)
    lines = [
        f"{first.scenario}: {first.members} members, Lifeguard "
        f"{'on' if first.lifeguard else 'off'}, {len(results)} seeds ({seeds}); "
        "mean ± half-width of the 95% t-interval over seeds",
    ]
    for summary in summarize(results):
        if summary.n == 0 and summary.measure.startswith("leases:"):
            continue  # a scenario without [tasks]
        lines.append(f"  {summary.measure:<34} {_interval(summary)}")
    failed = sum(1 for r in results if not r.ok)
    if failed:
        lines.append(f"  {failed} of {len(results)} runs FAILED")
    return "\n".join(lines)


def _interval(summary: SeedSummary) -> str:
    if summary.mean is None:
        return "-"
    if summary.half_width is None:
        return f"{summary.mean:.3g} (n=1, no interval)"
    return f"{summary.mean:.3g} ± {summary.half_width:.2g} (n={summary.n})"


def as_json(results: Sequence[RunResult]) -> dict[str, Any]:
    """The summary as plain data, for `--json`."""
    return {s.measure: attrs.asdict(s) for s in summarize(results)}
