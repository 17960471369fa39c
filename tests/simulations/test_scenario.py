"""Scenario files: every shipped one parses, and mistakes are one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulations import ScenarioError, load_scenario, override, parse_scenario, swim_config

SHIPPED = sorted((Path(__file__).parents[2] / "simulations" / "scenarios").glob("*.toml"))


def test_scenarios_are_shipped() -> None:
    names = {path.stem for path in SHIPPED}
    assert {"swim-paper", "lifeguard-paper", "partition-heal", "churn", "laptop-sleep"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_scenario_parses(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.name == path.stem
    assert scenario.description
    for variant in scenario.variants():
        swim_config(variant)  # its [swim] table is valid for the core


def test_a_full_scenario_parses_into_typed_specs() -> None:
    scenario = parse_scenario(
        {
            "name": "x",
            "members": 10,
            "duration": 30,
            "lifeguard": False,
            "swim": {"probe_interval": 2.0, "probe_timeout": 1.0},
            "network": {"loss": 0.1, "lossy": [{"count": 2, "ingress": 0.3}]},
            "formation": {"mode": "prime", "settle": 1},
            "fault": [
                {"kind": "crash", "at": 5, "members": [3], "restart_after": 10},
                {"kind": "pause", "at": 6, "duration": 4, "clock_stops": False},
                {"kind": "slow", "at": 7, "delay": 0.5, "count": 2, "every": 10},
            ],
            "partition": [{"at": 10, "heal": 20, "groups": [[0, 1], [2, 3]], "one_way": True}],
            "churn": {"joins_per_minute": 2, "crashes_per_minute": 1},
            "driver": {"reconnect_interval": 0},
            "check": {"safety": True, "liveness_bound": 100},
            "sweep": {"members": [4, 8], "lifeguard": [True, False], "seeds": [1, 2]},
        }
    )
    assert scenario.network.loss == 0.1
    assert scenario.lossy[0].ingress == 0.3
    assert scenario.faults[0].restart_after == 10.0
    assert not scenario.faults[1].clock_stops
    assert scenario.partitions[0].members == ((0, 1), (2, 3))
    assert scenario.churn is not None and scenario.churn.joins_per_minute == 2.0
    assert scenario.reconnect_interval == 0.0
    assert swim_config(scenario).probe_interval == 2.0
    assert not swim_config(scenario).lifeguard
    variants = scenario.variants()
    assert len(variants) == 8
    assert {(v.members, v.lifeguard, v.seed) for v in variants} == {
        (m, lg, s) for m in (4, 8) for lg in (True, False) for s in (1, 2)
    }


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"members": 0}, "members must be >= 1"),
        ({"membres": 10}, "unknown key 'membres'"),
        ({"duration": "long"}, "duration must be a number"),
        ({"preset": "lab"}, "preset must be one of"),
        ({"fault": [{"kind": "explode", "at": 1}]}, "kind must be one of"),
        ({"fault": [{"kind": "crash"}]}, "missing key 'at'"),
        ({"fault": [{"kind": "crash", "at": 1, "wen": 2}]}, "unknown key 'wen'"),
        ({"fault": [{"kind": "pause", "at": 1}]}, "a pause needs a duration"),
        ({"fault": [{"kind": "crash", "at": 1, "members": [99]}]}, "names member 99"),
        ({"partition": [{"at": 5, "heal": 1}]}, "heal (1.0) is before at"),
        ({"network": {"loss": 1.5}}, "loss must be in"),
        ({"network": {"lossy": [{"ingress": 2}]}}, "ingress must be <= 1"),
        ({"sweep": {"lifeguard": ["yes"]}}, "lifeguard must be a list"),
        ({"formation": {"mode": "magic"}}, "mode must be 'join' or 'prime'"),
    ],
)
def test_bad_scenarios_raise_one_line(data: dict[str, object], message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario({"name": "bad", **data}, source="bad.toml")
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_unknown_swim_field_is_reported() -> None:
    scenario = parse_scenario({"name": "x", "swim": {"probe_intervall": 1.0}})
    with pytest.raises(ScenarioError, match="no field 'probe_intervall'"):
        swim_config(scenario)


def test_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("members = [", encoding="utf-8")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load_scenario(broken)


def test_overrides_replace_the_matching_sweep_dimension() -> None:
    scenario = parse_scenario(
        {"name": "x", "sweep": {"members": [4, 8, 16], "lifeguard": [True, False]}}
    )
    assert len(scenario.variants()) == 6
    only = override(scenario, members=5, loss=0.2)
    variants = only.variants()
    assert {v.members for v in variants} == {5}
    assert {v.network.loss for v in variants} == {0.2}
    assert len(variants) == 2
