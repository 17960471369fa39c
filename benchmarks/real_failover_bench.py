"""Failover on llama.cpp's ``llama-server`` at temperature 0 (issue 21: "at least 38 of
40 killed streams equal the uninterrupted text").

`tests/mesh/real_failover.py`'s lab: daemons ``a`` and ``c`` serve the tiny model,
each through its own ``llama-server`` (paced to 20 tokens/s), ``b`` accepts. Each run
sends a streamed chat completion (64 tokens, temperature 0, a prompt of its own) to
``b``, kills the serving daemon with kill -9 after 8 tokens, compares the text with the
engine's uninterrupted answer to the same prompt, then restarts the killed daemon and
waits until ``b`` routes to both again. Prints one line per run, then how many
matched, the median wall time of a stream and the load average. Exit status 1 below the goal.

Needs ``make engine``. Usage::

    python benchmarks/real_failover_bench.py            # 40 runs
    python benchmarks/real_failover_bench.py --runs 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.mesh.real_failover import KILL_AT, MAX_TOKENS, FailoverLab, restart_would_match


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--goal", type=int, default=None, help="default: 95%% of --runs")
    args = parser.parse_args()
    goal = args.goal if args.goal is not None else -(-args.runs * 95 // 100)
    matched, failed_over, matched_moved, blind, walls = 0, 0, 0, 0, []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="populi-real-failover-") as tmp:
        lab = FailoverLab(Path(tmp))
        try:
            lab.start()
            print(f"lab up in {time.monotonic() - started:.1f} s: {MAX_TOKENS} tokens per "
                  f"stream, kill -9 of the serving daemon after {KILL_AT}")  # fmt: skip
            for run in range(args.runs):
                prompt = f"run {run}: say something"
                reference = lab.reference(prompt)
                blind += bool(restart_would_match(reference))
                t0 = time.monotonic()
                text, killed, attempts, lines = lab.failover(prompt)
                walls.append(time.monotonic() - t0)
                ok = text == reference and lines.count("[DONE]") == 1
                moved = bool(killed) and len(attempts) > 1 and attempts[-1].endswith("served")
                matched += ok
                failed_over += moved
                matched_moved += ok and moved
                pairs = enumerate(zip(text, reference, strict=False))
                first = next((i for i, (x, y) in pairs if x != y), None)
                print(f"run {run:2d}: {'match' if ok else 'DIFFER'} killed={killed or '-'} "
                      f"attempts={len(attempts)} len={len(text)}/{len(reference)}"
                      + ("" if ok else f" first difference at {first}"))  # fmt: skip
                if not ok:
                    assert lab.accepting is not None
                    print(f"        route: {lab.last_route['route']} attempts "
                          f"{lab.last_route['attempts']}; b's view after: "
                          f"{lab.view_names()}; last event: {lines[-1:]}")  # fmt: skip
                if killed:
                    lab.restart(killed)
                    lab.wait_both_serving()
        finally:
            lab.stop()
    load = os.getloadavg()
    print(f"\nmatched {matched}/{args.runs} (goal >= {goal}); continued on the other node "
          f"{failed_over}/{args.runs}, of which {matched_moved} matched; prompts whose answer"
          f" a restart could pass for: {blind}; stream wall p50 "
          f"{statistics.median(walls):.2f} s; "
          f"total {time.monotonic() - started:.0f} s; load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    return 0 if matched >= goal else 1


if __name__ == "__main__":
    sys.exit(main())
