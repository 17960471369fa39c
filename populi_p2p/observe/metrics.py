"""The metrics service: one node's Prometheus registry.

Each node owns a `CollectorRegistry` (never the process-global one: tests and the
simulator run several nodes in one process). Services register collectors that read
their own statistics at scrape time (`register`); the task, lease and inference issues
add theirs the same way, so ``GET /metrics`` grows without this file changing. The text
is always written by prometheus-client (`render`), never by hand.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "MetricsService"]

#: The content type of `render`'s output (the Prometheus text format 0.0.4).
CONTENT_TYPE = CONTENT_TYPE_LATEST


class MetricsService:
    """A per-node registry: `register` collectors, `render` a scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)

    def register(self, collector: Collector) -> None:
        """Add a collector (its `collect` runs on every scrape: keep it cheap)."""
        self.registry.register(collector)

    def unregister(self, collector: Collector) -> None:
        self.registry.unregister(collector)

    def render(self) -> bytes:
        """One scrape in the Prometheus text format."""
        return generate_latest(self.registry)
