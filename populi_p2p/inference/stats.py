"""What the public inference API counts for ``/metrics``: requests by outcome, the time
to the first streamed byte as a histogram, and relay failovers.

Plain counters, no prometheus-client here: the node's `InferenceCollector`
(`observe.work_collector`) turns a `statistics()` snapshot into metric families at
scrape time. The outcome set is fixed (`OUTCOMES`), so the label stays low-cardinality
whatever clients send.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import Final

import attrs

from .relay import Attempt

__all__ = ["OUTCOMES", "TTFT_BUCKETS", "InferenceStatistics", "InferenceStats", "outcome_of"]

#: Upper bounds (seconds) of the time-to-first-token buckets: a warm local engine's
#: tens of milliseconds to a long prefill on a busy node.
TTFT_BUCKETS: Final = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Every value of the ``outcome`` label: served; the engine's 4xx passed back
#: (client_error); no node serves the model or none is eligible (no_route); every
#: capable node failed (failed); the request itself was refused before routing
#: (rejected: a bad body, a key not allowed the model).
OUTCOMES: Final = ("served", "client_error", "no_route", "failed", "rejected")


def outcome_of(status: int) -> str:
    """The outcome label of a relayed request's final status (0: every node failed)."""
    if status == 0 or status >= 500:
        return "failed"
    if status >= 400:
        return "client_error"
    return "served"


@attrs.frozen
class InferenceStatistics:
    """One snapshot. `ttft_counts` has one count per bucket of `TTFT_BUCKETS` plus one
    for above the last bound (not cumulative: the collector sums them)."""

    requests: Mapping[str, int]
    ttft_counts: tuple[int, ...]
    ttft_sum: float
    failovers: int


class InferenceStats:
    """The counters one `InferenceService` keeps."""

    def __init__(self) -> None:
        self._requests = dict.fromkeys(OUTCOMES, 0)
        self._ttft = [0] * (len(TTFT_BUCKETS) + 1)
        self._ttft_sum = 0.0
        self._failovers = 0

    def request(self, outcome: str) -> None:
        """Count one request that ended with `outcome` (one of `OUTCOMES`)."""
        if outcome not in self._requests:
            raise ValueError(f"unknown inference outcome {outcome!r} (one of {OUTCOMES})")
        self._requests[outcome] += 1

    def first_token(self, seconds: float) -> None:
        """A streamed response's first byte went out `seconds` after the request was read."""
        seconds = max(0.0, seconds)
        self._ttft[bisect.bisect_left(TTFT_BUCKETS, seconds)] += 1
        self._ttft_sum += seconds

    def attempts(self, attempts: list[Attempt]) -> None:
        """Count the failovers of one request: every node asked after the first."""
        self._failovers += max(0, len(attempts) - 1)

    def statistics(self) -> InferenceStatistics:
        return InferenceStatistics(
            requests=dict(self._requests),
            ttft_counts=tuple(self._ttft),
            ttft_sum=self._ttft_sum,
            failovers=self._failovers,
        )
