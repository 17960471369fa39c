"""`python -m simulations.churn --seed N`: a VOPR-style swarm of random scenarios.

Each seed makes swarm-style choices, as TigerBeetle's VOPR does: cluster size, loss,
latency, duplication, partition mode (none, symmetric, one-way) with stability windows
between partitions, churn rates, sleepers and slow members, Lifeguard on or off, and
BUGGIFY-style core faults (a gossip round that reaches a single member, a refute that
is dropped) through the core's injected `faults` hooks. The run checks safety at every
step and demands convergence after everything heals. A failure prints the seed:

    python -m simulations.churn --seed 1234 --count 100     # a swarm of 100 seeds
    python -m simulations.churn --seed 1291                 # reproduce one of them

CI runs a handful of fixed seeds (tests/simulations); long swarms are this script.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from typing import Any

from swim import Address, DecodeCache, Membership

from ._engine import Core, CoreFactory
from ._rng import child_rng
from ._runner import RunResult, run_once, swim_config
from ._scenario import Scenario, parse_scenario

__all__ = ["Buggify", "main", "swarm_scenario"]


class Buggify:
    """The simulation-only fault hooks handed to one core (`swim.Faults`).

    Every answer comes from this node's own generator, so the core's injected rng
    draws the same numbers with or without BUGGIFY.
    """

    def __init__(self, rng: random.Random, *, fanout_one: float, drop_refute: float) -> None:
        self._rng = rng
        self._fanout_one = fanout_one
        self._drop_refute = drop_refute

    def gossip_fanout(self, fanout: int) -> int:
        return 1 if self._rng.random() < self._fanout_one else fanout

    def drop_refute(self) -> bool:
        return self._rng.random() < self._drop_refute


def swarm_scenario(seed: int, *, duration: float = 120.0) -> tuple[Scenario, dict[str, Any]]:
    """The random scenario of `seed`, and the BUGGIFY probabilities it runs with."""
    rng = child_rng(seed, "swarm")
    members = rng.choice([3, 5, 8, 12, 16, 24, 32])
    latency_min = rng.choice([0.0002, 0.001, 0.005])
    data: dict[str, Any] = {
        "name": f"swarm-{seed}",
        "description": "A random scenario of the VOPR-style swarm.",
        "seed": seed,
        "members": members,
        "duration": duration,
        "lifeguard": rng.random() < 0.7,
        "network": {
            "latency_min": latency_min,
            "latency_mean": latency_min + rng.choice([0.0005, 0.003, 0.02, 0.08]),
            "latency_spread": rng.choice([0.0, 0.0, 0.005, 0.02]),
            "loss": rng.choice([0.0, 0.0, 0.01, 0.05, 0.15]),
            "duplicate": rng.choice([0.0, 0.0, 0.01, 0.05]),
        },
        "fault": [],
        "partition": [],
        "check": {"safety": True, "liveness": True, "liveness_bound": 400.0},
    }
    mode = rng.choice(["none", "none", "symmetric", "one-way"])
    if mode != "none":
        at = rng.uniform(5.0, 20.0)
        while at < duration - 10.0:
            lasts = rng.uniform(2.0, 60.0)
            data["partition"].append(
                {
                    "at": at,
                    "heal": min(at + lasts, duration),
                    "groups": [rng.uniform(0.2, 0.8), 1.0],
                    "one_way": mode == "one-way",
                }
            )
            at += lasts + rng.uniform(10.0, 60.0)  # a stability window before the next
    if rng.random() < 0.5:
        data["churn"] = {
            "joins_per_minute": rng.choice([0.0, 1.0, 5.0]),
            "leaves_per_minute": rng.choice([0.0, 1.0, 3.0]),
            "crashes_per_minute": rng.choice([0.0, 1.0, 3.0, 10.0]),
            "restart_after": rng.choice([5.0, 30.0]),
            "min_members": min(3, members),
        }
    for _ in range(rng.randrange(3)):
        data["fault"].append(
            {"kind": "pause", "at": rng.uniform(0, duration), "duration": rng.uniform(1, 90)}
        )
    for _ in range(rng.randrange(3)):
        data["fault"].append(
            {
                "kind": "slow",
                "at": rng.uniform(0, duration),
                "delay": rng.uniform(0.1, 3.0),
                "duration": rng.uniform(5, 60),
            }
        )
    data["fault"].append({"kind": "update", "at": 1.0, "every": rng.uniform(5, 30)})
    buggify = {
        "fanout_one": rng.choice([0.0, 0.1, 0.5]),
        "drop_refute": rng.choice([0.0, 0.05, 0.3]),
    }
    return parse_scenario(data, source=f"swarm seed {seed}"), buggify


def _factory(scenario: Scenario, buggify: dict[str, Any]) -> CoreFactory:
    config = swim_config(scenario)
    cache = DecodeCache()  # shared by the run's cores, as in `swim_factory`

    def make(
        name: str, address: Address, rng: random.Random, now: float, incarnation: int
    ) -> Core:
        hooks = Buggify(child_rng(scenario.seed, "buggify", name, incarnation), **buggify)
        return Membership(
            config,
            name,
            address,
            rng,
            now,
            incarnation=incarnation,
            faults=hooks,
            decode_cache=cache,
        )

    return make


def run_seed(seed: int, *, duration: float = 120.0) -> RunResult:
    """Run the swarm scenario of `seed`."""
    scenario, buggify = swarm_scenario(seed, duration=duration)
    return run_once(scenario, core_factory=_factory(scenario, buggify))


def _describe(scenario: Scenario) -> str:
    net = scenario.network
    return (
        f"{scenario.members} members, loss {net.loss:g}, latency {net.latency_mean * 1000:.1f} ms, "
        f"{len(scenario.partitions)} partitions, churn {'on' if scenario.churn else 'off'}, "
        f"Lifeguard {'on' if scenario.lifeguard else 'off'}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations.churn", description=__doc__)
    parser.add_argument("--seed", type=int, required=True, help="first seed of the swarm")
    parser.add_argument("--count", type=int, default=1, help="how many seeds to run")
    parser.add_argument("--duration", type=float, default=120.0, help="timeline seconds")
    args = parser.parse_args(argv)
    if args.count < 1 or args.duration < 0:
        parser.error("--count must be >= 1 and --duration >= 0")
    failed = 0
    for seed in range(args.seed, args.seed + args.count):
        scenario, _ = swarm_scenario(seed, duration=args.duration)
        result = run_seed(seed, duration=args.duration)
        status = "ok" if result.ok else f"FAILED: {result.failure}"
        print(
            f"seed {seed}: {_describe(scenario)}: {status} "
            f"[{result.wall_seconds:.1f}s, digest {result.digest[:12]}]",
            flush=True,
        )
        failed += not result.ok
    if failed:
        print(f"{failed} of {args.count} seeds failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
