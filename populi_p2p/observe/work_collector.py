"""The collectors of the node's work: tasks and leases (`TaskCollector`) and the public
inference API (`InferenceCollector`).

Each reads one snapshot of its service at scrape time (`LeaseService.statistics`,
`InferenceStats.statistics`), as `NodeCollector` does, so nothing is counted twice and
nothing costs anything between scrapes. Every label takes values from a fixed set:
phases, outcomes, refusal reasons. `docs/observability.md` lists the families.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .sources import TaskStatistics

if TYPE_CHECKING:
    from ..inference.stats import InferenceStatistics

__all__ = ["BlobCollector", "InferenceCollector", "TaskCollector"]


def _counter(name: str, doc: str, label: str, values: dict[str, int] | Any) -> Any:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(values.items()):
        family.add_metric([key], n)
    return family


class TaskCollector(Collector):
    """Tasks by phase, task starts and ends here, lease claims, refusals, fencing."""

    def __init__(self, statistics: Callable[[], TaskStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[Any]:
        s = self._statistics()
        tasks = GaugeMetricFamily(
            "populi_tasks", "Tasks in the lease table (the mesh's, as held here) by phase.",
            labels=["phase"],
        )  # fmt: skip
        for phase, n in s.by_phase.items():
            tasks.add_metric([phase], n)
        yield tasks
        starts = CounterMetricFamily("populi_task_starts", "Task processes started on this node.")
        starts.add_metric([], s.starts)
        yield starts
        yield _counter(
            "populi_task_exits", "Task processes that ended on this node, by outcome"
            " (released: handed back, e.g. at shutdown or handoff).", "outcome", s.exits,
        )  # fmt: skip
        yield _counter(
            "populi_lease_claims", "Lease claims this node proposed, by outcome (won: a majority"
            " of the task's replicas granted the epoch).", "outcome", s.claims,
        )  # fmt: skip
        yield _counter(
            "populi_lease_grants_refused", "Grants this node refused as a task's replica,"
            " by reason.", "reason", s.grants_refused,
        )  # fmt: skip
        fenced = CounterMetricFamily(
            "populi_lease_fenced", "Runs stopped here because their lease could not be renewed."
        )
        fenced.add_metric([], s.fenced)
        yield fenced
        held = GaugeMetricFamily("populi_leases_held", "Leases this node holds as owner now.")
        held.add_metric([], s.held)
        yield held


class InferenceCollector(Collector):
    """Requests by outcome, time to first token, relay failovers (the public API)."""

    def __init__(self, statistics: Callable[[], InferenceStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[Any]:
        from ..inference.stats import TTFT_BUCKETS

        s = self._statistics()
        yield _counter(
            "populi_inference_requests", "Requests to this node's OpenAI-compatible API, by"
            " outcome.", "outcome", s.requests,
        )  # fmt: skip
        buckets: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip((*map(repr, TTFT_BUCKETS), "+Inf"), s.ttft_counts, strict=True):
            total += n
            buckets.append((bound, float(total)))
        yield HistogramMetricFamily(
            "populi_inference_ttft_seconds",
            "Time from a streamed request read to its first byte sent (routing, relay, prefill).",
            buckets=buckets, sum_value=s.ttft_sum,
        )  # fmt: skip
        failovers = CounterMetricFamily(
            "populi_relay_failovers", "Times a request moved on to the next node of its route."
        )
        failovers.add_metric([], s.failovers)
        yield failovers


class BlobCollector(Collector):
    """The blob store (docs/models.md, docs/artifacts.md): bytes held, the quota, and
    bytes transferred in (fetched from members) and out (served to them)."""

    def __init__(self, statistics: Callable[[], dict[str, Any] | None]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[Any]:
        s = self._statistics()
        if s is None:  # the blob service is still starting
            return
        held = GaugeMetricFamily("populi_blob_bytes", "Bytes of blobs held in this node's store.")
        held.add_metric([], s["used"])
        yield held
        quota = GaugeMetricFamily("populi_blob_quota_bytes", "The blob store's quota (0: none).")
        quota.add_metric([], s["quota"])
        yield quota
        moved = {"in": s["fetched_bytes"], "out": s["served_bytes"]}
        yield _counter(
            "populi_blob_transferred_bytes",
            "Blob bytes fetched from members (in) and served to them (out).", "direction", moved,
        )  # fmt: skip
