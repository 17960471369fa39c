"""Health states, the seeds' disqualification rules and the throttle-event history."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.gpu import (
    GIB,
    MIB,
    DeviceHealth,
    GpuDevice,
    HealthConfig,
    HealthState,
    Reason,
    Source,
    ThrottleHistory,
    Vendor,
    WorkloadNeed,
    assess_health,
    check_workload,
)

BASE = GpuDevice(
    index=0,
    uuid="GPU-0",
    name="NVIDIA A100",
    vendor=Vendor.NVIDIA,
    source=Source.NVML,
    compute_capability=(8, 0),
    memory_total=80 * GIB,
    memory_used=0,
    memory_free=80 * GIB,
    temperature_c=40,
    throttle_thermal=False,
    ecc_corrected=0,
    ecc_uncorrected=0,
)
CONFIG = HealthConfig()

# (change to the device, keyword inputs, expected state, expected reasons)
CASES = [
    ({}, {}, HealthState.HEALTHY, ()),
    ({"throttle_thermal": True}, {}, HealthState.DEGRADED, (Reason.THERMAL_THROTTLE,)),
    ({"throttle_power": True}, {}, HealthState.HEALTHY, ()),  # power capping is normal
    ({"temperature_c": 84}, {}, HealthState.HEALTHY, ()),
    ({"temperature_c": 85}, {}, HealthState.DEGRADED, (Reason.HIGH_TEMPERATURE,)),
    ({"ecc_corrected": 1}, {}, HealthState.DEGRADED, (Reason.ECC_CORRECTED,)),
    ({"ecc_corrected": None}, {}, HealthState.HEALTHY, ()),
    ({"xids": (13,)}, {}, HealthState.DEGRADED, (Reason.XID,)),
    ({"xids": (79,)}, {}, HealthState.UNHEALTHY, (Reason.XID_FATAL,)),
    ({"xids": (48, 13)}, {}, HealthState.UNHEALTHY, (Reason.XID_FATAL, Reason.XID)),
    ({"ecc_uncorrected": 1}, {}, HealthState.UNHEALTHY, (Reason.ECC_UNCORRECTED,)),
    ({"lost": True, "error": "GPU is lost"}, {}, HealthState.UNHEALTHY, (Reason.LOST,)),
    ({"error": "memory: Unknown Error"}, {}, HealthState.UNHEALTHY, (Reason.PROBE_ERROR,)),
    ({}, {"throttle_events": 2}, HealthState.HEALTHY, ()),
    ({}, {"throttle_events": 3}, HealthState.DEGRADED, (Reason.REPEATED_THROTTLE,)),
    ({}, {"error_rate": 0.05}, HealthState.HEALTHY, ()),
    ({}, {"error_rate": 0.051}, HealthState.DEGRADED, (Reason.ERROR_RATE,)),
    (
        {"throttle_thermal": True, "temperature_c": 95, "lost": True, "error": "lost"},
        {},
        HealthState.UNHEALTHY,
        (Reason.LOST, Reason.THERMAL_THROTTLE, Reason.HIGH_TEMPERATURE),
    ),
]


@pytest.mark.parametrize(("change", "inputs", "state", "reasons"), CASES)
def test_health_table(change, inputs, state, reasons):
    health = assess_health(attrs.evolve(BASE, **change), config=CONFIG, **inputs)
    assert health.state is state
    assert health.reasons == reasons


@pytest.mark.parametrize(
    ("reasons", "eligible"),
    [
        ((), True),
        ((Reason.THERMAL_THROTTLE, Reason.HIGH_TEMPERATURE), True),
        ((Reason.REPEATED_THROTTLE,), False),
        ((Reason.DRIVER_BLOCKLISTED,), False),
        ((Reason.ERROR_RATE,), False),
        ((Reason.LOST,), False),
    ],
)
def test_eligibility(reasons, eligible):
    assert DeviceHealth.from_reasons(reasons).eligible is eligible


def test_driver_blocklist_globs():
    config = HealthConfig(driver_blocklist=("470.*", "535.54.03"))
    for driver, blocked in [("470.57.02", True), ("535.54.03", True), ("535.54.04", False),
                            ("550.54.14", False), (None, False)]:  # fmt: skip
        health = assess_health(BASE, config=config, driver_version=driver)
        assert (Reason.DRIVER_BLOCKLISTED in health.reasons) is blocked, driver
        assert health.eligible is not blocked


def test_every_rule_can_be_turned_off():
    config = HealthConfig(
        high_temperature_c=None,
        ecc_corrected_limit=None,
        ecc_uncorrected_fatal=False,
        throttle_event_limit=None,
        max_error_rate=None,
        fatal_xids=frozenset(),
    )
    device = attrs.evolve(BASE, temperature_c=105, ecc_corrected=50, ecc_uncorrected=5)
    health = assess_health(device, config=config, throttle_events=99, error_rate=1.0)
    assert health.state is HealthState.HEALTHY


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_error_rate": 1.5},
        {"max_error_rate": -0.1},
        {"high_temperature_c": -1},
        {"vram_headroom": -1},
        {"throttle_window_s": 0},
        {"fp16_min_compute_capability": (7,)},
    ],
)
def test_config_validation(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        HealthConfig(**kwargs)


def test_workload_rules_vram_headroom_and_fp16():
    need = WorkloadNeed(vram=8 * GIB, fp16=True)
    assert check_workload((8, 0), 8 * GIB + 512 * MIB, need, CONFIG) == ()
    assert check_workload((8, 0), 8 * GIB + 511 * MIB, need, CONFIG) == (Reason.VRAM_SHORT,)
    assert check_workload((6, 1), 24 * GIB, need, CONFIG) == (Reason.COMPUTE_CAPABILITY,)
    assert check_workload((6, 1), 24 * GIB, attrs.evolve(need, fp16=False), CONFIG) == ()
    assert check_workload(None, 24 * GIB, need, CONFIG) == ()  # not NVIDIA: rule n/a
    assert check_workload((7, 0), 24 * GIB, need, CONFIG) == ()


########################################################################################
# Throttle history
########################################################################################


def test_throttle_events_are_rising_edges_within_24h():
    history = ThrottleHistory(window_s=86400.0)
    # Throttled for three probes in a row: one event.
    for t in (0.0, 30.0, 60.0):
        history.observe("GPU-0", True, t)
    assert history.count("GPU-0", 60.0) == 1
    history.observe("GPU-0", False, 90.0)
    history.observe("GPU-0", True, 120.0)
    history.observe("GPU-0", None, 130.0)  # unknown changes nothing
    history.observe("GPU-0", False, 150.0)
    history.observe("GPU-0", True, 3600.0)
    assert history.count("GPU-0", 3600.0) == 3
    # The first event ages out 24 h after it happened.
    assert history.count("GPU-0", 86400.0 + 1) == 2
    assert history.count("GPU-0", 86400.0 + 3601) == 0
    assert history.count("GPU-other", 0.0) == 0


def test_throttle_history_is_bounded():
    history = ThrottleHistory(window_s=1e9, max_events=5)
    for i in range(100):
        history.observe("GPU-0", i % 2 == 0, float(i))
    assert history.count("GPU-0", 100.0) == 5


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0, 100)), max_size=40))
def test_throttle_count_never_exceeds_observations(observations):
    history = ThrottleHistory(window_s=50.0)
    now = 0.0
    rising = 0
    was = False
    for throttling, step in observations:
        now += step
        history.observe("g", throttling, now)
        rising += throttling and not was
        was = throttling
    assert 0 <= history.count("g", now) <= rising
