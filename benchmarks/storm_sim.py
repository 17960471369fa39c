"""The start storm in the simulator, every member a CPU (docs/simulations.md, "The cost
of a start storm"): the time from the last start until all hold all alive.

    python benchmarks/storm_sim.py                       # the documented runs
    python benchmarks/storm_sim.py --load 60 --window 24.3 --seeds 1 2 3
    python benchmarks/storm_sim.py --per-message 3e-4 --per-byte 1.3e-6

100 members through two seeds, started uniformly over `--window` seconds (a real run's
spread of `node.ready` lines), signed-record-sized metadata, the daemon's packet budget
(tests/simulations/test_runner_rejoin.py's `RecordStorm`). Each member handles every
incoming message in turn for (per-message + per-byte * size) / share seconds, share =
cores / load.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "simulations"))

import test_runner_rejoin as storm  # noqa: E402

#: (label, load average, spread of the starts): the real runs in docs/performance.md.
REAL_RUNS = (
    ("quiet 1", 30.4, 13.2), ("quiet 2", 31.0, 15.2), ("quiet 3", 28.0, 15.9),
    ("loaded 2", 59.9, 24.3), ("loaded 1", 94.6, 38.9),
)  # fmt: skip


class CpuStorm(storm.RecordStorm):
    """`RecordStorm` with every member a CPU from its start."""

    per_message = 0.0
    per_byte = 0.0

    def _start(self, node: int) -> None:
        super()._start(node)
        for started in (0, 1) if node < 2 else (node,):
            self.sim.set_slow(started, 0.0, cost=self.per_message, cost_per_byte=self.per_byte)


def one(seed: int, window: float, per_message: float, per_byte: float) -> Any:
    run = CpuStorm(
        storm.scenario(
            members=100, duration=1.0, seed=seed, swim={"packet_budget": storm.DAEMON_BUDGET},
            formation={"window": window, "timeout": 300.0},
        ),
        None,
    )  # fmt: skip
    run.per_message, run.per_byte = per_message, per_byte
    result = run.run()
    last = max(run.up.values())
    return result, (None if result.formation_seconds is None else result.formation_seconds - last)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-message", type=float, default=3e-4, help="CPU seconds")
    parser.add_argument("--per-byte", type=float, default=1.3e-6, help="CPU seconds")
    parser.add_argument("--cores", type=float, default=2.0)
    parser.add_argument("--load", type=float, default=None)
    parser.add_argument("--window", type=float, default=24.3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    runs = REAL_RUNS if args.load is None else (("given", args.load, args.window),)
    for label, load, window in runs:
        share = min(1.0, args.cores / load)
        for seed in args.seeds:
            started = time.time()
            result, after = one(seed, window, args.per_message / share, args.per_byte / share)
            what = f"+{after:.2f} s" if after is not None else f"failed: {result.failure}"
            print(f"{label} load {load} seed {seed}: {what} ({time.time() - started:.0f} s wall)")


if __name__ == "__main__":
    main()
