"""What one Prometheus scrape of a node costs: milliseconds per ``GET /metrics`` body.

Run: ``python benchmarks/metrics_bench.py [--members N] [--gpus G] [--scrapes K]``.
Printed, not asserted. The target (issue 12) is under 5 ms per scrape at 100 members.
It times `MetricsService.render()` with the node's real collector over N member
snapshots (every third with an RTT bucket spread, a few suspect and dead), G GPUs in the
local report, and counters of the sizes a busy node has: the work a scrape does, without
the HTTP round trip on the unix socket (hypercorn's, the same for every endpoint).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import attrs

from overlay.inbox import InboxStatistics
from overlay.tcp import TcpStatistics
from overlay.transport import TransportStatistics
from overlay.udp import UdpStatistics
from populi_p2p.driver import DriverStatistics
from populi_p2p.gpu import GIB, GpuDevice, HardwareFacts, Source, Vendor, build_report
from populi_p2p.observe import MetricSources, MetricsService, NodeCollector
from swim import Member, MembershipStatistics, MemberState


def counters(cls: Any, rng: random.Random) -> Any:
    values = {}
    for f in attrs.fields(cls):
        values[f.name] = () if "tuple" in str(f.type) else rng.randrange(10**9)
    return cls(**values)


def node(members: int, gpus: int, seed: int = 1) -> MetricsService:
    rng = random.Random(seed)
    states = [MemberState.ALIVE] * 8 + [MemberState.SUSPECT, MemberState.DEAD]
    snapshot = [
        Member(f"node-{i:04d}", ("100.64.0.1", 7946 + i), rng.choice(states), rng.randrange(9),
               rtt=rng.uniform(0.0002, 0.3) if i % 3 else None)
        for i in range(members)
    ]  # fmt: skip
    facts = HardwareFacts(
        devices=tuple(
            GpuDevice(index=i, uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3",
                      vendor=Vendor.NVIDIA, source=Source.NVML, memory_total=80 * GIB,
                      memory_used=rng.randrange(80 * GIB), utilization_gpu=rng.randrange(100),
                      temperature_c=rng.randrange(30, 80))
            for i in range(gpus)
        )
    )  # fmt: skip
    report = build_report(facts)
    swim = counters(MembershipStatistics, rng)
    transport = TransportStatistics(
        local_address=("100.64.0.1", 7946),
        udp=counters(UdpStatistics, rng),
        tcp=counters(TcpStatistics, rng),
        inbox=InboxStatistics((0, 0), (0, 0), (5, 9), (1, 2), (5, 9)),
        udp_blocked_peers=(),
    )
    auth = {r: rng.randrange(1000) for r in ("bad_mac", "replay", "stale", "unknown_sender")}
    service = MetricsService()
    service.register(
        NodeCollector(
            MetricSources(
                node_id="node-0000", name="bench", members=lambda: snapshot,
                awareness=lambda: 1, swim=lambda: swim,
                driver=lambda: counters(DriverStatistics, rng),
                transport=lambda: transport, traffic=lambda: (10**12, 10**12),
                auth_drops=lambda: auth, record_drops=lambda: {"bad_signature": 3},
                gpu_report=lambda: report,
                event_counts=lambda: {"member.joined": members, "member.dead": 7},
            )
        )
    )  # fmt: skip
    return service


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=300)
    args = parser.parse_args()
    for members in sorted({10, args.members, 1000}):
        service = node(members, args.gpus)
        body = service.render()
        times = []
        for _ in range(args.scrapes):
            start = time.perf_counter()
            service.render()
            times.append((time.perf_counter() - start) * 1000)
        times.sort()
        p99 = times[int(len(times) * 0.99) - 1]
        print(
            f"{members:5d} members, {args.gpus} GPUs: scrape median"
            f" {statistics.median(times):.3f} ms, p99 {p99:.3f} ms,"
            f" {len(body)} bytes, {len(body.splitlines())} lines"
        )


if __name__ == "__main__":
    main()
