"""Short human-readable reports of simulation results (the CLI and the demo print these)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._engine import name_for
from ._runner import RunResult

__all__ = ["format_report", "format_sweep"]


def _s(value: float | None, unit: str = "s") -> str:
    return "-" if value is None else f"{value:.2f} {unit}".rstrip()


def format_report(result: RunResult) -> str:
    """A few lines on one run: detections, false positives, traffic, convergence."""
    m = result.measures
    lines = _header_lines(result)
    lines.extend(_detection_lines(result))
    lines.extend(_false_positive_lines(m))
    lines.extend(_dissemination_lines(m, result.probe_interval))
    lines.extend(_traffic_lines(m))
    if "leases" in m:
        lines.extend(_lease_lines(m["leases"]))
    lines.append("  OK" if result.ok else f"  FAILED: {result.failure}")
    return "\n".join(lines)


def _header_lines(result: RunResult) -> list[str]:
    """What ran (scenario, size, Lifeguard, loss, seed), when it formed, the digest."""
    formed = (
        "did not form"
        if result.formation_seconds is None
        else f"formed at t={result.formation_seconds:.1f} s"
    )
    return [
        f"{result.scenario}: {result.members} members, Lifeguard "
        f"{'on' if result.lifeguard else 'off'}, loss {result.loss:g}, seed {result.seed}",
        f"  {formed}; timeline {result.duration:g} s of virtual time in "
        f"{result.wall_seconds:.1f} s wall; digest {result.digest[:16]}",
    ]


def _detection_lines(result: RunResult) -> list[str]:
    """One line per crash, sleep or leave: how long until the others knew."""
    period = result.probe_interval
    lines = []
    for d in result.measures["detections"]:
        who = name_for(d["node"])
        if d["kind"] == "crash":
            lines.append(
                f"  crash of {who} at t={d['at'] - _t0(result):.1f} s: suspected after "
                f"{_s(d['first_suspected_after'])}, declared dead after "
                f"{_s(d['first_detected_after'])} "
                f"({_periods(d['first_detected_after'], period)}), " + _by_all(d)
            )
        elif d["kind"] == "pause":
            outcome = (
                "declared dead by all"
                if d["outcome"] == "detected"
                else "woke before everybody declared it dead"
            )
            lines.append(
                f"  {who} slept at t={d['at'] - _t0(result):.1f} s: {outcome}"
                + (
                    f" after {_s(d['all_detected_after'])}"
                    if d["all_detected_after"] is not None
                    else ""
                )
            )
        elif d["kind"] == "leave":
            lines.append(
                f"  {who} left at t={d['at'] - _t0(result):.1f} s: everybody knew after "
                f"{_s(d['all_detected_after'])}"
            )
    return lines


def _false_positive_lines(m: dict[str, Any]) -> list[str]:
    """False positives, members the partition made dead, crashes left out of the means."""
    fp = m["false_positives"]
    lines = [
        f"  false positives: {fp['episodes_healthy']} healthy and {fp['episodes_slow']} slow "
        f"members declared dead ({fp['per_member_hour']:.3f} per member-hour), "
        f"{fp['suspicions']} false suspicions, {m['refutes']} refutes"
    ]
    if m["partitioned_declared_dead"]:
        lines.append(
            f"  {m['partitioned_declared_dead']} members declared dead by the other side of "
            "a partition (expected: they were unreachable)"
        )
    det = m["detection"]
    unmeasured = [
        (det.get("restarted_first", 0), "restarted before every member declared it dead"),
        (det.get("still_open", 0), "not yet declared dead by all when the run ended"),
        (det.get("first_unmeasured", 0), "never declared dead by anyone (no first time)"),
    ]
    for count, why in unmeasured:
        if count:
            lines.append(f"  {count} of {det['crashes']} crashes left out of the means: {why}")
    return lines


def _dissemination_lines(m: dict[str, Any], period: float) -> list[str]:
    """How long an update took to reach every member, and the updates not measured."""
    dis = m["dissemination"]
    if not dis["updates"]:
        return []
    measured = dis.get("measured", dis["updates"])
    lines = [
        f"  dissemination of an update to every member: mean {_s(dis['all_seen_mean'])} "
        f"({_periods(dis['all_seen_mean'], period)}), max {_s(dis['all_seen_max'])} "
        f"over {measured} of {dis['updates']} updates"
    ]
    for count, why in (
        (dis.get("publisher_down", 0), "publisher crashed, left or slept before all saw it"),
        (dis.get("still_open", 0), "still spreading when the run ended"),
    ):
        if count:
            lines.append(f"  {count} updates not measured: {why}")
    return lines


def _traffic_lines(m: dict[str, Any]) -> list[str]:
    """Messages and bytes per member per second, then each convergence measured."""
    sealed = m.get("sealed_bytes_per_member_second")
    lines = [
        f"  traffic: {m['messages_per_member_second']:.2f} messages and "
        f"{m['bytes_per_member_second']:.0f} bytes sent per member per second"
        + ("" if sealed is None else f" ({sealed:.0f} with the daemon's envelope)")
    ]
    for c in m["convergence"]:
        if c["label"] == "formation":
            continue
        after = c["converged_after"]
        lines.append(
            f"  convergence after {c['label']}: "
            + ("not reached" if after is None else f"{after:.2f} s")
        )
    return lines


def _lease_lines(m: dict[str, Any]) -> list[str]:
    """The lease agents' measures (scenarios with `[tasks]`)."""
    outcomes = ", ".join(f"{n} {k}" for k, n in sorted(m["outcomes"].items())) or "none"
    pending = ", ".join(f"{n} {k}" for k, n in sorted(m["pending"].items()))
    checks = ", ".join(f"{k} {v}" for k, v in m["invariants"].items())
    ends = ", ".join(f"{n} {k}" for k, n in sorted(m["execution_ends"].items()))
    lines = [
        f"  leases: {m['submitted']} tasks submitted, {m['acknowledged']} acknowledged: "
        f"{outcomes}"
        + (f"; not finished: {pending}" if pending else "")
        + (f"; {m['stranded']} without a live replica majority" if m["stranded"] else ""),
        f"  leases: invariant violations: {checks}"
        + ("" if m["checked_end"] else " (I3 and I4 not checked: the run did not drain)"),
        f"  leases: {m['executions']} executions ({ends}); first start after mean "
        f"{_s(m['first_start_mean'])}",
        f"  leases: owner crash to the task running again: {m['failovers']} failovers, "
        f"mean {_s(m['failover_mean'])}, max {_s(m['failover_max'])}"
        + (
            f" ({m['crashed_owners_not_failed_over']} crashed owners' tasks never ran again)"
            if m["crashed_owners_not_failed_over"]
            else ""
        ),
        f"  leases: {_b(m['lease_bytes_per_member_second'])} of lease payload received per "
        f"member per second (table deltas {m['lease_table_bytes']} B, agent messages "
        f"{m['lease_agent_bytes']} B, anti-entropy {m['lease_sync_bytes']} B); drained in "
        f"{_s(m['drain_seconds'])}",
    ]
    lines += [f"  leases: {v}" for v in m["violation_examples"]]
    return lines


def _b(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} B"


def format_sweep(results: Sequence[RunResult]) -> str:
    """One line per run of a sweep, as a table."""
    header = (
        f"{'members':>7} {'LG':>3} {'loss':>5} {'seed':>5} {'suspect':>8} {'dead':>7} "
        f"{'all':>7} {'update':>7} {'FP/m-h':>8} {'FP':>5} {'msg/m/s':>8} {'wall':>7}"
    )
    lines = [header, "  (detection and dissemination times in protocol periods)"]
    for r in results:
        m = r.measures
        det = m["detection"]
        period = r.probe_interval
        fp = m["false_positives"]
        lines.append(
            f"{r.members:>7} {'on' if r.lifeguard else 'off':>3} {r.loss:>5.2f} {r.seed:>5} "
            f"{_n(det['first_suspected_mean'], period):>8} "
            f"{_n(det['first_detected_periods_mean'], 1):>7} "
            f"{_n(det['all_detected_periods_mean'], 1):>7} "
            f"{_n(m['dissemination']['all_seen_periods_mean'], 1):>7} "
            f"{fp['per_member_hour']:>8.3f} "
            f"{fp['episodes_healthy'] + fp['episodes_slow']:>5} "
            f"{m['messages_per_member_second']:>8.2f} {r.wall_seconds:>6.1f}s"
            + ("" if r.ok else f"  FAILED: {r.failure}")
        )
    return "\n".join(lines)


def _by_all(d: dict[str, Any]) -> str:
    """The "by all" part of a crash line, or why it has no time."""
    if d["outcome"] == "returned":
        return f"restarted before all {d['observers']} observers declared it dead (not measured)"
    if d["all_detected_after"] is None:
        return f"not declared dead by all {d['observers']} observers when the run ended"
    return f"by all {d['observers']} observers after {_s(d['all_detected_after'])}"


def _t0(result: RunResult) -> float:
    """Virtual time at which the timeline started (samples are relative to it)."""
    measures: dict[str, Any] = result.measures
    return float(measures.get("window_start", 0.0))


def _periods(seconds: float | None, period: float) -> str:
    return "-" if seconds is None else f"{seconds / period:.2f} periods"


def _n(value: float | None, divisor: float) -> str:
    return "-" if value is None else f"{value / divisor:.2f}"
