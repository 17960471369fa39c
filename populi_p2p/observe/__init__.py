"""Seeing the mesh: Prometheus metrics, an event feed and the dashboard.

See docs/observability.md. Other services add metrics by registering a collector with
the node's `MetricsService` and events with `EventService.publish`.
"""

from typing import TYPE_CHECKING, Any

from .events import EventService as EventService
from .metrics import MetricsService as MetricsService
from .sources import MetricSources as MetricSources
from .view import ObserveView as ObserveView
from .web import make_observe_app as make_observe_app
from .web import mount as mount

if TYPE_CHECKING:
    from .collector import NodeCollector as NodeCollector

__all__ = [
    "EventService",
    "MetricSources",
    "MetricsService",
    "NodeCollector",
    "ObserveView",
    "make_observe_app",
    "mount",
]


def __getattr__(name: str) -> Any:
    """`NodeCollector` is imported on first use: it imports prometheus-client."""
    if name == "NodeCollector":
        from .collector import NodeCollector

        return NodeCollector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
