"""`MetricSources`: the read-only queries the node's metrics collector reads at scrape time.

Apart from the collector (`collector.py`), so that the node can wire its metrics
without importing prometheus-client: that is imported at the first scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from overlay.transport import TransportStatistics
from swim import Member, MembershipStatistics

from ..driver import DriverStatistics

__all__ = ["MetricSources"]


@attrs.frozen
class MetricSources:
    """The read-only queries the collector calls; each is a service's own snapshot."""

    node_id: str
    name: str
    members: Callable[[], Sequence[Member]]
    awareness: Callable[[], int]
    swim: Callable[[], MembershipStatistics]
    driver: Callable[[], DriverStatistics]
    transport: Callable[[], TransportStatistics]
    #: (bytes in, bytes out) through the packet codec.
    traffic: Callable[[], tuple[int, int]]
    #: Packets refused by the authentication envelope, by reason.
    auth_drops: Callable[[], Mapping[str, int]]
    #: Member records refused, by reason.
    record_drops: Callable[[], Mapping[str, int]]
    #: This node's latest `GpuReport`, or None before the first probe.
    gpu_report: Callable[[], Any]
    #: Events published by kind, and events subscribers lost.
    event_counts: Callable[[], Mapping[str, int]] = dict
    events_dropped: Callable[[], int] = lambda: 0
