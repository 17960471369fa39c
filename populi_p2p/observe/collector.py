"""The node's Prometheus collector: reads the services' own counters at scrape time.

Nothing is counted twice: membership, transport, codec and GPU figures already live in
the services' ``statistics()`` snapshots, so this collector turns one snapshot of each
into metric families when Prometheus scrapes, and costs nothing between scrapes. The
names follow Prometheus conventions: a ``populi_`` prefix, the unit in the name, and
``_total`` on counters (prometheus-client adds it to counter families).
`docs/observability.md` lists every family.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from swim import MemberState

from .sources import MetricSources

__all__ = ["RTT_BUCKETS", "MetricSources", "NodeCollector"]  # MetricSources: re-exported

#: The bounds (seconds) of `populi_members_by_rtt`: loopback to intercontinental.
RTT_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

#: The transport's drop counters, by the reason label they get.
_UDP_DROPS: Final = ("oversize", "refused_source", "unclassified", "queue_full", "receive_errors")
_TCP_DROPS: Final = (
    "inbound_refused_source", "inbound_refused_capacity", "oversize_frames",
    "truncated_frames", "frame_timeouts", "unclassified", "queue_full",
)  # fmt: skip
_SWIM_DROPS: Final = (
    "dropped_malformed", "dropped_out_of_range", "dropped_invalid", "dropped_misdirected",
    "dropped_indirect_full",
)  # fmt: skip


class NodeCollector(Collector):
    """Membership, transport, GPU and event families of one node."""

    def __init__(self, sources: MetricSources) -> None:
        self._s = sources

    def collect(self) -> Iterator[Any]:
        yield from self._membership()
        yield from self._transport()
        yield from self._gpus()
        yield from self._events()

    def _membership(self) -> Iterator[Any]:
        s = self._s
        info = GaugeMetricFamily(
            "populi_node_info", "This node: always 1, with its id, name and software version.",
            labels=["node_id", "name", "version"],
        )  # fmt: skip
        info.add_metric([s.node_id, s.name, s.version], 1)
        yield info
        members = s.members()
        counts = {state.name.lower(): 0 for state in MemberState}
        rtts: list[float] = []
        for m in members:
            counts[m.state.name.lower()] += 1
            if m.rtt is not None and m.name != s.node_id:
                rtts.append(m.rtt)
        by_state = GaugeMetricFamily(
            "populi_members", "Members of the mesh by state, as this node sees them.",
            labels=["state"],
        )  # fmt: skip
        for state, n in counts.items():
            by_state.add_metric([state], n)
        yield by_state
        yield from _rtt_gauges(rtts)
        awareness = GaugeMetricFamily(
            "populi_awareness_score",
            "Lifeguard local health: 0 is healthy; higher stretches our probe timeouts.",
        )
        awareness.add_metric([], s.awareness())
        yield awareness
        st = s.swim()
        for name, doc, value in (
            ("populi_suspicions", "Suspicions this node started.", st.suspicions_started),
            ("populi_refutations", "Suspicions of us that we refuted.", st.refutes),
            ("populi_member_deaths", "Members this node saw declared dead.", st.members_failed),
            ("populi_members_reaped", "Dead members forgotten.", st.members_reaped),
            ("populi_probes", "Direct probes sent.", st.probes_sent),
            ("populi_probes_failed", "Probes that got no ack.", st.probes_failed),
            ("populi_indirect_probes", "Indirect probes asked of others.", st.indirect_probes_sent),
            ("populi_push_pulls", "Full state syncs started.", st.push_pulls_sent),
        ):
            counter = CounterMetricFamily(name, doc)
            counter.add_metric([], value)
            yield counter

    def _transport(self) -> Iterator[Any]:
        s = self._s
        t = s.transport()
        packets = CounterMetricFamily(
            "populi_transport_packets",
            "Datagrams (udp) and frames (tcp) by direction.",
            labels=["protocol", "direction"],
        )
        packets.add_metric(["udp", "in"], t.udp.received)
        packets.add_metric(["udp", "out"], t.udp.sent)
        packets.add_metric(["tcp", "in"], t.tcp.frames_received)
        packets.add_metric(["tcp", "out"], t.tcp.frames_sent)
        yield packets
        bytes_in, bytes_out = s.traffic()
        sealed = CounterMetricFamily(
            "populi_transport_bytes", "Sealed payload bytes by direction.", labels=["direction"]
        )
        sealed.add_metric(["in"], bytes_in)
        sealed.add_metric(["out"], bytes_out)
        yield sealed
        drops = CounterMetricFamily(
            "populi_transport_drops",
            "Packets dropped, by the layer that dropped them and why.",
            labels=["layer", "reason"],
        )
        for reason in _UDP_DROPS:
            drops.add_metric(["udp", reason], getattr(t.udp, reason))
        for reason in _TCP_DROPS:
            drops.add_metric(["tcp", reason], getattr(t.tcp, reason))
        for lane, n in enumerate(t.inbox.dropped_full):
            drops.add_metric(["inbox", f"lane{lane}_full"], n)
        for reason, n in sorted(s.auth_drops().items()):
            drops.add_metric(["auth", reason], n)
        for reason, n in sorted(s.record_drops().items()):
            drops.add_metric(["record", reason], n)
        st = s.swim()
        for reason in _SWIM_DROPS:
            drops.add_metric(["swim", reason.removeprefix("dropped_")], getattr(st, reason))
        drops.add_metric(["driver", "undecodable"], s.driver().packets_dropped)
        yield drops
        blocked = GaugeMetricFamily(
            "populi_udp_blocked_peers", "Peers reachable over TCP whose UDP seems blocked."
        )
        blocked.add_metric([], len(t.udp_blocked_peers))
        yield blocked

    def _gpus(self) -> Iterator[Any]:
        report = self._s.gpu_report()
        labels = ["gpu", "uuid", "model"]
        memory = GaugeMetricFamily(
            "populi_gpu_memory_bytes", "Device memory (Layer A, measured).",
            labels=[*labels, "kind"],
        )  # fmt: skip
        util = GaugeMetricFamily(
            "populi_gpu_utilization_ratio", "GPU busy fraction (Layer A).", labels=labels
        )
        temp = GaugeMetricFamily(
            "populi_gpu_temperature_celsius", "GPU temperature (Layer A).", labels=labels
        )
        power = GaugeMetricFamily("populi_gpu_power_watts", "Power draw (Layer A).", labels=labels)
        alloc = GaugeMetricFamily(
            "populi_gpu_allocatable_vram_bytes",
            "VRAM the node offers to the mesh (Layer B, derived: reserve and withheld applied).",
            labels=labels,
        )
        health = GaugeMetricFamily(
            "populi_gpu_health", "1 for the device's current health state.",
            labels=[*labels, "state"],
        )  # fmt: skip
        eligible = GaugeMetricFamily(
            "populi_gpu_eligible", "1 when the device may take work.", labels=labels
        )
        if report is not None:
            for d, h, c in zip(
                report.facts.devices, report.health, report.capacity.devices, strict=False
            ):
                key = [str(d.index), d.uuid or "", d.name or ""]
                for kind in ("total", "used", "free"):
                    value = getattr(d, f"memory_{kind}")
                    if value is not None:
                        memory.add_metric([*key, kind], value)
                if d.utilization_gpu is not None:
                    util.add_metric(key, d.utilization_gpu / 100.0)
                if d.temperature_c is not None:
                    temp.add_metric(key, d.temperature_c)
                if d.power_draw_w is not None:
                    power.add_metric(key, d.power_draw_w)
                alloc.add_metric(key, c.vram)
                health.add_metric([*key, str(h.state)], 1)
                eligible.add_metric(key, 1 if h.eligible else 0)
        yield from (memory, util, temp, power, alloc, health, eligible)

    def _events(self) -> Iterator[Any]:
        events = CounterMetricFamily(
            "populi_events", "Feed events published, by kind.", labels=["kind"]
        )
        for kind, n in sorted(self._s.event_counts().items()):
            events.add_metric([kind], n)
        yield events
        lost = CounterMetricFamily(
            "populi_events_lost", "Feed events a slow reader lost (it fell behind)."
        )
        lost.add_metric([], self._s.events_dropped())
        yield lost


def _rtt_gauges(rtts: list[float]) -> Iterator[GaugeMetricFamily]:
    """The members' smoothed probe RTTs now, as gauges: how many are within each bound
    (cumulative over the bounds), and the slowest. Not a histogram: members move
    between bounds, so these go down as well as up, which a histogram's buckets (read
    by ``rate()`` as counters) must never do."""
    rtts.sort()
    within = GaugeMetricFamily(
        "populi_members_by_rtt",
        "Members whose smoothed probe RTT (EWMA of direct acks) is at most `rtt_at_most`"
        " seconds now; +Inf: every member with an RTT yet.",
        labels=["rtt_at_most"],
    )
    i = 0
    for bound in RTT_BUCKETS:
        while i < len(rtts) and rtts[i] <= bound:
            i += 1
        within.add_metric([repr(bound)], i)
    within.add_metric(["+Inf"], len(rtts))
    yield within
    slowest = GaugeMetricFamily(
        "populi_member_rtt_max_seconds",
        "The slowest member's smoothed probe RTT now (absent before any RTT).",
    )
    if rtts:
        slowest.add_metric([], rtts[-1])
    yield slowest
