"""Suspicion: memberlist's remainingSuspicionTime table and its timer cases."""

from __future__ import annotations

import pytest

from swim import Suspicion, remaining_suspicion_time

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
