"""`python -m simulations.demo`: a simulated 200-member cluster, one crash, one slow member.

This is what `make demo` shows until the real mesh exists: the shipped `demo`
scenario (simulations/scenarios/demo.toml), run with Lifeguard on and then off, and
printed as a short report: how fast the crash was detected, whether the slow member
got healthy members declared dead, what the protocol costs per member, and whether
the cluster converged once the faults healed.

    python -m simulations.demo [--seed N] [--members N] [--lifeguard-only]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._report import format_report
from ._runner import run_once
from ._scenario import load_scenario, override
from .cli import SCENARIOS

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations.demo", description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="root seed (default: 7)")
    parser.add_argument("--members", type=int, default=None, help="cluster size (default 200)")
    parser.add_argument(
        "--lifeguard-only", action="store_true", help="skip the SWIM-baseline comparison run"
    )
    args = parser.parse_args(argv)
    if args.members is not None and args.members < 2:
        parser.error("--members must be at least 2")
    scenario = load_scenario(SCENARIOS / "demo.toml")
    scenario = override(scenario, seed=args.seed, members=args.members)
    print(
        f"populi simulated cluster: {scenario.members} members on a LAN, one crash at "
        f"t=20 s, one member slow for 60 s (handles messages 1-2 s late).\n"
        "Same seed, same run: the digest below is reproducible.\n"
    )
    failures = 0
    for lifeguard in (True,) if args.lifeguard_only else (True, False):
        result = run_once(override(scenario, lifeguard=lifeguard))
        title = "Lifeguard on (populi's default)" if lifeguard else "Lifeguard off (plain SWIM)"
        print(f"== {title}")
        print(format_report(result))
        print()
        failures += not result.ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
