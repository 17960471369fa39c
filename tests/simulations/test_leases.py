"""The lease agents inside the simulator: every shipped lease scenario, small, on fixed
seeds, must keep the invariants I1 to I4 (simulations/_lease_history.py); and two
controls break the election on purpose (a majority of one, a granter that ignores the
live lease) to show that the history check catches what it is there to catch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import populi_p2p.leases.agent as agent_module
from populi_p2p.leases.grants import GrantRecord, Refusal, on_grant
from simulations import (
    RunResult,
    ScenarioError,
    format_report,
    load_scenario,
    override,
    parse_scenario,
    run_once,
)
from simulations._seeds import format_seeds
from simulations.lease_sweep import main as sweep_main

SCENARIOS = Path(__file__).parents[2] / "simulations" / "scenarios"

#: Small versions of the shipped scenarios: (file, overrides).
SMALL: dict[str, dict[str, Any]] = {
    "leases-steady": {"members": 8, "duration": 40.0},
    "leases-owner-crash": {"members": 6, "duration": 60.0},
    "leases-partition": {"members": 8, "duration": 80.0},
    "leases-churn": {"members": 18, "duration": 45.0},
    # Seed 1 found the agent re-running a finished epoch on a late `Own` (I2, 3 starts).
    "leases-starved": {"duration": 45.0, "seed": 1},
    "leases-sweep": {},
    "leases-small-mesh": {},  # sets of 2 to 4: half of an even set with its primary decides
}
NO_VIOLATIONS = {"I1": 0, "I2": 0, "I3": 0, "I4": 0}


def _small(name: str, seed: int = 3) -> RunResult:
    params = {"seed": seed, **SMALL[name]}
    scenario = override(load_scenario(SCENARIOS / f"{name}.toml"), **params)
    return run_once(scenario)


def test_every_shipped_lease_scenario_has_a_small_version() -> None:
    shipped = {p.stem for p in SCENARIOS.glob("*.toml") if "[tasks]" in p.read_text()}
    assert shipped == set(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_lease_scenario_keeps_the_invariants(name: str) -> None:
    result = _small(name)
    assert result.ok, result.failure
    leases = result.measures["leases"]
    assert leases["invariants"] == NO_VIOLATIONS, leases["violation_examples"]
    assert leases["checked_end"] and leases["drain_seconds"] is not None
    assert leases["submitted"] > 0 and leases["acknowledged"] > 0
    assert sum(leases["outcomes"].values()) >= leases["acknowledged"] - leases["stranded"]
    assert leases["lease_bytes_per_member_second"] > 0
    ends = leases["execution_ends"]
    if name == "leases-steady":  # healthy: one execution per task, each to its end
        assert leases["starts_per_task"] == 1.0
        assert leases["outcomes"] == {"succeeded": leases["submitted"]}
    if name == "leases-owner-crash":  # crashed owners' tasks ran again
        assert ends["crashed"] >= 1
        assert leases["failovers"] >= 1 and leases["failover_mean"] < 30.0
    if name == "leases-partition":  # the cut-off owners were stopped or fenced
        assert ends.get("fenced", 0) + ends.get("stopped", 0) >= 1
    text = format_report(result)
    assert "leases: invariant violations: I1 0, I2 0, I3 0, I4 0" in text


@pytest.mark.parametrize("name", ["leases-sweep", "leases-small-mesh"])
@pytest.mark.parametrize("seed", [2, 5, 8])
def test_the_sweep_scenarios_keep_the_invariants_on_more_seeds(name: str, seed: int) -> None:
    leases = _small(name, seed=seed).measures["leases"]
    assert leases["invariants"] == NO_VIOLATIONS, leases["violation_examples"]
    assert leases["checked_end"]


def _broken(name: str, seeds: list[int]) -> dict[str, int]:
    totals = dict.fromkeys(NO_VIOLATIONS, 0)
    for seed in seeds:
        result = _small(name, seed=seed)
        for key, value in result.measures["leases"]["invariants"].items():
            totals[key] += value
        if any(result.measures["leases"]["invariants"].values()):
            assert not result.ok and "invariant violations" in (result.failure or "")
    return totals


def test_control_a_majority_of_one_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every proposer that is a replica grants itself: two sides of a partition run the
    same task (I1), and results are decided by one replica."""
    monkeypatch.setattr(agent_module, "is_quorum", lambda _replicas, voters: bool(voters))
    totals = _broken("leases-partition", [3])
    assert totals["I1"] + totals["I2"] > 0, totals


def test_control_a_granter_ignoring_the_live_lease_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Granters that grant the next epoch at once, whatever the owner's lease: the new
    owner starts while the old one (cut off, or stalled) still runs until its fence."""

    def hasty(
        rec: GrantRecord, me: str, epoch: int, owner: str, now: float, wait: float,
        take_up: float,
    ) -> Refusal | None:  # fmt: skip
        return on_grant(rec, me, epoch, owner, now, 0.0, 0.0)

    monkeypatch.setattr(agent_module, "on_grant", hasty)
    totals = _broken("leases-partition", [3])
    assert totals["I1"] > 0, totals


def test_one_seed_twice_gives_the_same_digest() -> None:
    first = _small("leases-owner-crash", seed=5)
    second = _small("leases-owner-crash", seed=5)
    assert first.digest == second.digest
    assert first.measures["leases"] == second.measures["leases"]
    assert first.digest != _small("leases-steady", seed=5).digest


def test_multi_seed_table_lists_the_invariants() -> None:
    results = [_small("leases-steady", seed=s) for s in (1, 2)]
    text = format_seeds(results)
    assert "leases: I1 overlapping executions" in text and "leases: owner crash" in text


def test_the_sweep_entry_point_counts_per_invariant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "sweep.json"
    assert sweep_main(["--seeds", "2", "--first", "4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "leases-sweep: 2 seeds (4..5)" in text
    assert "violations: I1 0, I2 0, I3 0, I4 0 (in 0 seeds)" in text
    assert out.read_text().count('"seed"') == 2


def test_scenarios_without_tasks_run_no_lease_agents() -> None:
    scenario = parse_scenario({"members": 4, "duration": 5.0}, source="plain")
    assert scenario.tasks is None
    result = run_once(scenario)
    assert "leases" not in result.measures
    assert "leases:" not in format_report(result)


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        ({"rate": 1.0, "bogus": 1}, "unknown key 'bogus'"),
        ({"distribution": "normal"}, "distribution must be one of"),
        ({"duration_min": 10.0, "duration_max": 5.0}, "duration_min <= duration_max"),
        ({"lease_preset": "moon"}, "lease_preset must be one of"),
        ({"rate": -1.0}, "rate must be >= 0"),
        ({"cancel_fraction": 1.5}, "cancel_fraction must be in"),
        ({"clock_drift": 0.7}, "clock_drift must be in"),
    ],
)
def test_bad_tasks_tables_are_one_line_errors(tasks: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message) as info:
        parse_scenario({"members": 4, "tasks": tasks}, source="bad.toml")
    assert "\n" not in str(info.value)
    assert "[tasks]" in str(info.value)
