"""`python -m simulations.lifeguard_grid`: Lifeguard off and on, k slow members, many seeds.

Runs the shipped `lifeguard-slow` scenario (100 members, k of them slow for the whole
run, a healthy member crashing every 30 s) for every k and both Lifeguard settings,
over S seeds each, and prints one Markdown row per cell: each measure as its mean over
the seeds with the half-width of its 95% t-interval. This is the table in
docs/simulations.md.

    python -m simulations.lifeguard_grid [--slow 1,2,4] [--seeds 10] [--duration 300]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import attrs

from ._scenario import Scenario, load_scenario, override
from ._seeds import SeedSummary, run_seeds, summarize
from .cli import SCENARIOS

__all__ = ["grid_scenario", "main"]

#: The measures in the table, in column order.
COLUMNS = (
    "healthy members declared dead",
    "slow members declared dead",
    "false suspicions",
    "crash: first declared dead (s)",
    "crash: declared dead by all (s)",
    "messages per member per second",
)


def grid_scenario(base: Scenario, slow: int, lifeguard: bool) -> Scenario:
    """`base` with `slow` members slowed (its "slow" faults' count) and Lifeguard set."""
    faults = tuple(
        attrs.evolve(fault, count=slow) if fault.kind == "slow" else fault for fault in base.faults
    )
    return override(attrs.evolve(base, faults=faults), lifeguard=lifeguard)


def _cell(summary: SeedSummary) -> str:
    if summary.mean is None:
        return "-"
    if summary.half_width is None:
        return f"{summary.mean:.3g}"
    return f"{summary.mean:.3g} ± {summary.half_width:.2g}"


def _counts(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected counts >= 0, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations.lifeguard_grid")
    parser.add_argument("--slow", type=_counts, default=[1, 2, 4], help="slow counts: 1,2,4")
    parser.add_argument("--seeds", type=int, default=10, help="seeds per cell (default 10)")
    parser.add_argument("--first-seed", type=int, default=1, help="first seed (default 1)")
    parser.add_argument("--duration", type=float, default=None, help="timeline seconds")
    parser.add_argument("--members", type=int, default=None, help="cluster size (default 100)")
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error("--seeds must be at least 2 for an interval")
    if args.duration is not None and not args.duration > 0:
        parser.error("--duration must be > 0 seconds")
    if args.members is not None and args.members < max(args.slow) + 2:
        parser.error("--members must exceed the largest slow count by at least 2")
    base = override(
        load_scenario(SCENARIOS / "lifeguard-slow.toml"),
        duration=args.duration,
        members=args.members,
    )
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(
        f"{base.members} members, {base.duration:g} s timeline, seeds "
        f"{seeds.start}..{seeds.stop - 1}; mean ± 95% t-interval half-width over seeds",
        flush=True,
    )
    print("| slow | Lifeguard | " + " | ".join(COLUMNS) + " | failed runs |")
    print("|---:|---|" + "---:|" * (len(COLUMNS) + 1), flush=True)
    failed = 0
    for slow in args.slow:
        for lifeguard in (False, True):
            results = run_seeds(grid_scenario(base, slow, lifeguard), seeds)
            by_name = {s.measure: s for s in summarize(results)}
            bad = sum(1 for r in results if not r.ok)
            failed += bad
            cells = " | ".join(_cell(by_name[name]) for name in COLUMNS)
            print(f"| {slow} | {'on' if lifeguard else 'off'} | {cells} | {bad} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
