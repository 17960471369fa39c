"""Chaos over the inference relay, 1,000 seeds (issue 11: "over 1,000 chaos runs, every
stream ends with exactly one [DONE], and no text is duplicated or lost").

Each seed is `tests/inference/chaos.py`'s run: three serving nodes with random faults
(engine errors, a stall, none) and random kills at random tokens, in-process over
loopback with real sockets and signed peer calls. A run passes when the client's text
is the words in order with no repeat and no gap, and the stream ends with exactly one
[DONE] (whole), or with an error event and no [DONE] (clearly broken: no node could
finish), or is refused with 503 before it starts. Exit status 1 if any run fails.

Usage::

    python benchmarks/inference_chaos.py                  # seeds 0..999, 2 processes
    python benchmarks/inference_chaos.py --runs 200 --jobs 1
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.inference.chaos import chaos_run


def one(seed: int) -> tuple[int, str]:
    """(seed, outcome or "FAILED: why") of one run, in a fresh event loop."""
    try:
        return seed, trio.run(chaos_run, seed)
    except Exception as exc:  # a failed run is reported, not fatal to the others
        return seed, f"FAILED: {type(exc).__name__}: {exc!r}"[:300]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    args = parser.parse_args()
    if args.runs < 1 or args.jobs < 1:
        parser.error("--runs and --jobs must be at least 1")
    load = os.getloadavg()
    print(f"{args.runs} chaos runs in {args.jobs} processes on a {os.cpu_count()}-core machine"
          f" (load average {load[0]:.1f})")  # fmt: skip
    seeds = range(args.first_seed, args.first_seed + args.runs)
    outcomes: collections.Counter[str] = collections.Counter()
    failures: list[tuple[int, str]] = []
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for i, (seed, outcome) in enumerate(pool.imap_unordered(one, seeds), 1):
            if outcome.startswith("FAILED"):
                failures.append((seed, outcome))
                outcomes["failed"] += 1
                print(f"  seed {seed}: {outcome}", flush=True)
            else:
                outcomes[outcome] += 1
            if i % 100 == 0:
                print(
                    f"  {i} runs, {time.perf_counter() - start:.0f} s: {dict(outcomes)}", flush=True
                )
    elapsed = time.perf_counter() - start
    print(
        f"{args.runs} runs in {elapsed:.0f} s: {outcomes['whole']} whole with exactly one"
        f" [DONE], {outcomes['broken']} clearly broken (error event, no [DONE]),"
        f" {outcomes['refused']} refused before the first byte, {len(failures)} failed"
    )
    for seed, why in sorted(failures):
        print(f"  seed {seed}: {why}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
