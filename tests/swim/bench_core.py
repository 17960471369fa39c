"""Throughput of the swim core alone: N cores through an in-memory queue, no loss.

Not a test (pytest does not collect it). Run from the repository root:

    PYTHONPATH=. .venv/bin/python tests/swim/bench_core.py --members 1000 --duration 300

The cores start from a converged view (`SharedView` + `prime`), every datagram takes
1 ms, and the loop is the leanest driver possible, so the figures are the core's cost:
the simulator's own engine adds to them.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import heapq
import pstats
import random
import time

from swim import Member, Membership, MemberState, Output, Send, SharedView, SwimConfig


def run(members: int, duration: float, profile: bool) -> None:
    config = SwimConfig.lan()
    rng = random.Random(1)
    cores: list[Membership] = []
    for i in range(members):
        address = (f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}", 7946)
        cores.append(
            Membership(config, f"node-{i}", address, random.Random(rng.getrandbits(64)), 0.0)
        )
    by_address = {core.address: index for index, core in enumerate(cores)}
    started = time.perf_counter()
    view = SharedView([Member(c.name, c.address, MemberState.ALIVE, 0) for c in cores], 0.0)
    for core in cores:
        core.prime(view, 0.0)
    primed = time.perf_counter() - started
    gc.collect()
    gc.freeze()  # the views are long-lived: keep the cyclic collector off them

    # (time, counter, core index, payload or None for a tick, reliable)
    heap: list[tuple[float, int, int, bytes | None, bool]] = []
    scheduled: dict[int, float] = {}
    counter = 0
    now = 0.0

    def reschedule(index: int) -> None:
        nonlocal counter
        deadline = cores[index].next_deadline()
        if deadline is not None and scheduled.get(index) != deadline:
            scheduled[index] = deadline
            counter += 1
            heapq.heappush(heap, (deadline, counter, index, None, False))

    def route(outputs: list[Output]) -> None:
        nonlocal counter
        for output in outputs:
            if type(output) is Send:
                counter += 1
                destination = by_address[output.destination]
                heapq.heappush(
                    heap, (now + 0.001, counter, destination, output.payload, output.reliable)
                )

    for index in range(members):
        reschedule(index)
    packets = ticks = 0
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    started = time.perf_counter()
    while heap and heap[0][0] <= duration:
        now, _, index, payload, reliable = heapq.heappop(heap)
        core = cores[index]
        if payload is None:
            if scheduled.get(index) != now:
                continue  # superseded
            del scheduled[index]
            ticks += 1
            route(core.tick(now))
        else:
            packets += 1
            route(core.receive(("10.255.255.255", 1), payload, now, reliable=reliable))
        reschedule(index)
    wall = time.perf_counter() - started
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    print(
        f"members={members} simulated={duration:.0f}s prime={primed:.2f}s wall={wall:.2f}s "
        f"packets={packets} ticks={ticks} packets/s={packets / wall:.0f} "
        f"calls/s={(packets + ticks) / wall:.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    run(args.members, args.duration, args.profile)


if __name__ == "__main__":
    main()
