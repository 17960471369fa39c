"""`python -m simulations.demo`: the shipped demo scenario, Lifeguard on then off."""

from __future__ import annotations

import attrs
import pytest

from simulations import demo
from simulations._scenario import Scenario, load_scenario
from simulations.cli import SCENARIOS


@attrs.frozen
class Result:
    ok: bool
    lifeguard: bool


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[Scenario]:
    """The scenarios the demo runs (stood in for: each run "fails" if its members are 13)."""
    ran: list[Scenario] = []

    def run_once(scenario: Scenario) -> Result:
        ran.append(scenario)
        return Result(ok=scenario.members != 13, lifeguard=scenario.lifeguard)

    monkeypatch.setattr(demo, "run_once", run_once)
    monkeypatch.setattr(demo, "format_report", lambda r: f"report lifeguard={r.lifeguard}")
    return ran


def test_it_runs_the_shipped_scenario_with_lifeguard_on_then_off(
    runs: list[Scenario], capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main([]) == 0
    shipped = load_scenario(SCENARIOS / "demo.toml")
    assert runs == [attrs.evolve(shipped, lifeguard=True), attrs.evolve(shipped, lifeguard=False)]
    out = capsys.readouterr().out
    assert out.startswith(f"populi simulated cluster: {shipped.members} members on a LAN")
    on, off = out.index("== Lifeguard on"), out.index("== Lifeguard off (plain SWIM)")
    assert on < out.index("report lifeguard=True") < off < out.index("report lifeguard=False")


def test_seed_members_and_lifeguard_only(runs: list[Scenario]) -> None:
    assert demo.main(["--seed", "5", "--members", "12", "--lifeguard-only"]) == 0
    assert [(s.seed, s.members, s.lifeguard) for s in runs] == [(5, 12, True)]


def test_a_failed_run_makes_the_exit_status_1(runs: list[Scenario]) -> None:
    assert demo.main(["--members", "13"]) == 1
    assert len(runs) == 2  # the comparison still runs


def test_too_few_members_exit_2(runs: list[Scenario], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        demo.main(["--members", "1"])
    assert info.value.code == 2 and runs == []
    assert "--members must be at least 2" in capsys.readouterr().err


def test_the_real_demo_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--members", "12", "--lifeguard-only"]) == 0
    out = capsys.readouterr().out
    assert "12 members" in out
    assert "crash of m000" in out
    assert "traffic:" in out and "OK" in out
