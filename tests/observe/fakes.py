"""Metric sources with made-up numbers, for the collector tests."""

from __future__ import annotations

from typing import Any

import attrs

from overlay.inbox import InboxStatistics
from overlay.tcp import TcpStatistics
from overlay.transport import TransportStatistics
from overlay.udp import UdpStatistics
from populi_p2p.driver import DriverStatistics
from populi_p2p.observe import MetricSources
from swim import Member, MembershipStatistics


def zeros(cls: Any, **values: Any) -> Any:
    """An attrs statistics class with every int field 0 (tuples empty), then `values`."""
    fields = {}
    for f in attrs.fields(cls):
        fields[f.name] = () if "tuple" in str(f.type) else 0
    fields.update(values)
    return cls(**fields)


def transport_stats(**udp: int) -> TransportStatistics:
    return TransportStatistics(
        local_address=("127.0.0.1", 1),
        udp=zeros(UdpStatistics, **udp),
        tcp=zeros(TcpStatistics),
        inbox=InboxStatistics((0, 0), (0, 0), (0, 0), (0, 3), (0, 0), (0, 0)),
        udp_blocked_peers=(),
    )


def sources(
    members: list[Member],
    report: Any = None,
    *,
    swim: MembershipStatistics | None = None,
    transport: TransportStatistics | None = None,
    auth_drops: dict[str, int] | None = None,
    version: str = "",
) -> MetricSources:
    return MetricSources(
        node_id="n-self",
        name="self",
        members=lambda: members,
        awareness=lambda: 2,
        swim=lambda: swim if swim is not None else MembershipStatistics(),
        driver=lambda: zeros(DriverStatistics),
        transport=lambda: transport if transport is not None else transport_stats(),
        traffic=lambda: (1000, 2000),
        auth_drops=lambda: auth_drops or {"replay": 0, "bad_mac": 0},
        record_drops=lambda: {"bad_signature": 0},
        gpu_report=lambda: report,
        event_counts=lambda: {"member.dead": 1},
        version=version,
    )
