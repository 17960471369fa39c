"""`MetricSources`: the read-only queries the node's metrics collector reads at scrape
time, and `TaskStatistics`, what the lease service hands its collector.

Apart from the collectors (`collector.py`, `work_collector.py`), so that the node can
wire its metrics without importing prometheus-client: that is imported at the first
scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from overlay.transport import TransportStatistics
from swim import Member, MembershipStatistics

from ..driver import DriverStatistics

__all__ = ["MetricSources", "TaskStatistics"]


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
    #: The software version this node runs (its record's, for `populi_node_info`).
    version: str = ""


@attrs.frozen
class TaskStatistics:
    """One snapshot of the lease service, for ``/metrics``.

    Every mapping has a fixed, small key set (phases, outcomes, refusal reasons), so no
    label grows with the number of tasks or members.
    """

    #: Tasks in the lease table by phase (every `TaskPhase`, zeros included).
    by_phase: Mapping[str, int]
    #: Task processes started on this node.
    starts: int
    #: Task processes that ended here: succeeded, failed, released (handed back).
    exits: Mapping[str, int]
    #: Lease claims this node proposed, by outcome: won (a majority granted), lost.
    claims: Mapping[str, int]
    #: Grants this node refused as a replica, by reason.
    grants_refused: Mapping[str, int]
    #: Runs this node fenced (stopped because its lease could not be renewed).
    fenced: int
    #: Leases this node holds as owner now.
    held: int
