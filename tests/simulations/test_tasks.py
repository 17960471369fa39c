"""`TasksSpec` and `parse_tasks`: a scenario's `[tasks]` table, its checks and its draws."""

from __future__ import annotations

import random
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulations._scenario import ScenarioError, _Table
from simulations._tasks import DISTRIBUTIONS, LEASE_PRESETS, TasksSpec, parse_tasks


def test_the_defaults_are_a_valid_spec_and_every_preset_name_is_accepted() -> None:
    assert TasksSpec().distribution in DISTRIBUTIONS
    assert set(LEASE_PRESETS) == {"lan", "wan", "local"}
    for name in LEASE_PRESETS:
        assert TasksSpec(lease_preset=name).lease_preset == name


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"distribution": "normal"}, "distribution must be one of"),
        ({"lease_preset": "moon"}, "lease_preset must be one of"),
        ({"duration_min": 0.0}, "need 0 < duration_min <= duration_max"),
        ({"duration_min": 31.0, "duration_max": 30.0}, "need 0 < duration_min <= duration_max"),
        ({"duration_mean": 0.0}, "duration_mean must be > 0"),
        ({"failure_rate": 1.01}, "failure_rate must be in [0, 1]"),
        ({"failure_rate": -0.01}, "failure_rate must be in [0, 1]"),
        ({"cancel_fraction": 1.5}, "cancel_fraction must be in [0, 1]"),
        ({"clock_drift": 0.5}, "clock_drift must be in [0, 0.5)"),
        ({"clock_drift": -0.1}, "clock_drift must be in [0, 0.5)"),
        ({"start": 10.0, "stop": 9.0}, "stop must not be before start"),
    ],
)
def test_an_impossible_value_is_one_line(change: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError) as info:
        TasksSpec(**change)
    assert str(info.value).startswith(says) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "change",
    [
        {"failure_rate": 0.0}, {"failure_rate": 1.0}, {"cancel_fraction": 1.0},
        {"clock_drift": 0.49}, {"duration_min": 30.0, "duration_max": 30.0},
        {"start": 5.0, "stop": 5.0},
    ],
)  # fmt: skip
def test_the_bounds_themselves_are_accepted(change: dict[str, Any]) -> None:
    spec = TasksSpec(**change)
    for key, value in change.items():
        assert getattr(spec, key) == value


def test_a_fixed_duration_is_the_minimum_and_draws_nothing() -> None:
    rng = random.Random(1)
    state = rng.getstate()
    spec = TasksSpec(distribution="fixed", duration_min=7.0, duration_max=20.0)
    assert spec.draw_duration(rng) == 7.0
    assert rng.getstate() == state


@given(
    seed=st.integers(0, 2**32),
    low=st.floats(0.1, 100.0),
    span=st.floats(0.0, 100.0),
    mean=st.floats(0.01, 500.0),
)
def test_drawn_durations_stay_in_their_bounds(
    seed: int, low: float, span: float, mean: float
) -> None:
    for distribution in ("uniform", "exponential"):
        spec = TasksSpec(
            distribution=distribution, duration_min=low, duration_max=low + span,
            duration_mean=mean,
        )  # fmt: skip
        value = spec.draw_duration(random.Random(seed))
        assert low <= value <= low + span


def test_uniform_and_exponential_draw_what_their_names_say() -> None:
    """Same rng state: uniform is `rng.uniform`, exponential `rng.expovariate(1/mean)`."""
    uniform = TasksSpec(distribution="uniform", duration_min=2.0, duration_max=4.0)
    assert uniform.draw_duration(random.Random(3)) == random.Random(3).uniform(2.0, 4.0)
    wide = TasksSpec(distribution="exponential", duration_min=1e-6, duration_max=1e9,
                     duration_mean=15.0)  # fmt: skip
    assert wide.draw_duration(random.Random(3)) == random.Random(3).expovariate(1 / 15.0)
    # Clipped at both ends.
    low = TasksSpec(distribution="exponential", duration_min=1e6, duration_max=2e6)
    assert low.draw_duration(random.Random(3)) == 1e6
    high = TasksSpec(distribution="exponential", duration_min=1e-9, duration_max=1e-8)
    assert high.draw_duration(random.Random(3)) == 1e-8
    # Many draws: the exponential's mean is near `duration_mean` (not 1/mean).
    rng = random.Random(5)
    draws = [wide.draw_duration(rng) for _ in range(4000)]
    assert 13.5 < sum(draws) / len(draws) < 16.5


def test_no_table_is_no_tasks() -> None:
    assert parse_tasks(None) is None


def test_an_empty_table_gives_the_defaults() -> None:
    assert parse_tasks(_Table("s[tasks]", {})) == TasksSpec()


def test_every_field_is_read_with_its_type() -> None:
    data = {
        "rate": 2, "start": 1.5, "stop": 40, "count_max": 9, "distribution": "exponential",
        "duration_min": 1, "duration_max": 9, "duration_mean": 3, "failure_rate": 0.25,
        "retry_limit": 4, "cancel_fraction": 0.5, "clock_drift": 0.1, "gpus": 2,
        "vram_gib": 4, "cpu_cores": 2, "node_gpus": 8, "node_vram_gib": 80,
        "node_cpu_cores": 64, "node_ram_gib": 512, "lease_preset": "wan", "drain_bound": 100,
    }  # fmt: skip
    assert set(data) == {f.name for f in attrs.fields(TasksSpec)}  # nothing left out
    spec = parse_tasks(_Table("s[tasks]", data))
    assert spec is not None
    assert attrs.asdict(spec) == data
    assert isinstance(spec.rate, float) and isinstance(spec.count_max, int)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"sped": 1}, "s[tasks]: unknown key 'sped'"),
        ({"count_max": 1.5}, "s[tasks]: count_max must be an integer, got 1.5"),
        ({"gpus": 1.0}, "s[tasks]: gpus must be an integer"),
        ({"rate": "fast"}, "s[tasks]: rate must be a number"),
        ({"distribution": 3}, "s[tasks]: distribution must be a string"),
    ],
)
def test_a_bad_key_or_type_is_the_tables_one_line(data: dict[str, Any], says: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_tasks(_Table("s[tasks]", data))
    assert str(info.value).startswith(says)


def test_an_impossible_value_names_the_table() -> None:
    with pytest.raises(ValueError) as info:
        parse_tasks(_Table("s[tasks]", {"duration_min": 9, "duration_max": 3}))
    assert str(info.value) == "s[tasks]: need 0 < duration_min <= duration_max"
