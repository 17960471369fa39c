"""`python -m simulations.churn`: the swarm's random scenarios, its BUGGIFY hooks and its
command line. Real swarm seeds run in test_cli.py; here each piece is checked alone."""

from __future__ import annotations

import random
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulations import churn
from simulations._rng import child_rng
from simulations.churn import Buggify, swarm_scenario
from swim import Membership

SIZES = {3, 5, 8, 12, 16, 24, 32}


def test_buggify_at_the_extremes_always_or_never_fires() -> None:
    never = Buggify(random.Random(1), fanout_one=0.0, drop_refute=0.0)
    always = Buggify(random.Random(1), fanout_one=1.0, drop_refute=1.0)
    for _ in range(50):
        assert never.gossip_fanout(4) == 4 and not never.drop_refute()
        assert always.gossip_fanout(4) == 1 and always.drop_refute()


def test_buggify_fires_at_its_rate_from_its_own_generator() -> None:
    rng = random.Random(9)
    hooks = Buggify(rng, fanout_one=0.3, drop_refute=0.1)
    fanouts = [hooks.gossip_fanout(3) for _ in range(4000)]
    drops = [hooks.drop_refute() for _ in range(4000)]
    assert set(fanouts) == {1, 3}
    assert 0.26 < fanouts.count(1) / 4000 < 0.34
    assert 0.08 < sum(drops) / 4000 < 0.12
    # Each answer is one draw from the generator it was given, and nothing else.
    again = random.Random(9)
    assert fanouts == [1 if again.random() < 0.3 else 3 for _ in range(4000)]


def test_the_same_seed_is_the_same_scenario_and_buggify() -> None:
    assert swarm_scenario(17) == swarm_scenario(17)
    assert swarm_scenario(17, duration=60.0)[0].duration == 60.0
    # Other seeds choose otherwise (name, description and seed left out).
    chosen = [attrs.evolve(swarm_scenario(seed)[0], name="", seed=0) for seed in range(17, 23)]
    assert all(a != b for i, a in enumerate(chosen) for b in chosen[i + 1 :])


@given(st.integers(0, 10**9), st.sampled_from([30.0, 120.0, 400.0]))
def test_every_seed_gives_a_valid_swarm_scenario(seed: int, duration: float) -> None:
    scenario, buggify = swarm_scenario(seed, duration=duration)
    assert scenario.name == f"swarm-{seed}" and scenario.seed == seed
    assert scenario.members in SIZES and scenario.duration == duration
    assert scenario.safety and scenario.liveness and scenario.liveness_bound == 400.0
    net = scenario.network
    assert net.latency_mean > net.latency_min > 0 and 0 <= net.loss < 1
    # Partitions heal by the end and each is followed by a stability window.
    heal = -5.0  # the first forms 5 to 20 s in
    for partition in scenario.partitions:
        assert partition.at >= heal + 10.0 and partition.at < duration - 10.0
        assert partition.heal is not None and partition.at < partition.heal <= duration
        heal = partition.heal
    if scenario.churn is not None:
        assert scenario.churn.min_members <= scenario.members
    kinds = [f.kind for f in scenario.faults]
    assert kinds.count("update") == 1 and kinds.count("pause") <= 2 and kinds.count("slow") <= 2
    assert set(buggify) == {"fanout_one", "drop_refute"}
    assert all(0.0 <= p < 1.0 for p in buggify.values())


def test_the_factory_gives_each_core_its_own_buggify(monkeypatch: pytest.MonkeyPatch) -> None:
    scenario, _ = swarm_scenario(3)
    make = churn._factory(scenario, {"fanout_one": 1.0, "drop_refute": 0.0})
    core = make("m00001", ("10.0.0.1", 7946), random.Random(0), 100.0, 2)
    assert isinstance(core, Membership)
    hooks = core._faults  # the resolved hooks the core consults
    assert hooks.gossip_fanout is not None and hooks.gossip_fanout(5) == 1
    assert hooks.drop_refute is not None and not hooks.drop_refute()
    # Its generator is the (seed, "buggify", name, incarnation) child: reproducible.
    seen: list[tuple[Any, ...]] = []
    real = child_rng
    monkeypatch.setattr(churn, "child_rng", lambda *key: seen.append(key) or real(*key))
    make("m00002", ("10.0.0.2", 7946), random.Random(0), 100.0, 7)
    assert seen == [(3, "buggify", "m00002", 7)]


@attrs.frozen
class Result:
    ok: bool
    failure: str | None = None
    wall_seconds: float = 0.25
    digest: str = "0123456789abcdef"


def test_main_prints_a_line_per_seed_and_counts_failures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[tuple[int, float]] = []

    def run_seed(seed: int, *, duration: float) -> Result:
        ran.append((seed, duration))
        return Result(ok=seed != 41, failure="liveness: no convergence" if seed == 41 else None)

    monkeypatch.setattr(churn, "run_seed", run_seed)
    assert churn.main(["--seed", "40", "--count", "3", "--duration", "30"]) == 1
    assert ran == [(40, 30.0), (41, 30.0), (42, 30.0)]
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["seed 40", "seed 41", "seed 42"]
    assert lines[0].endswith(": ok [0.2s, digest 0123456789ab]")
    assert "FAILED: liveness: no convergence" in lines[1]
    scenario, _ = swarm_scenario(40, duration=30.0)
    assert f"{scenario.members} members, loss " in lines[0]
    assert captured.err == "1 of 3 seeds failed\n"
    monkeypatch.setattr(churn, "run_seed", lambda seed, *, duration: Result(ok=True))
    assert churn.main(["--seed", "1"]) == 0


@pytest.mark.parametrize(
    "argv", [["--seed", "1", "--count", "0"], ["--seed", "1", "--duration", "-1"]]
)
def test_bad_counts_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        churn.main(argv)
    assert info.value.code == 2
    assert "--count must be >= 1 and --duration >= 0" in capsys.readouterr().err
