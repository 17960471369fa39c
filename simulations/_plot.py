"""PNG plots of simulation results (matplotlib, Agg backend: no display needed).

`plot_results` picks the figure from what varies across the runs: a size sweep gets
the SWIM-paper figure (detection and dissemination in protocol periods against the
cluster size), a Lifeguard on/off comparison gets the Lifeguard-paper figure (false
positives), and a single run gets its timeline.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from swim._math import suspicion_timeout_min

from ._runner import RunResult

__all__ = ["plot_lifeguard", "plot_results", "plot_size_sweep", "plot_timeline"]

#: SWIM paper, section 3.1: expected time to first detection, in protocol periods.
SWIM_EXPECTED_DETECTION = math.e / (math.e - 1)
#: The same in continuous time, for memberlist-style probing: about one period until
#: some member first pings the dead one, plus the probe round (one period) before the
#: failed probe turns into a suspicion. See docs/simulations.md.
EXPECTED_FIRST_SUSPICION = 2.0


def plot_results(results: Sequence[RunResult], path: str | Path) -> None:
    """Write the figure that suits `results` to `path` (PNG)."""
    if not results:
        raise ValueError("nothing to plot")
    if len({r.members for r in results}) > 1:
        plot_size_sweep(results, path)
    elif len({r.lifeguard for r in results}) > 1:
        plot_lifeguard(results, path)
    else:
        plot_timeline(results[0], path)


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def plot_size_sweep(results: Sequence[RunResult], path: str | Path) -> None:
    """Detection and dissemination time (protocol periods) against cluster size."""
    by_size: dict[tuple[int, bool], list[RunResult]] = defaultdict(list)
    for r in results:
        by_size[(r.members, r.lifeguard)].append(r)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for lifeguard in sorted({r.lifeguard for r in results}, reverse=True):
        sizes = sorted(n for n, lg in by_size if lg == lifeguard)
        label = "" if len({r.lifeguard for r in results}) == 1 else (
            " (Lifeguard on)" if lifeguard else " (Lifeguard off)"
        )
        series: dict[str, list[float | None]] = defaultdict(list)
        for n in sizes:
            runs = by_size[(n, lifeguard)]
            period = runs[0].probe_interval
            crashes = [d for r in runs for d in r.measures["detections"] if d["kind"] == "crash"]
            series["suspect"].append(
                _mean([_div(d["first_suspected_after"], period) for d in crashes])
            )
            series["dead"].append(_mean([d["first_detected_periods"] for d in crashes]))
            series["all"].append(_mean([d["all_detected_periods"] for d in crashes]))
            detected = [d for d in crashes if d["outcome"] == "detected"]
            series["spread"].append(_mean([d["dissemination_after_first"] for d in detected]))
            updates = [u for r in runs for u in r.measures["updates"]]
            series["update"].append(_mean([u["all_seen_periods"] for u in updates]))
        left.plot(sizes, _nan(series["suspect"]), "o-", label="first suspicion" + label)
        left.plot(sizes, _nan(series["dead"]), "s-", label="first declared dead" + label)
        left.plot(sizes, _nan(series["all"]), "^-", label="declared dead by all" + label)
        right.plot(sizes, _nan(series["update"]), "o-", label="update reaches all" + label)
        right.plot(
            sizes, _nan(series["spread"]), "s--", label="death rumor: first to all" + label
        )
    left.axhline(
        SWIM_EXPECTED_DETECTION, color="grey", linestyle=":", label="SWIM: e/(e-1) = 1.58"
    )
    left.axhline(
        EXPECTED_FIRST_SUSPICION,
        color="tab:blue",
        linestyle=":",
        alpha=0.6,
        label="first ping (~1 period) + a probe round: <= 2",
    )
    plain = [r for r in results if not r.lifeguard and r.config]
    if plain:
        sizes = sorted({r.members for r in plain})
        mult = plain[0].config["suspicion_mult"]
        # In protocol periods: the core's own formula with a probe interval of 1.
        model = [EXPECTED_FIRST_SUSPICION + suspicion_timeout_min(mult, n, 1.0) for n in sizes]
        left.plot(
            sizes,
            model,
            color="tab:orange",
            linestyle=":",
            alpha=0.7,
            label=f"2 + {mult} log10(n+1) (suspicion timeout)",
        )
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("members")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    left.set_ylabel("protocol periods after the crash")
    left.set_ylim(bottom=0)
    left.set_title("Failure detection")
    right.set_ylabel("protocol periods")
    right.set_title("Dissemination")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_lifeguard(results: Sequence[RunResult], path: str | Path) -> None:
    """False positives and detection time, Lifeguard on against off."""
    groups: dict[bool, list[RunResult]] = defaultdict(list)
    for r in results:
        groups[r.lifeguard].append(r)
    keys = sorted(groups, reverse=True)
    labels = ["Lifeguard on" if k else "Lifeguard off (SWIM)" for k in keys]

    def total(runs: list[RunResult], field: str) -> float:
        return float(sum(r.measures["false_positives"][field] for r in runs))

    fp_healthy = [total(groups[k], "episodes_healthy") for k in keys]
    fp_slow = [total(groups[k], "episodes_slow") for k in keys]
    suspicions = [total(groups[k], "suspicions") for k in keys]
    declarations = [total(groups[k], "declarations") for k in keys]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = range(len(keys))
    width = 0.2
    for offset, values, label in (
        (-1.5, fp_healthy, "healthy members declared dead"),
        (-0.5, fp_slow, "slow members declared dead"),
        (0.5, suspicions, "false suspicions"),
        (1.5, declarations, "false 'dead' notifications"),
    ):
        bars = left.bar([i + offset * width for i in x], [max(v, 0.5) for v in values], width,
                        label=label)
        for bar, value in zip(bars, values, strict=True):
            left.annotate(f"{value:g}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                          ha="center", va="bottom", fontsize=7)
    left.set_yscale("log")
    left.set_ylim(0.4, max([*fp_healthy, *fp_slow, *suspicions, *declarations, 1.0]) * 8)
    left.set_xticks(list(x), labels)
    left.set_ylabel("count over all runs (log)")
    left.set_title("False positives with slow members")
    left.legend(fontsize=7, loc="upper left", ncols=2)
    detect = [
        _mean([r.measures["detection"]["first_detected_mean"] for r in groups[k]]) for k in keys
    ]
    every = [
        _mean([r.measures["detection"]["all_detected_mean"] for r in groups[k]]) for k in keys
    ]
    right.bar([i - 0.15 for i in x], _nan(detect), 0.3, label="first declared dead")
    right.bar([i + 0.15 for i in x], _nan(every), 0.3, label="declared dead by all")
    right.set_xticks(list(x), labels)
    right.set_ylabel("seconds after a real crash")
    right.set_title("Detection of real crashes")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(result: RunResult, path: str | Path) -> None:
    """One run over time: disagreement, suspicions and traffic, with the faults marked."""
    samples: dict[str, list[Any]] = result.as_dict()["samples"]
    t = samples["t"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    top.plot(t, samples["wrong"], label="wrong beliefs (observer, member) pairs")
    top.plot(t, samples["suspects"], label="suspicions held")
    top.set_yscale("symlog")
    top.set_ylabel("count")
    top.set_title(
        f"{result.scenario}: {result.members} members, Lifeguard "
        f"{'on' if result.lifeguard else 'off'}, seed {result.seed}"
    )
    start = result.measures.get("window_start", 0.0)
    for d in result.measures["detections"]:
        top.axvline(d["at"] - start, color="red", alpha=0.4, linestyle="--")
    top.legend(fontsize=8)
    top.grid(True, alpha=0.3)
    rates = []
    for i in range(1, len(t)):
        members = max(samples["members"][i], 1)
        span = max(t[i] - t[i - 1], 1e-9)
        rates.append((samples["messages"][i] - samples["messages"][i - 1]) / members / span)
    bottom.plot(t[1:], rates)
    bottom.set_ylabel("messages / member / s")
    bottom.set_xlabel("seconds since the cluster formed (red: real failures)")
    bottom.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _div(value: float | None, divisor: float) -> float | None:
    return None if value is None else value / divisor


def _nan(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in values]
