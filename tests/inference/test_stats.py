"""`InferenceStats`: requests by outcome, the time-to-first-token buckets, failovers."""

from __future__ import annotations

import pytest

from populi_p2p.inference.relay import Attempt
from populi_p2p.inference.stats import OUTCOMES, TTFT_BUCKETS, InferenceStats, outcome_of


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(0, "failed"), (200, "served"), (299, "served"), (400, "client_error"),
     (429, "client_error"), (499, "client_error"), (500, "failed"), (503, "failed")],
)  # fmt: skip
def test_outcome_of_a_final_status(status: int, outcome: str) -> None:
    assert outcome_of(status) == outcome


def test_requests_are_counted_by_outcome_and_unknown_ones_refused() -> None:
    stats = InferenceStats()
    for outcome in ("served", "served", "no_route"):
        stats.request(outcome)
    assert stats.statistics().requests == dict.fromkeys(OUTCOMES, 0) | {
        "served": 2,
        "no_route": 1,
    }
    with pytest.raises(ValueError, match="unknown inference outcome 'weird'"):
        stats.request("weird")
    assert "weird" not in stats.statistics().requests


def test_first_tokens_fall_in_their_buckets() -> None:
    stats = InferenceStats()
    for seconds in (-1.0, 0.025, 0.026, 30.0, 31.0):
        stats.first_token(seconds)
    snapshot = stats.statistics()
    assert len(snapshot.ttft_counts) == len(TTFT_BUCKETS) + 1
    assert snapshot.ttft_counts[0] == 2  # a negative clock step counts as 0; the bound is <=
    assert snapshot.ttft_counts[1] == 1
    assert snapshot.ttft_counts[TTFT_BUCKETS.index(30.0)] == 1
    assert snapshot.ttft_counts[-1] == 1  # above the last bound
    assert snapshot.ttft_sum == pytest.approx(0.025 + 0.026 + 30.0 + 31.0)


def test_failovers_are_the_nodes_asked_after_the_first() -> None:
    stats = InferenceStats()
    stats.attempts([])
    stats.attempts([Attempt("a", "served")])
    stats.attempts([Attempt("a", "refused: busy"), Attempt("b", "broken: reset"),
                    Attempt("c", "served")])  # fmt: skip
    assert stats.statistics().failovers == 2


def test_a_snapshot_does_not_move_with_the_counters() -> None:
    stats = InferenceStats()
    snapshot = stats.statistics()
    stats.request("served")
    assert snapshot.requests["served"] == 0
