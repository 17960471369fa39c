"""`python -m simulations.lease_sweep`: the per-seed outcome, the totals, the exit code.

The sweep itself (real runs of the shipped scenario) is in test_leases.py; here the
report and the exit status are checked on outcomes made up to the purpose.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulations import lease_sweep
from simulations.lease_sweep import _quantile, _scenario, report

TINY = """
name = "tiny-leases"
members = 4
duration = 10.0

[formation]
mode = "prime"

[tasks]
rate = 1.0
count_max = 2
distribution = "fixed"
duration_min = 2.0
lease_preset = "local"
drain_bound = 60.0
"""


def outcome(seed: int, **more: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "seed": seed, "ok": True, "failure": None,
        "invariants": {"I1": 0, "I2": 0, "I3": 0, "I4": 0}, "examples": [],
        "checked_end": True, "submitted": 3, "acknowledged": 2, "executions": 4,
        "stranded": 0, "failover_times": [], "not_failed_over": 0, "wall": 0.1,
    }  # fmt: skip
    row.update(more)
    return row


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0.0, 1.0))
def test_the_quantile_is_the_nearest_rank(values: list[float], q: float) -> None:
    """The smallest value with at least a fraction q of the values at or below it."""
    got = _quantile(values, q)
    assert got in values
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(values)))
    assert got == ordered[rank - 1]


def test_quantiles_of_a_small_list() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert [_quantile(values, q) for q in (0.0, 0.25, 0.5, 0.95, 1.0)] == [1, 1, 2, 4, 4]


def test_a_clean_sweep_reports_totals_and_failover_quantiles() -> None:
    runs = [
        outcome(1, failover_times=[1.0, 3.0]),
        outcome(2, failover_times=[2.0], not_failed_over=1, stranded=2),
    ]
    text = report("s", runs)
    lines = text.splitlines()
    assert lines[0] == "s: 2 seeds (1..2), 6 tasks submitted, 4 acknowledged, 8 executions"
    assert lines[1] == "  violations: I1 0, I2 0, I3 0, I4 0 (in 0 seeds)"
    assert lines[2].startswith("  I3/I4 checked after the drain in 2 seeds; 2 acknowledged")
    assert lines[3] == (
        "  failovers (owner crash -> next start): 3, mean 2.00 s, median 2.00 s,"
        " p95 3.00 s, max 3.00 s; 1 crashed owners' tasks never ran again"
    )
    assert len(lines) == 4


def test_broken_and_failed_seeds_are_named_apart() -> None:
    runs = [
        outcome(1),
        outcome(2, ok=False, invariants={"I1": 2, "I2": 0, "I3": 1, "I4": 0},
                examples=["t1 overlapped", "t2 too"]),
        outcome(3, ok=False, failure="liveness: no convergence", checked_end=False),
    ]  # fmt: skip
    lines = report("s", runs).splitlines()
    assert lines[1] == "  violations: I1 2, I2 0, I3 1, I4 0 (in 1 seeds)"
    assert "checked after the drain in 2 seeds" in lines[2]
    assert not any("failovers" in line for line in lines)  # none measured
    assert "  seed 2: {'I1': 2, 'I2': 0, 'I3': 1, 'I4': 0} ['t1 overlapped']" in lines
    assert "  seed 3 failed: liveness: no convergence" in lines
    assert lines[-1] == "  1 runs failed without a lease violation"


@pytest.mark.parametrize(("broken", "code"), [(False, 0), (True, 1)])
def test_main_exits_1_on_a_violation_and_writes_every_outcome(
    broken: bool, code: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    asked: list[tuple[str, list[int], int]] = []

    def sweep(name: str, seeds: Any, jobs: int = 1) -> list[dict[str, Any]]:
        asked.append((name, list(seeds), jobs))
        bad = {"I1": 0, "I2": 1, "I3": 0, "I4": 0}
        return [outcome(s, **({"invariants": bad} if broken and s == 8 else {})) for s in seeds]

    monkeypatch.setattr(lease_sweep, "sweep", sweep)
    out = tmp_path / "runs.json"
    argv = ["--scenario", "x", "--seeds", "3", "--first", "7", "--jobs", "2", "--json", str(out)]
    assert lease_sweep.main(argv) == code
    assert asked == [("x", [7, 8, 9], 2)]
    assert [r["seed"] for r in json.loads(out.read_text())] == [7, 8, 9]
    printed = capsys.readouterr().out
    assert printed.startswith("x: 3 seeds (7..9)") and "on 2 processes" in printed


def test_a_scenario_is_a_file_or_a_shipped_name(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(TINY, encoding="utf-8")
    assert _scenario(str(path)).name == "tiny-leases"
    assert _scenario("leases-sweep").name == "leases-sweep"


def test_one_seed_is_plain_picklable_data_from_a_real_run(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(TINY, encoding="utf-8")
    (row,) = lease_sweep.sweep(str(path), [3])
    assert json.loads(json.dumps(row)) == row
    assert row["seed"] == 3 and row["ok"], row["failure"]
    assert row["invariants"] == {"I1": 0, "I2": 0, "I3": 0, "I4": 0}
    assert row["submitted"] == 2 and row["acknowledged"] == 2 and row["checked_end"]
    assert row["executions"] >= 2
