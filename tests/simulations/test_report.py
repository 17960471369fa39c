"""Measures that cannot be taken are counted and shown, never silently dropped."""

from __future__ import annotations

from typing import Any

from simulations import RunResult, format_report, parse_scenario, run_once

PRIMED: dict[str, Any] = {
    "name": "t",
    "members": 24,
    "seed": 1,
    "formation": {"mode": "prime", "settle": 1.0},
    "network": {"latency_min": 0.0005, "latency_mean": 0.002},
    "check": {"safety": False},
}


def run(**fields: Any) -> RunResult:
    data = dict(PRIMED)
    data.update(fields)
    result = run_once(parse_scenario(data))
    assert result.ok, result.failure
    return result


def test_a_crash_declared_dead_after_the_timeline_still_has_a_first_time() -> None:
    # Crashed 1 s before the timeline ends: declared dead in the liveness phase. The
    # "by all" time was measured there; the first declaration must be too.
    result = run(duration=10.0, fault=[{"kind": "crash", "at": 9.0}])
    (crash,) = [d for d in result.measures["detections"] if d["kind"] == "crash"]
    assert crash["all_detected_after"] is not None
    assert crash["first_detected_after"] is not None
    assert 0 < crash["first_detected_after"] <= crash["all_detected_after"]
    assert result.measures["detection"]["first_detected_mean"] is not None
    assert "declared dead after - " not in format_report(result)


def test_an_update_whose_publisher_crashes_is_counted_and_shown() -> None:
    result = run(
        duration=20.0,
        fault=[
            {"kind": "update", "at": 2.0, "members": [5]},
            {"kind": "crash", "at": 2.01, "members": [5]},
            {"kind": "update", "at": 4.0, "members": [7]},
        ],
    )
    dissemination = result.measures["dissemination"]
    assert dissemination["updates"] == 2
    assert dissemination["measured"] == 1
    assert dissemination["publisher_down"] == 1
    outcomes = sorted(u["outcome"] for u in result.measures["updates"])
    assert outcomes == ["publisher down", "seen"]
    report = format_report(result)
    assert "over 1 of 2 updates" in report
    assert "1 updates not measured: publisher crashed" in report


def test_a_crash_restarted_before_everyone_noticed_is_counted_and_shown() -> None:
    result = run(duration=20.0, fault=[{"kind": "crash", "at": 2.0, "restart_after": 1.0}])
    detection = result.measures["detection"]
    assert detection["crashes"] == 1
    assert detection["restarted_first"] == 1
    assert detection["all_detected_mean"] is None
    report = format_report(result)
    assert "restarted before all" in report
    assert "1 of 1 crashes left out of the means: restarted" in report
