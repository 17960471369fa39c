"""`/metrics` and `/events` of real daemons, parsed with prometheus-client's own parser."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.node.harness import Daemon, Mesh, wait_until
from tests.observe.promcheck import PROMTOOL, naming_problems, promtool_problems


def get(daemon: Daemon, path: str) -> httpx.Response:
    transport = httpx.HTTPTransport(uds=str(daemon.client.socket_path))
    with httpx.Client(transport=transport, base_url="http://populi", timeout=5.0) as client:
        return client.get(path)


def scrape(daemon: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """sample name and sorted labels -> value, from the daemon's /metrics."""
    response = get(daemon, "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict[Any, float], metric: str, **labels: str) -> float:
    return samples.get((metric, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.slow
def test_counters_move_when_a_member_dies_and_a_packet_is_dropped(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    try:
        a = mesh.start("a")
        b = mesh.start("b", "--bootstrap", a.address)
        c = mesh.start("c", "--bootstrap", a.address)
        ids = {d.node_id: "alive" for d in (a, b, c)}
        wait_until(lambda: mesh.converged([a, b, c], ids), 30, "three alive")
        before = scrape(a)
        assert value(before, "populi_members", state="alive") == 3
        info = [dict(labels) for (n, labels) in before if n == "populi_node_info"]
        assert len(info) == 1 and info[0]["node_id"] == a.node_id and info[0]["name"] == "a"
        assert info[0]["version"], info  # the version the record carries
        assert value(before, "populi_member_deaths_total") == 0
        assert value(before, "populi_transport_packets_total", protocol="udp", direction="in") > 0
        assert value(before, "populi_transport_bytes_total", direction="out") > 0
        # The RTT gauges count the two peers once they have been probed.
        wait_until(
            lambda: value(scrape(a), "populi_members_by_rtt", rtt_at_most="+Inf") == 2,
            20, "two RTTs",
        )  # fmt: skip
        # The work families and the process collector are there, and the whole scrape
        # follows the conventions (and satisfies promtool, where it is installed).
        wait_until(lambda: ("populi_relay_failovers_total", ()) in scrape(a), 20, "inference")
        samples = scrape(a)
        assert ("populi_tasks", (("phase", "running"),)) in samples
        assert ("populi_lease_claims_total", (("outcome", "won"),)) in samples
        assert value(samples, "process_resident_memory_bytes") > 0
        text = get(a, "/metrics").text
        assert naming_problems(text) == []
        if PROMTOOL is not None:
            assert promtool_problems(text) == ""

        # A forged datagram: the authentication envelope drops it, and the counter shows.
        host, port = a.address.rsplit(":", 1)
        dropped_before = sum(
            v for (n, lab), v in before.items()
            if n == "populi_transport_drops_total" and ("layer", "auth") in lab
        )  # fmt: skip
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"\x01" + b"not a sealed packet" * 3, (host, int(port)))

        def auth_drops() -> float:
            samples = scrape(a)
            return sum(
                v for (n, lab), v in samples.items()
                if n == "populi_transport_drops_total" and ("layer", "auth") in lab
            )  # fmt: skip

        wait_until(lambda: auth_drops() > dropped_before, 10, "the forged packet counted")

        # A member dies: members by state and the deaths counter move.
        c.kill()
        wait_until(lambda: value(scrape(a), "populi_members", state="dead") == 1, 30, "c seen dead")
        after = scrape(a)
        assert value(after, "populi_members", state="alive") == 2
        assert (
            value(after, "populi_member_deaths_total") + value(after, "populi_members_reaped_total")
            >= 1
        )
        assert value(after, "populi_suspicions_total") >= value(before, "populi_suspicions_total")
        assert value(after, "populi_events_total", kind="member.dead") >= 1

        # The event feed says so too, and the JSON snapshot agrees.
        mesh_view = get(a, "/api/mesh").json()
        states = {m["node_id"]: m["state"] for m in mesh_view["members"]}
        assert states[c.node_id] == "dead"
        assert {m["via"] for m in mesh_view["members"] if not m["self"]} == {"loopback"}
        kinds = []
        with (
            httpx.Client(
                transport=httpx.HTTPTransport(uds=str(a.client.socket_path)),
                base_url="http://populi",
                timeout=5.0,
            ) as client,
            client.stream("GET", "/events") as stream,
        ):
            assert stream.headers["content-type"] == "text/event-stream"
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    kinds.append((event["kind"], event.get("node_id")))
                    if event["kind"] == "member.dead":
                        break
        assert ("member.joined", b.node_id) in kinds
        assert ("member.dead", c.node_id) in kinds
        # The CLI prints the same feed: one JSON object per line, or one line each.
        cli = [sys.executable, "-m", "populi_p2p.cli", "events", "--state-dir", str(a.state_dir)]
        out = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        lines = [json.loads(line) for line in out.stdout.splitlines()]
        assert any(e["kind"] == "member.dead" and e["node_id"] == c.node_id for e in lines)
        assert [e["seq"] for e in lines] == sorted(e["seq"] for e in lines)
        out = subprocess.run(cli, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert any("member.dead" in line and "c was declared dead" in line
                   for line in out.stdout.splitlines())  # fmt: skip
        # Read-only: a POST is refused.
        transport = httpx.HTTPTransport(uds=str(a.client.socket_path))
        with httpx.Client(transport=transport, base_url="http://populi") as client:
            assert client.post("/metrics").status_code == 405
    finally:
        mesh.stop_all()


def test_events_without_a_daemon_is_one_line(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "populi_p2p.cli", "events", "--state-dir", str(tmp_path)]
    out = subprocess.run(cli, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "not running" in out.stderr, out.stderr
