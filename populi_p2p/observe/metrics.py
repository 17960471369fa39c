"""The metrics service: one node's Prometheus registry.

Each node owns a `CollectorRegistry` (never the process-global one: tests and the
simulator run several nodes in one process). Services register collectors that read
their own statistics at scrape time (`register`, or `register_factory` to build the
collector only at the first scrape); the task, lease and inference issues add theirs the
same way, so ``GET /metrics`` grows without this file changing. The text is always
written by prometheus-client (`render`), never by hand. prometheus-client is imported
when the registry is first needed, not when the node starts (start-up CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.registry import Collector

__all__ = ["MetricsService", "content_type"]


def content_type() -> str:
    """The content type of `render`'s output (prometheus-client's text format)."""
    from prometheus_client import CONTENT_TYPE_LATEST

    return CONTENT_TYPE_LATEST


class MetricsService:
    """A per-node registry: `register` collectors, `render` a scrape."""

    def __init__(self) -> None:
        self._registry: CollectorRegistry | None = None
        self._factories: list[Callable[[], Collector]] = []

    @property
    def registry(self) -> CollectorRegistry:
        """The registry, made (and the deferred collectors built) on first use."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry, ProcessCollector

            self._registry = CollectorRegistry(auto_describe=False)
            # process_cpu_seconds_total, process_resident_memory_bytes, open fds...:
            # prometheus-client's own, read from /proc at scrape time (Linux; elsewhere
            # it yields nothing).
            ProcessCollector(registry=self._registry)
            factories, self._factories = self._factories, []
            for factory in factories:
                self._registry.register(factory())
        return self._registry

    def register(self, collector: Collector) -> None:
        """Add a collector (its `collect` runs on every scrape: keep it cheap)."""
        self.registry.register(collector)

    def register_factory(self, factory: Callable[[], Collector]) -> None:
        """Add the collector `factory` builds, once the registry is first needed."""
        if self._registry is None:
            self._factories.append(factory)
        else:
            self._registry.register(factory())

    def unregister(self, collector: Collector) -> None:
        self.registry.unregister(collector)

    def render(self) -> bytes:
        """One scrape in the Prometheus text format."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
