"""Run a lease scenario over many seeds and count the lease invariants' violations.

    python -m simulations.lease_sweep [--scenario leases-sweep] [--seeds 1000]
                                      [--first 1] [--jobs 2] [--json OUT]

Each seed is one run of the scenario (`run_once`) with every lease agent in every
simulated node (`_leases.py`); the run's history is checked against I1 to I4
(`_lease_history.py`). Prints the violations per invariant over all seeds, the seeds
that broke one (each reproduces with ``populi-sim run SCENARIO --seed N``), runs that
failed otherwise (liveness), and the failover times over all runs. Exit status 1 when
any invariant was violated.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._lease_history import INVARIANTS
from ._runner import run_once
from ._scenario import Scenario, load_scenario, override

__all__ = ["main", "run_seed", "sweep"]

SCENARIOS = Path(__file__).parent / "scenarios"


def _scenario(name: str) -> Scenario:
    path = Path(name)
    if not path.exists():
        path = SCENARIOS / f"{name}.toml"
    return load_scenario(path)


def run_seed(arg: tuple[str, int]) -> dict[str, Any]:
    """One seed's lease outcome as plain data (picklable, for a process pool)."""
    name, seed = arg
    result = run_once(override(_scenario(name), seed=seed))
    leases = result.measures.get("leases", {})
    return {
        "seed": seed,
        "ok": result.ok,
        "failure": result.failure,
        "invariants": leases.get("invariants", {}),
        "examples": leases.get("violation_examples", []),
        "checked_end": leases.get("checked_end", False),
        "submitted": leases.get("submitted", 0),
        "acknowledged": leases.get("acknowledged", 0),
        "executions": leases.get("executions", 0),
        "stranded": leases.get("stranded", 0),
        "failover_times": leases.get("failover_times", []),
        "not_failed_over": leases.get("crashed_owners_not_failed_over", 0),
        "wall": result.wall_seconds,
    }


def sweep(name: str, seeds: Sequence[int], jobs: int = 1) -> list[dict[str, Any]]:
    """Every seed of `seeds`, on `jobs` processes; results in seed order."""
    args = [(name, seed) for seed in seeds]
    if jobs <= 1:
        return [run_seed(a) for a in args]
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        return list(pool.imap(run_seed, args, chunksize=4))


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def report(name: str, runs: Sequence[dict[str, Any]]) -> str:
    """The sweep's totals as text."""
    totals = {k: sum(r["invariants"].get(k, 0) for r in runs) for k in INVARIANTS}
    broken = [r for r in runs if any(r["invariants"].values())]
    failed = [r for r in runs if not r["ok"] and not any(r["invariants"].values())]
    times = [t for r in runs for t in r["failover_times"]]
    lines = [
        f"{name}: {len(runs)} seeds ({runs[0]['seed']}..{runs[-1]['seed']}), "
        f"{sum(r['submitted'] for r in runs)} tasks submitted, "
        f"{sum(r['acknowledged'] for r in runs)} acknowledged, "
        f"{sum(r['executions'] for r in runs)} executions",
        "  violations: "
        + ", ".join(f"{k} {v}" for k, v in totals.items())
        + f" (in {len(broken)} seeds)",
        f"  I3/I4 checked after the drain in {sum(1 for r in runs if r['checked_end'])} seeds; "
        f"{sum(r['stranded'] for r in runs)} acknowledged tasks without a live replica "
        "majority at the end (not counted)",
    ]
    if times:
        lines.append(
            f"  failovers (owner crash -> next start): {len(times)}, mean "
            f"{sum(times) / len(times):.2f} s, median {_quantile(times, 0.5):.2f} s, "
            f"p95 {_quantile(times, 0.95):.2f} s, max {max(times):.2f} s; "
            f"{sum(r['not_failed_over'] for r in runs)} crashed owners' tasks never ran again"
        )
    for r in broken[:10]:
        lines.append(f"  seed {r['seed']}: {r['invariants']} {r['examples'][:1]}")
    for r in failed[:10]:
        lines.append(f"  seed {r['seed']} failed: {r['failure']}")
    if failed:
        lines.append(f"  {len(failed)} runs failed without a lease violation")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations.lease_sweep")
    parser.add_argument("--scenario", default="leases-sweep", help="a name or TOML file")
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds")
    parser.add_argument("--first", type=int, default=1, help="the first seed")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--json", type=Path, help="write every seed's outcome here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    runs = sweep(args.scenario, range(args.first, args.first + args.seeds), args.jobs)
    print(report(args.scenario, runs))
    print(f"  {time.perf_counter() - started:.0f} s wall on {args.jobs} processes")
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=1))
    return 1 if any(any(r["invariants"].values()) for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
