"""`simulations._plot`: which figure suits the runs, and what each figure draws.

Each figure is drawn for real (Agg) from made-up results; the figure is caught before
it is closed, so the plotted numbers can be read back from its axes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from simulations import _plot
from simulations._metrics import Sample
from simulations._runner import RunResult
from swim._math import suspicion_timeout_min

PNG = b"\x89PNG\r\n\x1a\n"


def crash(first: float | None, every: float | None, **more: Any) -> dict[str, Any]:
    row = {
        "kind": "crash", "at": 10.0, "outcome": "detected", "first_suspected_after": 1.0,
        "first_detected_periods": first, "all_detected_periods": every,
        "dissemination_after_first": None if first is None or every is None else every - first,
    }  # fmt: skip
    row.update(more)
    return row


def result(members: int = 8, lifeguard: bool = True, **measures: Any) -> RunResult:
    base: dict[str, Any] = {
        "detections": [], "updates": [], "window_start": 5.0,
        "false_positives": {"episodes_healthy": 0, "episodes_slow": 0, "suspicions": 0,
                            "declarations": 0},
        "detection": {"first_detected_mean": None, "all_detected_mean": None},
    }  # fmt: skip
    base.update(measures)
    samples = tuple(
        Sample(t=float(t), members=members, wrong=0, suspects=0, messages=10 * t, bytes=0)
        for t in range(5)
    )
    return RunResult(
        scenario="s", seed=1, members=members, lifeguard=lifeguard, loss=0.0, duration=20.0,
        probe_interval=0.5, ok=True, failure=None, digest="0" * 32, wall_seconds=0.1,
        formation_wall_seconds=0.0, virtual_seconds=20.0, formation_seconds=1.0,
        liveness_seconds=None, measures=base, engine={}, config={"suspicion_mult": 4},
        samples=samples,
    )  # fmt: skip


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Every figure a plot function finished (it still closes them)."""
    caught: list[Figure] = []
    close = plt.close

    def keep(fig: Any = None) -> None:
        caught.append(fig)
        close(fig)

    monkeypatch.setattr(plt, "close", keep)
    return caught


def lines(fig: Figure, axis: int) -> dict[str, list[float]]:
    return {
        str(line.get_label()): [float(y) for y in line.get_ydata()]
        for line in fig.axes[axis].get_lines()
    }


@pytest.mark.parametrize(
    ("runs", "picked"),
    [
        ([result(8), result(16)], "plot_size_sweep"),
        ([result(8, lifeguard=True), result(8, lifeguard=False)], "plot_lifeguard"),
        ([result(8), result(8)], "plot_timeline"),
        ([result(8, True), result(16, False)], "plot_size_sweep"),  # size comes first
    ],
)
def test_the_figure_follows_what_varies(
    runs: list[RunResult], picked: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    called: list[str] = []
    for name in ("plot_size_sweep", "plot_lifeguard", "plot_timeline"):
        monkeypatch.setattr(_plot, name, lambda *a, name=name: called.append(name))
    _plot.plot_results(runs, "x.png")
    assert called == [picked]


def test_nothing_to_plot_is_an_error() -> None:
    with pytest.raises(ValueError, match="nothing to plot"):
        _plot.plot_results([], "x.png")


def test_the_size_sweep_plots_the_mean_over_runs_per_size(
    tmp_path: Path, figures: list[Figure]
) -> None:
    runs = [
        result(8, lifeguard=False, detections=[crash(1.0, 3.0), crash(2.0, 5.0)]),
        result(8, lifeguard=False, detections=[crash(3.0, None, outcome="open")]),
        result(32, lifeguard=False, detections=[crash(4.0, 6.0)],
               updates=[{"all_seen_periods": 2.5}, {"all_seen_periods": None}]),
    ]  # fmt: skip
    path = tmp_path / "sweep.png"
    _plot.plot_size_sweep(runs, path)
    assert path.read_bytes()[:8] == PNG
    (fig,) = figures
    left, right = lines(fig, 0), lines(fig, 1)
    assert left["first declared dead"] == [2.0, 4.0]  # (1+2+3)/3, then 4
    assert left["declared dead by all"] == [4.0, 6.0]  # the open crash has no "all"
    assert left["first suspicion"] == [2.0, 2.0]  # 1 s after, in 0.5 s periods
    assert left["SWIM: e/(e-1) = 1.58"][0] == pytest.approx(math.e / (math.e - 1))
    model = left["2 + 4 log10(n+1) (suspicion timeout)"]
    assert model == [2.0 + suspicion_timeout_min(4, n, 1.0) for n in (8, 32)]
    assert right["death rumor: first to all"] == [2.5, 2.0]  # detected crashes only
    update = right["update reaches all"]
    assert math.isnan(update[0]) and update[1] == 2.5  # no update at 8: a gap


def test_the_size_sweep_labels_both_lifeguard_settings(figures: list[Figure]) -> None:
    runs = [result(n, lg, detections=[crash(1.0, 2.0)]) for n in (8, 16) for lg in (True, False)]
    _plot.plot_size_sweep(runs, Path("/dev/null"))
    labels = set(lines(figures[0], 0))
    assert {"first declared dead (Lifeguard on)", "first declared dead (Lifeguard off)"} <= labels


def test_the_lifeguard_figure_sums_false_positives_per_setting(
    tmp_path: Path, figures: list[Figure]
) -> None:
    def fp(healthy: int, slow: int) -> dict[str, int]:
        return {"episodes_healthy": healthy, "episodes_slow": slow, "suspicions": 7,
                "declarations": 0}  # fmt: skip

    detection = {"first_detected_mean": 2.0, "all_detected_mean": 3.0}
    runs = [
        result(8, True, false_positives=fp(0, 1), detection=detection),
        result(8, False, false_positives=fp(3, 2), detection=detection),
        result(8, False, false_positives=fp(1, 0),
               detection={"first_detected_mean": 4.0, "all_detected_mean": None}),
    ]  # fmt: skip
    path = tmp_path / "lg.png"
    _plot.plot_lifeguard(runs, path)
    assert path.read_bytes()[:8] == PNG
    (fig,) = figures
    left, right = fig.axes
    bars = {str(c.get_label()): [p.get_height() for p in c.patches] for c in left.containers}
    # On first, then off; a zero is drawn at 0.5 to show on the log scale.
    assert bars["healthy members declared dead"] == [0.5, 4.0]
    assert bars["slow members declared dead"] == [1.0, 2.0]
    assert bars["false suspicions"] == [7.0, 14.0]
    assert bars["false 'dead' notifications"] == [0.5, 0.5]
    texts = [t.get_text() for t in left.texts]
    assert texts.count("0") == 3  # the true zeros are annotated as zeros
    heights = {str(c.get_label()): [p.get_height() for p in c.patches] for c in right.containers}
    assert heights["first declared dead"] == [2.0, 3.0]
    assert heights["declared dead by all"] == [3.0, 3.0]
    assert [t.get_text() for t in left.get_xticklabels()] == [
        "Lifeguard on",
        "Lifeguard off (SWIM)",
    ]


def test_the_timeline_plots_samples_and_marks_real_failures(
    tmp_path: Path, figures: list[Figure]
) -> None:
    run = result(4, detections=[crash(1.0, 2.0, at=7.5)])
    path = tmp_path / "t.png"
    _plot.plot_timeline(run, path)
    assert path.read_bytes()[:8] == PNG
    (fig,) = figures
    top, bottom = fig.axes
    marks = [ln for ln in top.get_lines() if ln.get_linestyle() == "--"]
    assert [float(ln.get_xdata()[0]) for ln in marks] == [2.5]  # at 7.5, window from 5
    (rate,) = bottom.get_lines()
    # 10 messages a second over 4 members.
    assert [float(y) for y in rate.get_ydata()] == [2.5, 2.5, 2.5, 2.5]
    assert "s: 4 members, Lifeguard on, seed 1" in top.get_title()


def test_the_small_helpers() -> None:
    assert _plot._mean([None, 1.0, 3.0]) == 2.0 and _plot._mean([None]) is None
    assert _plot._div(3.0, 2.0) == 1.5 and _plot._div(None, 2.0) is None
    assert _plot._nan([1.0, None])[0] == 1.0 and math.isnan(_plot._nan([None])[0])
