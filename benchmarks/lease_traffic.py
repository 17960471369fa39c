"""Lease traffic per node in the agents' own cluster (issue 17, "Scale").

`LeaseAgent`s in `tests/leases/agent_harness.py`'s discrete-event cluster, named with
node ids of the daemon's shape (16 characters): tasks that run throughout, submitted
round the nodes; after a settle, every agent message each node sends over a window is
counted twice: the agent message alone, and as the daemon puts it on the wire (the
one-byte `AppKind`, swim's `App` message and packet header, and the packet envelope:
header and Ed25519 signature, addressed, no certificate, no cluster secret; each
message its own datagram, or a TCP frame when over the datagram budget). Printed, never
asserted::

    python benchmarks/lease_traffic.py --preset lan --nodes 20 --tasks 1000
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import attrs  # noqa: E402

from overlay.auth import BASE_OVERHEAD, DEFAULT_MAX_PACKET_SIZE  # noqa: E402
from populi_p2p.leases import LeaseConfig  # noqa: E402
from populi_p2p.leases.agent_wire import decode  # noqa: E402
from swim.wire import App, encode_message, encode_packet  # noqa: E402
from tests.leases.agent_harness import Cluster  # noqa: E402

#: `AppKind.LEASE_AGENT` and the lease service's `send_app` key.
AGENT_KIND = 4
AGENT_KEY = ""
#: A TCP frame's length prefix (a message over the datagram budget goes by stream).
FRAME_PREFIX = 4


def on_wire(sender: str, payload: bytes) -> int:
    """Bytes the daemon sends for one agent message (see the module's docstring)."""
    app = App(sender, AGENT_KEY, bytes([AGENT_KIND]) + payload)
    packet = encode_packet([encode_message(app)])
    framing = FRAME_PREFIX if len(packet) + BASE_OVERHEAD > DEFAULT_MAX_PACKET_SIZE else 0
    return BASE_OVERHEAD + len(packet) + framing


def measure(preset: str, nodes: int, tasks: int, settle: float, window: float) -> str:
    config = attrs.evolve(
        getattr(LeaseConfig, preset)(), finished_retention=1e6, tombstone_retention=2e6
    )
    c = Cluster(nodes, seed=5, config=config, real_ids=True)
    names = list(c.nodes)
    tids = [c.submit(names[i % nodes], 10 * (settle + window)) for i in range(tasks)]
    c.run_until(settle)
    c.clear_sent()
    cpu = time.process_time()
    c.run_until(settle + window)
    cpu = time.process_time() - cpu
    running = sum(1 for t in tids if c.runs[t])
    agent: collections.Counter[str] = collections.Counter()
    wire: collections.Counter[str] = collections.Counter()
    for (_at, src, _dst, size), payload in zip(c.sent_log, c._payloads, strict=True):
        kind = type(decode(payload)).__name__
        agent[kind] += size
        wire[kind] += on_wire(src, payload)
    scale = window * nodes
    kinds = ", ".join(f"{k} {v / scale:.0f}" for k, v in wire.most_common())
    return (
        f"{preset}: {nodes} nodes, {running}/{tasks} running: "
        f"{sum(wire.values()) / scale:.0f} B/s per node on the wire"
        f" ({sum(agent.values()) / scale:.0f} of agent messages;"
        f" {len(c.sent_log) / scale:.1f} messages/s; on the wire by kind: {kinds});"
        f" harness CPU {100 * cpu / window:.1f} % of a core for all {nodes} agents"
        f" (load {os.getloadavg()[0]:.2f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=("lan", "wan", "local"), default="lan")
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--tasks", type=int, nargs="+", default=[1000])
    parser.add_argument("--settle", type=float, default=60.0)
    parser.add_argument("--window", type=float, default=100.0)
    args = parser.parse_args()
    for tasks in args.tasks:
        print(measure(args.preset, args.nodes, tasks, args.settle, args.window), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
