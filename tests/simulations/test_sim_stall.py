"""The stall guard in whole runs: members starved of CPU in waves (the `stall` fault)."""

from __future__ import annotations

from typing import Any

from simulations import parse_scenario, run_once

#: A third of 24 members stalls for 3 s, every 3 s (a new random third each time),
#: and one member crashes in the middle of it.
STORM: dict[str, Any] = {
    "members": 24,
    "duration": 60.0,
    "fault": [
        {"kind": "stall", "at": 2.0, "count": 8, "duration": 3.0, "every": 3.0},
        {"kind": "crash", "at": 10.0, "members": [5]},
    ],
}


def storm(guard: bool, seed: int) -> Any:
    return run_once(
        parse_scenario(
            {"name": "stalls", "seed": seed, "swim": {"stall_guard_enabled": guard}, **STORM}
        )
    )


def test_stalled_accusers_declare_live_members_dead_only_without_the_guard() -> None:
    """The same seeds with and without the guard: without it the stalled members'
    late timers declare live members dead; with it (nearly) never, and the crash is
    declared dead by everybody in both."""
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
