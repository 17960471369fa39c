"""Many seeds, one summary: the 95% intervals and the `--seeds` command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulations import parse_scenario
from simulations._seeds import format_seeds, mean_ci, run_seeds, summarize
from simulations.cli import main
from simulations.lifeguard_grid import grid_scenario
from simulations.lifeguard_grid import main as grid_main

TINY = """
name = "tiny"
members = 6
duration = 12.0
seed = 4

[formation]
mode = "prime"

[[fault]]
kind = "crash"
at = 2.0

[[fault]]
kind = "slow"
at = 1.0
delay = 1.0
"""


def test_mean_ci_matches_the_t_interval_by_hand() -> None:
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert half == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert mean_ci([]) == (None, None)
    assert mean_ci([5.0]) == (5.0, None)
    # Beyond the table (df > 30) the quantile approaches the normal's 1.96.
    _, wide = mean_ci([0.0, 1.0] * 50)
    assert wide == pytest.approx((1.96 + 2.4 / 99) * math.sqrt(0.5**2 * 100 / 99 / 100), rel=1e-3)


@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=40))
def test_the_interval_contains_the_mean_and_narrows_to_nothing_for_constants(
    values: list[float],
) -> None:
    mean, half = mean_ci(values)
    assert mean is not None and half is not None
    assert half >= 0
    assert min(values) - 1e-6 <= mean <= max(values) + 1e-6
    constant_mean, constant_half = mean_ci([values[0]] * len(values))
    assert constant_half == pytest.approx(0.0, abs=1e-9 * max(1.0, abs(values[0])))
    assert constant_mean == pytest.approx(values[0])


def test_two_seeds_give_two_different_runs_and_a_summary_per_measure() -> None:
    results = run_seeds(parse_scenario(TINY_DICT), [1, 2])
    assert [r.seed for r in results] == [1, 2]
    assert results[0].digest != results[1].digest
    by_name = {s.measure: s for s in summarize(results)}
    first = by_name["crash: first declared dead (s)"]
    values = [r.measures["detection"]["first_detected_mean"] for r in results]
    assert first.n == 2
    assert first.mean == pytest.approx(sum(values) / 2)
    assert first.low is not None and first.high is not None and first.mean is not None
    assert first.low <= first.mean <= first.high
    assert "±" in format_seeds(results)


def test_cli_seeds_prints_intervals_and_writes_them_to_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY, encoding="utf-8")
    out = tmp_path / "out.json"
    assert main(["run", str(path), "--seeds", "2", "--seed", "7", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 seeds (7, 8)" in printed
    assert "crash: declared dead by all (s)" in printed
    document = json.loads(out.read_text(encoding="utf-8"))
    assert [run["seed"] for run in document["runs"]] == [7, 8]
    (summary,) = document["seeds"]
    assert summary["measures"]["crash: first declared dead (s)"]["n"] == 2


def test_the_lifeguard_grid_sets_the_slow_count_and_prints_a_row_per_cell(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = parse_scenario(TINY_DICT)
    cell = grid_scenario(base, 3, lifeguard=False)
    assert [f.count for f in cell.faults if f.kind == "slow"] == [3]
    assert not cell.lifeguard
    assert grid_main(["--slow", "1", "--seeds", "2", "--duration", "5", "--members", "6"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 2 and "| off |" in rows[0] and "| on |" in rows[1]


TINY_DICT = {
    "name": "tiny",
    "members": 6,
    "duration": 12.0,
    "formation": {"mode": "prime"},
    "fault": [{"kind": "crash", "at": 2.0}, {"kind": "slow", "at": 1.0, "delay": 1.0}],
}
