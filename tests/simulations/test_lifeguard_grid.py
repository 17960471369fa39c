"""`python -m simulations.lifeguard_grid`: its cells, its table and its arguments.

A real (small) grid runs in test_seeds.py; here the runs are stood in for, so each
cell's scenario, each printed row and each argument check is seen on its own.
"""

from __future__ import annotations

import argparse
from typing import Any

import attrs
import pytest

from simulations import lifeguard_grid
from simulations._scenario import load_scenario
from simulations._seeds import MEASURES, SeedSummary
from simulations.cli import SCENARIOS
from simulations.lifeguard_grid import COLUMNS, _cell, _counts, grid_scenario

BASE = load_scenario(SCENARIOS / "lifeguard-slow.toml")


def test_every_column_is_a_measure_the_seeds_summarize() -> None:
    assert set(COLUMNS) <= set(MEASURES)


@pytest.mark.parametrize("lifeguard", [False, True])
def test_a_cell_slows_k_members_and_sets_lifeguard_and_nothing_else(lifeguard: bool) -> None:
    cell = grid_scenario(BASE, 4, lifeguard)
    assert cell.lifeguard is lifeguard
    assert [(f.kind, f.count) for f in cell.faults if f.kind == "slow"] == [("slow", 4)]
    others = [f for f in cell.faults if f.kind != "slow"]
    assert others == [f for f in BASE.faults if f.kind != "slow"]
    slow = next(f for f in cell.faults if f.kind == "slow")
    base_slow = next(f for f in BASE.faults if f.kind == "slow")
    assert attrs.evolve(slow, count=base_slow.count) == base_slow  # delay, jitter kept
    assert (cell.members, cell.duration, cell.seed) == (BASE.members, BASE.duration, BASE.seed)
    assert next(f for f in BASE.faults if f.kind == "slow").count == 1  # base untouched


@pytest.mark.parametrize(
    ("mean", "half", "text"),
    [(None, None, "-"), (2.0, None, "2"), (0.123456, 0.0456, "0.123 ± 0.046"),
     (1234.5, 12.0, "1.23e+03 ± 12")],
)  # fmt: skip
def test_a_cell_shows_the_mean_and_its_half_width(
    mean: float | None, half: float | None, text: str
) -> None:
    assert _cell(SeedSummary("m", 2, mean, None, None, half)) == text


def test_slow_counts_parse_and_bad_ones_say_what_is_expected() -> None:
    assert _counts("1,2,4") == [1, 2, 4]
    assert _counts("0") == [0]
    for bad in ("1,,2", "x", "1.5", "-1", "2,-3"):
        with pytest.raises(argparse.ArgumentTypeError) as info:
            _counts(bad)
        assert repr(bad) in str(info.value)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--seeds", "1"], "--seeds must be at least 2 for an interval"),
        (["--duration", "0"], "--duration must be > 0 seconds"),
        (["--slow", "3", "--members", "4"], "--members must exceed the largest slow count"),
        (["--slow", "a,b"], "expected numbers like 1,2,4"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        lifeguard_grid.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1]


@attrs.frozen
class Result:
    ok: bool


def test_one_row_per_slow_count_and_setting_and_exit_1_on_a_failed_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cells: list[tuple[int, int, bool, list[int]]] = []

    def run_seeds(scenario: Any, seeds: range) -> list[Result]:
        slow = next(f.count for f in scenario.faults if f.kind == "slow")
        cells.append((scenario.members, slow, scenario.lifeguard, list(seeds)))
        # One failed run: the cell with 2 slow members and Lifeguard on.
        return [Result(ok=not (slow == 2 and scenario.lifeguard and s == 6)) for s in seeds]

    def summarize(results: list[Result]) -> list[SeedSummary]:
        return [SeedSummary(name, 3, float(i), None, None, 0.5) for i, name in enumerate(COLUMNS)]

    monkeypatch.setattr(lifeguard_grid, "run_seeds", run_seeds)
    monkeypatch.setattr(lifeguard_grid, "summarize", summarize)
    argv = ["--slow", "1,2", "--seeds", "3", "--first-seed", "5", "--members", "9"]
    assert lifeguard_grid.main([*argv, "--duration", "30"]) == 1
    assert cells == [
        (9, 1, False, [5, 6, 7]), (9, 1, True, [5, 6, 7]),
        (9, 2, False, [5, 6, 7]), (9, 2, True, [5, 6, 7]),
    ]  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "9 members, 30 s timeline, seeds 5..7; mean ± 95% t-interval half-width over seeds"
    )
    assert lines[1].count("|") == len(COLUMNS) + 4 and lines[2].count("|") == len(COLUMNS) + 4
    values = " | ".join(f"{float(i):.3g} ± 0.5" for i in range(len(COLUMNS)))
    assert lines[3:] == [
        f"| 1 | off | {values} | 0 |",
        f"| 1 | on | {values} | 0 |",
        f"| 2 | off | {values} | 0 |",
        f"| 2 | on | {values} | 1 |",
    ]
