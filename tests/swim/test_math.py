"""The scaling formulas of `swim._math`, each against the numbers memberlist documents."""

from __future__ import annotations

import math

import pytest

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
