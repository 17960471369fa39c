"""How fast the simulator runs big clusters (issue 2's speed targets), on one core.

    python benchmarks/sim_speed.py        # engine, 1,000 x 300 s no-fault and demo, 10,000 x 60 s
    python benchmarks/sim_speed.py --only small --profile
    python benchmarks/sim_speed.py --only demo
    python benchmarks/sim_speed.py --only demo --demo-members 300   # quicker comparisons
    python benchmarks/sim_speed.py --only targets   # the no-fault and the demo figures
    python benchmarks/sim_speed.py --compiled --only targets   # on the mypyc build

Targets: 1,000 members for 300 simulated seconds in under 60 s of CPU (one core), and
10,000 members for 60 simulated seconds in under 5 minutes. The real `swim.Membership`
runs every member (LAN preset, Lifeguard on, push-pull on). "small" and "large" start
primed (`formation.mode = "prime"`) and have no faults: the best case. "demo" is the
realistic case the 60 s target must also hold for: the shipped `demo` scenario at
1,000 members for 300 s (formation by joining, a crash, a slow member, updates, the
driver's reconnect loop, the envelope model, safety checks), timed whole, formation
included. Metrics are on everywhere. "engine" runs 1,000 x 300 s with a trivial
ping/ack core, to show what the engine itself costs. CPU seconds are the measure
(`time.process_time`): on a shared machine wall time mostly measures the others'
load; the load average is printed with each figure.

This machine's speed per CPU second varies from day to day (the same no-fault run took
11.5 s of CPU in one session and 27.4 s in another), so `--only targets` ends with the
demo scaled by the no-fault run against `NO_FAULT_REFERENCE_CPU`: an estimate of the
demo in the reference session's terms, to read next to the raw figure.

`--compiled` runs the same on the optional mypyc build (`simulations.compiled`:
swim/'s per-packet modules and the engine, the sources unchanged; built once under
build/mypyc, needs a C compiler), which gives the same digests.

Every member of an n-member cluster holds n entries, so memory grows as n^2 (about
40 bytes per pair with `swim.SharedView` priming: 4 GB at 10,000); the 10,000-member
run is skipped when that would not fit in the memory available, unless --force.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The run `--compiled` starts (`simulations.compiled.run_compiled`): the compiled build,
# imported instead of the sources (otherwise the root again).
sys.path.insert(0, os.environ.get("POPULI_MYPYC_BUILD") or sys.path[0])

from simulations import (
    Network,
    NetworkConfig,
    RunResult,
    Scenario,
    Simulator,
    child_rng,
    load_scenario,
    override,
    parse_scenario,
    run_once,
)
from simulations.cli import SCENARIOS
from swim import Address, Output, Send

_COMPILED = os.environ.get("POPULI_MYPYC_BUILD", "")


TARGETS = {"small": (1000, 300.0, 60.0), "large": (10000, 60.0, 300.0)}
#: CPU seconds of the primed no-fault run ("small") in the session the 60 s target was
#: last judged against (issue 8, third pass). This shared virtual machine's speed per
#: CPU second varies from day to day (2.4x slower in the fourth pass, for the same
#: code), so `--only targets` also prints the demo scaled by today's no-fault run.
NO_FAULT_REFERENCE_CPU = 11.5
#: CPU seconds of each run of this process, by label ("small", "demo").
_cpu: dict[str, float] = {}


class _PingCore:
    """A trivial core: one ping a second to a random member, which acks it."""

    def __init__(self, address: Address, rng: random.Random, now: float, peers: list[Address]):
        self.incarnation = 0
        self._rng = rng
        self._next = now + rng.random()
        self._peers = peers
        self._address = address

    def receive(
        self, source: Address, payload: bytes, now: float, *, reliable: bool = False
    ) -> list[Output]:
        return [Send(source, b"\x02" + payload[1:])] if payload[0] == 1 else []

    def tick(self, now: float) -> list[Output]:
        if now < self._next:
            return []
        self._next += 1.0
        peer = self._peers[self._rng.randrange(len(self._peers))]
        return [Send(peer, b"\x01" + b"x" * 60)]

    def next_deadline(self) -> float:
        return self._next

    def join(self, seeds: Sequence[Address], now: float) -> list[Output]:
        return []

    def leave(self, now: float) -> list[Output]:
        return []

    def set_meta(self, meta: bytes, now: float) -> list[Output]:
        return []

    def send_failed(self, destination: Address, payload: bytes, now: float) -> list[Output]:
        return []


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _load() -> str:
    """The machine's load average, to read a figure taken on a shared machine by."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.1f} (5 min {five:.1f})"


def _available_mb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("inf")


def bench_engine(members: int = 1000, duration: float = 300.0) -> None:
    peers: list[Address] = []
    network = Network(NetworkConfig(), child_rng(1, "network"))
    sim = Simulator(
        seed=1,
        network=network,
        core_factory=lambda name, address, rng, now, inc: _PingCore(address, rng, now, peers),
    )
    for _ in range(members):
        sim.add_node()
    peers.extend(sim.addresses)
    for node in range(members):
        sim.start(node)
    start = time.perf_counter()
    sim.run_until(duration)
    wall = time.perf_counter() - start
    stats = sim.statistics()
    print(
        f"engine only: {members} members x {duration:g} s with a ping/ack core: {wall:.1f} s wall, "
        f"{stats.messages_sent:,} messages, {stats.events:,} events, "
        f"{wall / stats.messages_sent * 1e6:.2f} us per message (engine + trivial core)"
    )


def _scenario(members: int, duration: float) -> Scenario:
    return parse_scenario(
        {
            "name": f"bench-{members}",
            "members": members,
            "duration": duration,
            "seed": 1,
            "preset": "lan",
            "formation": {"mode": "prime", "settle": 0.0},
            "check": {"safety": False, "liveness": False},
            "driver": {"reconnect_interval": 0.0},
        }
    )


def bench_demo(*, profile: bool, members: int | None = None) -> RunResult:
    """The realistic case: the shipped demo scenario at 1,000 members x 300 s.

    `members` runs it at another size (300 turns around in a fifth of the time, for
    interleaved before/after comparisons); the target is then only informative.
    """
    default_members, duration, target = TARGETS["small"]
    members = members or default_members
    scenario = override(load_scenario(SCENARIOS / "demo.toml"), members=members, duration=duration)
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    cpu_start = time.process_time()
    if profiler is not None:
        profiler.enable()
    result = run_once(scenario)
    if profiler is not None:
        profiler.disable()
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    if members == default_members:
        _cpu["demo"] = cpu
    messages = result.engine["messages_sent"]
    verdict = "MEETS" if cpu < target else "MISSES"
    print(
        f"demo scenario: {members:,} members x {duration:g} s: {wall:.1f} s wall, {cpu:.1f} s "
        f"CPU ({verdict} the "
        f"{target:g} s target; formation by joining {result.formation_wall_seconds:.1f} s of "
        f"it, {result.formation_seconds or 0:.1f} s virtual), {messages:,} messages, "
        f"{wall / max(messages, 1) * 1e6:.0f} us per message all in, "
        f"digest {result.digest[:16]}, "
        f"{'ok' if result.ok else 'FAILED: ' + str(result.failure)}, {_load()}"
    )
    if profiler is not None:
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(25)
    return result


def bench_swim(label: str, *, profile: bool) -> RunResult:
    members, duration, target = TARGETS[label]
    cpu_start = time.process_time()
    result = bench_size(members, duration, target, profile=profile)
    _cpu[label] = time.process_time() - cpu_start
    return result


def calibrated() -> str | None:
    """The demo's CPU seconds scaled to the reference session by this session's primed
    no-fault run, or None unless both ran at 1,000 members (unprofiled)."""
    demo, small = _cpu.get("demo"), _cpu.get("small")
    if demo is None or small is None or small <= 0:
        return None
    factor = small / NO_FAULT_REFERENCE_CPU
    scaled = demo / factor
    target = TARGETS["small"][2]
    return (
        f"calibrated: the no-fault run took {small:.1f} s CPU against "
        f"{NO_FAULT_REFERENCE_CPU:g} s in the reference session ({factor:.2f}x); the demo's "
        f"{demo:.1f} s scaled by it: {scaled:.1f} s ({'MEETS' if scaled < target else 'MISSES'} "
        f"the {target:g} s target; an estimate, both runs on the same core and code)"
    )


def bench_size(members: int, duration: float, target: float, *, profile: bool) -> RunResult:
    scenario = _scenario(members, duration)
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    cpu_start = time.process_time()
    if profiler is not None:
        profiler.enable()
    result = run_once(scenario)
    if profiler is not None:
        profiler.disable()
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    messages = result.engine["messages_sent"]
    verdict = f"{'MEETS' if cpu < target else 'MISSES'} the {target:g} s target" if target else ""
    print(
        f"swim core: {members:,} members x {duration:g} s, primed, no faults: {wall:.1f} s wall, "
        f"{cpu:.1f} s CPU "
        f"({verdict}{', ' if verdict else ''}formation {result.formation_wall_seconds:.1f} s), "
        f"{messages:,} messages "
        f"({result.measures['messages_per_member_second']:.2f} per member per second), "
        f"{cpu / max(messages, 1) * 1e6:.0f} us CPU per message all in, "
        f"peak RSS {_rss_mb():,.0f} MB, {_load()}"
    )
    if profiler is not None:
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(25)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--only",
        choices=("engine", "small", "demo", "large", "targets"),
        help="one run; targets: the 1,000-member no-fault run and the demo",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the swim runs")
    parser.add_argument(
        "--demo-members",
        type=int,
        default=None,
        metavar="N",
        help="run the demo at N members instead of 1,000 (for quicker comparisons)",
    )
    parser.add_argument("--force", action="store_true", help="run 10,000 even if short of memory")
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="run on the mypyc build (`simulations.compiled`, built once under build/mypyc)",
    )
    parser.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="N:SECONDS",
        help="also run N members for SECONDS (repeatable), to see how the cost scales",
    )
    args = parser.parse_args(argv)
    if args.demo_members is not None and args.demo_members < 2:
        parser.error(f"--demo-members must be at least 2, got {args.demo_members}")
    if args.compiled and not _COMPILED:
        from simulations.compiled import run_compiled

        return run_compiled(__file__, list(sys.argv[1:] if argv is None else argv))
    if _COMPILED:
        import swim._membership

        print(f"compiled by mypyc: {swim._membership.__file__}")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as the target says
    print(f"python {sys.version.split()[0]}, pinned to one core, {os.cpu_count()} cores here")
    if args.size:
        for size in args.size:
            members, _, seconds = size.partition(":")
            bench_size(int(members), float(seconds or 60), 0.0, profile=args.profile)
        return 0
    if args.only in (None, "engine"):
        bench_engine()
    if args.only in (None, "small", "targets"):
        bench_swim("small", profile=args.profile)
    if args.only in (None, "demo", "targets"):
        bench_demo(profile=args.profile, members=args.demo_members)
        line = None if args.profile else calibrated()
        if line is not None:
            print(line)
    if args.only in (None, "large"):
        members = TARGETS["large"][0]
        # Each member holds every other. Primed from one swim.SharedView (records shared
        # copy-on-write) that is about 40 bytes per (member, member) pair: measured 39
        # at 2,000 members and 31 at 4,000. Leave a wide margin: the machine is shared,
        # and running out of memory takes others down too.
        need_mb = 40e-6 * members * members
        have_mb = _available_mb()
        if need_mb > 0.6 * have_mb and not args.force:
            print(
                f"swim core: {members:,} members x 60 s: SKIPPED: needs about "
                f"{need_mb / 1024:.0f} GiB (n^2 member entries), {have_mb / 1024:.0f} GiB "
                "available; --force to try anyway"
            )
        else:
            bench_swim("large", profile=args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
