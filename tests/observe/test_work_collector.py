"""The task, lease and inference metric families, the process collector, the version in
`populi_node_info`, and a whole scrape held to Prometheus's conventions (and to
`promtool check metrics` where promtool is installed)."""

from __future__ import annotations

import pytest
import trio

from populi_p2p.inference.stats import TTFT_BUCKETS, InferenceStats
from populi_p2p.observe import MetricsService, NodeCollector
from populi_p2p.observe.sources import TaskStatistics
from populi_p2p.observe.work_collector import BlobCollector, InferenceCollector, TaskCollector
from swim import Member, MemberState
from tests.inference.harness import Mesh, stream_chat
from tests.inference.test_relay import ALICE, BOB, CAROL

from .fakes import sources
from .promcheck import PROMTOOL, naming_problems, promtool_problems
from .test_collector import one, scrape


def tasks(**changes: object) -> TaskStatistics:
    values: dict[str, object] = {
        "by_phase": {"pending": 1, "running": 2, "succeeded": 5},
        "starts": 7, "exits": {"succeeded": 4, "failed": 1, "released": 1},
        "claims": {"won": 6, "lost": 2}, "grants_refused": {"lease_live": 3, "stale": 0},
        "fenced": 1, "held": 2,
    }  # fmt: skip
    values.update(changes)
    return TaskStatistics(**values)  # type: ignore[arg-type]


def full_registry(inference: InferenceStats) -> MetricsService:
    members = [
        Member("n-self", ("127.0.0.1", 1), MemberState.ALIVE, 1),
        Member("n-1", ("127.0.0.1", 2), MemberState.ALIVE, 1, rtt=0.003),
        Member("n-2", ("127.0.0.1", 3), MemberState.SUSPECT, 1, rtt=0.3),
    ]
    service = MetricsService()
    service.register(NodeCollector(sources(members, version="1.2.3")))
    service.register(TaskCollector(tasks))
    service.register(InferenceCollector(inference.statistics))
    service.register(BlobCollector(lambda: BLOBS))
    return service


BLOBS = {"used": 300, "quota": 1000, "fetched_bytes": 200, "served_bytes": 100}


def test_blob_bytes_held_and_transferred() -> None:
    service = MetricsService()
    service.register(BlobCollector(lambda: BLOBS))
    s = scrape(service)
    assert one(s, "populi_blob_bytes") == 300 and one(s, "populi_blob_quota_bytes") == 1000
    assert one(s, "populi_blob_transferred_bytes_total", direction="in") == 200
    assert one(s, "populi_blob_transferred_bytes_total", direction="out") == 100
    starting = MetricsService()
    starting.register(BlobCollector(lambda: None))
    assert not any(n.startswith("populi_blob") for n in scrape(starting))


def test_task_and_lease_families() -> None:
    service = MetricsService()
    service.register(TaskCollector(tasks))
    s = scrape(service)
    assert one(s, "populi_tasks", phase="running") == 2
    assert one(s, "populi_task_starts_total") == 7
    assert one(s, "populi_task_exits_total", outcome="released") == 1
    assert one(s, "populi_lease_claims_total", outcome="won") == 6
    assert one(s, "populi_lease_claims_total", outcome="lost") == 2
    assert one(s, "populi_lease_grants_refused_total", reason="lease_live") == 3
    assert one(s, "populi_lease_fenced_total") == 1
    assert one(s, "populi_leases_held") == 2


def test_ttft_is_a_real_histogram() -> None:
    stats = InferenceStats()
    for seconds in (0.01, 0.025, 0.3, 0.3, 99.0):
        stats.first_token(seconds)
    service = MetricsService()
    service.register(InferenceCollector(stats.statistics))
    s = scrape(service)
    assert one(s, "populi_inference_ttft_seconds_bucket", le="0.025") == 2  # le is inclusive
    assert one(s, "populi_inference_ttft_seconds_bucket", le="0.5") == 4
    assert one(s, "populi_inference_ttft_seconds_bucket", le=repr(TTFT_BUCKETS[-1])) == 4
    assert one(s, "populi_inference_ttft_seconds_bucket", le="+Inf") == 5
    assert one(s, "populi_inference_ttft_seconds_count") == 5
    assert one(s, "populi_inference_ttft_seconds_sum") == pytest.approx(99.635)
    with pytest.raises(ValueError, match="unknown inference outcome"):
        stats.request("teapot")


def test_node_info_version_process_metrics_and_rtt_gauges() -> None:
    s = scrape(full_registry(InferenceStats()))
    (info,) = s["populi_node_info"]
    assert info.labels == {"node_id": "n-self", "name": "self", "version": "1.2.3"}
    assert one(s, "process_resident_memory_bytes") > 0
    assert one(s, "process_cpu_seconds_total") >= 0
    # RTTs are gauges now (members move between bounds): no histogram samples.
    assert one(s, "populi_members_by_rtt", rtt_at_most="0.005") == 1
    assert one(s, "populi_members_by_rtt", rtt_at_most="+Inf") == 2
    assert one(s, "populi_member_rtt_max_seconds") == 0.3
    assert not any(name.startswith("populi_member_rtt_seconds") for name in s)


def test_a_whole_scrape_follows_the_conventions() -> None:
    stats = InferenceStats()
    stats.first_token(0.2)
    stats.request("served")
    text = full_registry(stats).render().decode()
    assert naming_problems(text) == []


@pytest.mark.skipif(
    PROMTOOL is None, reason="no promtool (make sysdeps, or apt-get install prometheus)"
)
def test_promtool_finds_no_problem() -> None:
    stats = InferenceStats()
    stats.first_token(0.2)
    assert promtool_problems(full_registry(stats).render().decode()) == ""


def test_the_naming_check_catches_what_it_should() -> None:
    bad = (
        "# TYPE populi_rtt_ms gauge\npopuli_rtt_ms 1\n"
        "# TYPE populi_things_total gauge\npopuli_things_total 1\n"
        '# TYPE populi_x histogram\npopuli_x_bucket{le="+Inf"} 1\n'
        '# TYPE populi_per_task gauge\npopuli_per_task{task="t1"} 1\n'
    )
    found = " ".join(naming_problems(bad))
    for says in ("populi_rtt_ms: not in base units", "populi_things_total: a gauge",
                 "populi_x: histogram without _count", "unbounded labels ['task']"):  # fmt: skip
        assert says in found, found


async def test_requests_ttft_and_failovers_counted_through_the_real_relay() -> None:
    from populi_p2p.testing.standin import StandinConfig

    async with trio.open_nursery() as nursery:
        mesh = Mesh()
        cfg = StandinConfig(model="m", tokens=30, delay=0.005)
        await mesh.add_serving(nursery, ALICE, "alice", cfg)
        await mesh.add_serving(nursery, BOB, "bob", cfg)
        front = await mesh.start_front(nursery, CAROL)
        r, _, _ = await stream_chat(mesh.url, "m")
        assert r.status_code == 200
        first = r.headers["x-populi-node"]

        async def kill_at_5(i: int) -> None:
            if i == 5:
                mesh.members[first].kill()

        with trio.fail_after(10):
            r, _, lines = await stream_chat(mesh.url, "m", on_token=kill_at_5)
        assert lines[-1] == "[DONE]"
        r, _, _ = await stream_chat(mesh.url, "nobody-serves-this")
        assert r.status_code == 404
        service = MetricsService()
        service.register(InferenceCollector(front.stats.statistics))
        s = scrape(service)
        assert one(s, "populi_inference_requests_total", outcome="served") == 2
        assert one(s, "populi_inference_requests_total", outcome="no_route") == 1
        assert one(s, "populi_relay_failovers_total") == 1
        assert one(s, "populi_inference_ttft_seconds_count") == 2
        nursery.cancel_scope.cancel()
