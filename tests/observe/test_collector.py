"""The node collector, scraped through a real registry and parsed by prometheus-client."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from prometheus_client.parser import text_string_to_metric_families

from populi_p2p.gpu import HardwareFacts, build_report
from populi_p2p.observe import MetricsService, NodeCollector
from swim import Member, MembershipStatistics, MemberState
from tests.gpu.gpu_helpers import hardware_facts

from .fakes import sources, transport_stats


def scrape(service: MetricsService) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(service.render().decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def one(samples: dict[str, list[Any]], name: str, **labels: str) -> float:
    found = [
        s.value
        for s in samples.get(name, [])
        if all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (name, labels, samples.get(name))
    return float(found[0])


def member(i: int, state: MemberState, rtt: float | None) -> Member:
    return Member(f"n-{i}", ("127.0.0.1", 1000 + i), state, 1, rtt=rtt)


def test_membership_transport_and_event_families() -> None:
    members = [
        member(0, MemberState.ALIVE, 0.0004),
        member(1, MemberState.ALIVE, 0.02),
        member(2, MemberState.SUSPECT, 2.0),
        member(3, MemberState.DEAD, None),
    ]
    stats = MembershipStatistics(suspicions_started=4, refutes=1, members_failed=3)
    service = MetricsService()
    service.register(
        NodeCollector(
            sources(
                members,
                swim=stats,
                transport=transport_stats(received=7, sent=9, refused_source=5),
                auth_drops={"bad_mac": 11},
            )
        )
    )
    s = scrape(service)
    assert one(s, "populi_members", state="alive") == 2
    assert one(s, "populi_members", state="suspect") == 1
    assert one(s, "populi_members", state="dead") == 1
    assert one(s, "populi_members", state="left") == 0
    assert one(s, "populi_suspicions_total") == 4
    assert one(s, "populi_refutations_total") == 1
    assert one(s, "populi_member_deaths_total") == 3
    assert one(s, "populi_awareness_score") == 2
    # Members by RTT: gauges, cumulative over the bounds, of the three measured members.
    assert one(s, "populi_members_by_rtt", rtt_at_most="0.0005") == 1
    assert one(s, "populi_members_by_rtt", rtt_at_most="0.025") == 2
    assert one(s, "populi_members_by_rtt", rtt_at_most="+Inf") == 3
    assert one(s, "populi_member_rtt_max_seconds") == 2.0
    assert one(s, "populi_transport_packets_total", protocol="udp", direction="in") == 7
    assert one(s, "populi_transport_packets_total", protocol="udp", direction="out") == 9
    assert one(s, "populi_transport_bytes_total", direction="out") == 2000
    assert one(s, "populi_transport_drops_total", layer="udp", reason="refused_source") == 5
    assert one(s, "populi_transport_drops_total", layer="auth", reason="bad_mac") == 11
    assert one(s, "populi_transport_drops_total", layer="inbox", reason="lane1_full") == 3
    assert one(s, "populi_events_total", kind="member.dead") == 1
    # No GPU report yet: the GPU families are present but empty.
    assert "populi_gpu_allocatable_vram_bytes" not in s


@given(facts=hardware_facts(max_devices=4))
def test_gpu_families_match_the_report(facts: HardwareFacts) -> None:
    report = build_report(facts)
    service = MetricsService()
    service.register(NodeCollector(sources([], report)))
    s = scrape(service)
    for d, h, c in zip(report.facts.devices, report.health, report.capacity.devices, strict=True):
        key = {"gpu": str(d.index), "uuid": d.uuid}
        assert one(s, "populi_gpu_allocatable_vram_bytes", **key) == c.vram
        assert one(s, "populi_gpu_health", **key, state=str(h.state)) == 1
        assert one(s, "populi_gpu_eligible", **key) == (1 if h.eligible else 0)
        if d.memory_used is not None:
            assert one(s, "populi_gpu_memory_bytes", **key, kind="used") == d.memory_used


def test_registries_are_per_node_and_take_extra_collectors() -> None:
    class Tasks:
        def collect(self) -> Any:
            from prometheus_client.core import GaugeMetricFamily

            g = GaugeMetricFamily("populi_tasks", "Tasks by phase.", labels=["phase"])
            g.add_metric(["running"], 2)
            yield g

    a, b = MetricsService(), MetricsService()
    a.register(Tasks())
    assert one(scrape(a), "populi_tasks", phase="running") == 2
    assert "populi_tasks" not in scrape(b)
