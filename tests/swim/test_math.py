"""Per-mechanism unit tables: scaling formulas, awareness, suspicion, config."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

from swim import Awareness, Suspicion, SwimConfig, remaining_suspicion_time
from swim._math import (
    push_pull_interval_scaled,
    retransmit_limit,
    smoothed_rtt,
    suspicion_confirmations_expected,
    suspicion_timeout_max,
    suspicion_timeout_min,
)

####################################################################################
# _math: each formula against the numbers the issue and memberlist document
####################################################################################


@pytest.mark.parametrize(
    ("mult", "n", "expected"),
    [
        (4, 0, 0),
        (4, 1, 4),  # ceil(log10(2)) = 1
        (4, 9, 4),  # log10(10) = 1 exactly
        (4, 10, 8),  # ceil(log10(11)) = 2
        (4, 99, 8),
        (4, 1000, 16),  # ceil(log10(1001)) = 4
        (4, 10_000, 20),
        (2, 100, 6),
    ],
)
def test_retransmit_limit(mult: int, n: int, expected: int) -> None:
    assert retransmit_limit(mult, n) == expected


@pytest.mark.parametrize(
    ("mult", "n", "interval", "expected"),
    [
        (4, 0, 1.0, 4 * math.log10(2)),  # n is floored at 1
        (4, 1, 1.0, 4 * math.log10(2)),
        (4, 9, 1.0, 4.0),  # log10(10) = 1
        (4, 999, 1.0, 12.0),
        (5, 99, 2.0, 20.0),
    ],
)
def test_suspicion_timeout_min(mult: int, n: int, interval: float, expected: float) -> None:
    assert suspicion_timeout_min(mult, n, interval) == pytest.approx(expected)


def test_suspicion_timeout_max_is_a_multiple_of_min() -> None:
    assert suspicion_timeout_max(6, 4.0) == 24.0


@pytest.mark.parametrize(
    ("mult", "n", "expected"),
    [(4, 1, 0), (4, 3, 0), (4, 4, 2), (4, 100, 2), (6, 5, 0), (6, 6, 4), (1, 100, 0)],
)
def test_suspicion_confirmations_expected(mult: int, n: int, expected: int) -> None:
    assert suspicion_confirmations_expected(mult, n) == expected


@pytest.mark.parametrize(
    ("n", "expected"),
    [(1, 30.0), (32, 30.0), (33, 60.0), (64, 60.0), (65, 90.0), (1000, 180.0), (10_000, 300.0)],
)
def test_push_pull_interval_scaled(n: int, expected: float) -> None:
    assert push_pull_interval_scaled(30.0, n) == expected


@pytest.mark.parametrize(
    ("previous", "sample", "expected"),
    [
        (None, 0.004, 0.004),  # the first sample is the estimate
        (0.004, 0.004, 0.004),
        (0.020, 0.004, 0.018),  # an eighth of the way to the sample
        (0.004, 0.020, 0.006),
    ],
)
def test_smoothed_rtt(previous: float | None, sample: float, expected: float) -> None:
    assert smoothed_rtt(previous, sample) == pytest.approx(expected)


####################################################################################
# Awareness: memberlist's TestAwareness, case for case
####################################################################################

AWARENESS_CASES = [
    (0, 0, 1.0),
    (-1, 0, 1.0),
    (-10, 0, 1.0),
    (1, 1, 2.0),
    (-1, 0, 1.0),
    (10, 7, 8.0),
    (-1, 6, 7.0),
    (-1, 5, 6.0),
    (-1, 4, 5.0),
    (-1, 3, 4.0),
    (-1, 2, 3.0),
    (-1, 1, 2.0),
    (-1, 0, 1.0),
    (-1, 0, 1.0),
]


def test_awareness_table() -> None:
    awareness = Awareness(8)
    for delta, score, timeout in AWARENESS_CASES:
        assert awareness.apply_delta(delta) == score
        assert awareness.score == score
        assert awareness.scale(1.0) == timeout


def test_awareness_rejects_zero_max() -> None:
    with pytest.raises(ValueError, match="max_multiplier"):
        Awareness(0)


####################################################################################
# Suspicion: memberlist's remainingSuspicionTime table and timer cases
####################################################################################


@pytest.mark.parametrize(
    ("n", "k", "elapsed", "expected"),
    [
        (0, 3, 0.0, 30.0),
        (1, 3, 2.0, 14.0),
        (2, 3, 3.0, 4.810),
        (3, 3, 4.0, -2.0),
        (4, 3, 5.0, -3.0),
        (5, 3, 10.0, -8.0),
    ],
)
def test_remaining_suspicion_time(n: int, k: int, elapsed: float, expected: float) -> None:
    assert remaining_suspicion_time(n, k, elapsed, 2.0, 30.0) == pytest.approx(expected, abs=1e-9)


def test_remaining_suspicion_time_without_expected_confirmations_is_min() -> None:
    assert remaining_suspicion_time(0, 0, 1.5, 2.0, 30.0) == pytest.approx(0.5)


# memberlist's TestSuspicion_Timer: k=3, min 0.5 s, max 2 s; each case lists the
# confirmations (from, counted?) and the time the timer must fire.
TIMER_CASES = [
    ("no confirmations", [], 2.0),
    ("one", [("bar", True)], 1.25),
    ("one, duplicated", [("bar", True), ("bar", False)], 1.25),
    ("two", [("bar", True), ("baz", True)], 0.811),
    ("two, with the source", [("bar", True), ("me", False), ("baz", True)], 0.811),
    ("three", [("bar", True), ("baz", True), ("zoo", True)], 0.5),
    ("k exceeded", [("bar", True), ("baz", True), ("zoo", True), ("late", False)], 0.5),
]


@pytest.mark.parametrize(("name", "confirmations", "fires_after"), TIMER_CASES)
def test_suspicion_timer(
    name: str, confirmations: list[tuple[str, bool]], fires_after: float
) -> None:
    start = 100.0
    suspicion = Suspicion("me", 3, 0.5, 2.0, start)
    # memberlist confirms 25 ms in, before the timer could have fired.
    for source, counted in confirmations:
        assert suspicion.confirm(source, start + 0.025) is counted
    assert suspicion.deadline - start == pytest.approx(fires_after, abs=1e-9)
    assert suspicion.confirmations == sum(counted for _, counted in confirmations)


def test_suspicion_with_k_zero_is_fixed_at_min() -> None:
    suspicion = Suspicion("me", 0, 3.0, 18.0, 10.0)
    assert suspicion.deadline == 13.0
    assert suspicion.confirm("other", 11.0) is False
    assert suspicion.deadline == 13.0
    assert suspicion.remaining(12.0) == pytest.approx(1.0)


####################################################################################
# SwimConfig
####################################################################################


def test_lan_preset_is_memberlists_lan_defaults() -> None:
    lan = SwimConfig.lan()
    assert (lan.probe_interval, lan.probe_timeout, lan.indirect_checks) == (1.0, 0.5, 3)
    assert (lan.suspicion_mult, lan.suspicion_max_mult, lan.retransmit_mult) == (4, 6, 4)
    assert (lan.gossip_interval, lan.gossip_nodes) == (0.2, 3)
    assert (lan.awareness_max_multiplier, lan.push_pull_interval) == (8, 30.0)
    assert lan == SwimConfig()  # the defaults are the LAN preset


def test_wan_and_local_presets() -> None:
    wan, local = SwimConfig.wan(), SwimConfig.local()
    assert (wan.probe_interval, wan.probe_timeout, wan.suspicion_mult) == (5.0, 3.0, 6)
    assert (wan.gossip_nodes, wan.gossip_interval, wan.push_pull_interval) == (4, 0.5, 60.0)
    assert (local.indirect_checks, local.retransmit_mult, local.suspicion_mult) == (1, 2, 3)
    assert (local.probe_timeout, local.gossip_interval, local.push_pull_interval) == (
        0.2,
        0.1,
        15.0,
    )


def test_lifeguard_switch() -> None:
    off = SwimConfig.lan().with_lifeguard(False)
    assert not off.lifeguard
    assert not (
        off.awareness_enabled
        or off.dynamic_suspicion_enabled
        or off.buddy_enabled
        or off.nack_enabled
    )
    assert off.with_lifeguard(True).lifeguard
    assert SwimConfig.lan().lifeguard


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"probe_interval": 0.0}, "probe_interval must be > 0"),
        ({"probe_timeout": 1.0}, "probe_timeout must be shorter"),
        ({"suspicion_mult": 0}, "suspicion_mult must be >= 1"),
        ({"push_pull_interval": -1.0}, "push_pull_interval must be >= 0"),
        ({"packet_budget": 64}, "packet_budget must be >= 128"),
        ({"indirect_checks": -1}, "indirect_checks must be >= 0"),
    ],
)
def test_config_validation(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        attrs.evolve(SwimConfig.lan(), **changes)
