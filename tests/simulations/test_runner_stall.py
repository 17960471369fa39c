"""The stall guard in whole runs: members starved of CPU in waves (the `stall` fault)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from simulations import load_scenario, run_once

#: Every 3 s a new random 8 of 24 members stall for 3 s; one member crashes at 10 s.
STORM = load_scenario(Path(__file__).parents[2] / "simulations" / "scenarios" / "stall-storm.toml")


def storm(guard: bool, seed: int) -> Any:
    return run_once(attrs.evolve(STORM, seed=seed, swim={"stall_guard_enabled": guard}))


def test_stalled_accusers_declare_live_members_dead_only_without_the_guard() -> None:
    """The same seeds with and without the guard: without it stalled members declare
    live members dead; with it (nearly) never, and the crash is declared dead by
    everybody in both."""
    declared = {True: 0, False: 0}
    for seed in (1, 2, 3):
        for guard in (True, False):
            result = storm(guard, seed)
            assert result.ok, result.failure
            declared[guard] += result.measures["false_positives"]["declarations"]
            (crash,) = [d for d in result.measures["detections"] if d["kind"] == "crash"]
            assert crash["outcome"] == "detected"
            assert crash["observers"] == 23
    assert declared[False] >= 20
    assert declared[True] * 10 <= declared[False]
