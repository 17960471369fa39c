"""Seeing the mesh: Prometheus metrics, an event feed and the dashboard (issue 12).

See docs/observability.md. Other services add metrics by registering a collector with
the node's `MetricsService` and events with `EventService.publish`.
"""

from .collector import MetricSources as MetricSources
from .collector import NodeCollector as NodeCollector
from .events import EventService as EventService
from .metrics import MetricsService as MetricsService
from .view import ObserveView as ObserveView
from .web import make_observe_app as make_observe_app
from .web import mount as mount

__all__ = [
    "EventService",
    "MetricSources",
    "MetricsService",
    "NodeCollector",
    "ObserveView",
    "make_observe_app",
    "mount",
]
