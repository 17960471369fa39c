"""Lease traffic per node in the agents' own cluster (issue 17, "Scale").

`LeaseAgent`s in `tests/leases/agent_harness.py`'s discrete-event cluster: tasks that
run throughout, submitted round the nodes; after a settle, every agent message each
node sends over a window is counted (bytes of the signed agent message, not the packet
envelope around it). Printed, never asserted::

    python benchmarks/lease_traffic.py --preset lan --nodes 10 --tasks 20 200
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import attrs  # noqa: E402

from populi_p2p.leases import LeaseConfig  # noqa: E402
from populi_p2p.leases.agent_wire import decode  # noqa: E402
from tests.leases.agent_harness import Cluster, verify  # noqa: E402


def measure(preset: str, nodes: int, tasks: int, settle: float, window: float) -> str:
    config = attrs.evolve(
        getattr(LeaseConfig, preset)(), finished_retention=1e6, tombstone_retention=2e6
    )
    c = Cluster(nodes, seed=5, config=config)
    tids = [c.submit(f"n{i % nodes}", 10 * (settle + window)) for i in range(tasks)]
    c.run_until(settle)
    c.clear_sent()
    c.run_until(settle + window)
    running = sum(1 for t in tids if c.runs[t])
    per_kind: collections.Counter[str] = collections.Counter()
    for (_at, _src, _dst, size), payload in zip(c.sent_log, c._payloads, strict=True):
        per_kind[type(decode(payload, verify)[1]).__name__] += size
    scale = window * nodes
    kinds = ", ".join(f"{k} {v / scale:.0f}" for k, v in per_kind.most_common())
    return (
        f"{preset}: {nodes} nodes, {running}/{tasks} running: "
        f"{sum(per_kind.values()) / scale:.0f} B/s sent per node"
        f" ({len(c.sent_log) / scale:.1f} messages/s; {kinds})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=("lan", "wan", "local"), default="lan")
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--tasks", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--settle", type=float, default=60.0)
    parser.add_argument("--window", type=float, default=100.0)
    args = parser.parse_args()
    for tasks in args.tasks:
        print(measure(args.preset, args.nodes, tasks, args.settle, args.window), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
