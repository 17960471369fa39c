"""`ObserveView.mesh`: the dashboard's snapshot from the status and member rows."""

from __future__ import annotations

from typing import Any

import pytest

from populi_p2p.observe import EventService, MetricsService, ObserveView
from populi_p2p.observe.view import reached_over


def row(name: str, address: str, state: str = "alive", **extra: Any) -> dict[str, Any]:
    return {"name": name, "node_id": f"id-{name}", "address": address, "state": state,
            "incarnation": 1, "rtt_ms": 0.5, "capabilities": "-", "verified": True,
            "self": False, "state_since": 1.0, "gpu": None} | extra  # fmt: skip


GPU = {
    "gpus": [{"name": "H100", "memory_total": 80, "memory_used": 20, "utilization_gpu": 97,
              "temperature_c": 71, "capacity": {"vram": 70}, "health": {"state": "healthy"}}],
    "declared_gpus": [{"model": "RTX 4090", "count": 2, "vram": 24}],
}  # fmt: skip


def view(rows: list[dict[str, Any]]) -> ObserveView:
    status = {"node": {"name": "me"}, "overlay": {"kind": "tailscale"}, "cluster": {}}
    return ObserveView(MetricsService(), EventService(), lambda: status, lambda: rows)


def test_members_gpus_and_how_each_is_reached() -> None:
    rows = [
        row("me", "100.100.1.2:7946", self=True),
        row("ts", "100.101.0.9:7946", gpu=GPU),
        row("lan", "192.168.1.5:7946", state="dead"),
        row("v6", "[fd7a:115c:a1e0::1]:7946"),
    ]
    mesh = view(rows).mesh()
    by_name = {m["name"]: m for m in mesh["members"]}
    assert by_name["me"]["via"] == "tailscale"  # our own overlay
    assert by_name["ts"]["via"] == "tailscale" and by_name["v6"]["via"] == "tailscale"
    assert by_name["lan"]["via"] == "lan" and by_name["lan"]["state"] == "dead"
    gpus = by_name["ts"]["gpus"]
    assert [g["verified"] for g in gpus] == [True, False, False]
    assert gpus[0]["allocatable"] == 70 and gpus[0]["memory_used"] == 20
    assert (gpus[0]["utilization"], gpus[0]["temperature_c"]) == (97, 71)
    assert gpus[1]["name"] == "RTX 4090" and gpus[1]["utilization"] is None
    assert by_name["lan"]["rtt_ms"] is None  # dead: no stale RTT
    assert mesh["tasks"] is None and mesh["models"] is None and mesh["routes"] is None


def test_sections_are_provided_by_other_services() -> None:
    v = view([])
    v.provide("tasks", lambda: [{"task": "t1", "owner": "a", "epoch": 3}])
    assert v.mesh()["tasks"] == [{"task": "t1", "owner": "a", "epoch": 3}]
    with pytest.raises(ValueError, match="unknown dashboard section"):
        v.provide("nope", list)


@pytest.mark.parametrize(
    ("address", "via"),
    [("127.0.0.1:1", "loopback"), ("[::1]:1", "loopback"), ("10.1.2.3:1", "lan"),
     ("8.8.8.8:53", "internet"), ("100.64.0.1:1", "tailscale"), ("garbage", "unknown"),
     ("", "unknown")],
)  # fmt: skip
def test_reached_over(address: str, via: str) -> None:
    assert reached_over(address) == via


def test_the_node_itself_without_an_overlay_is_not_shown_via_none() -> None:
    """Issue 20, item 9: the page said "alive · via none" for the node itself."""
    status = {"node": {"name": "me"}, "overlay": {"kind": "none"}, "cluster": {}}
    rows = [row("me", "192.168.1.4:7946", self=True), row("lan", "192.168.1.5:7946")]
    v = ObserveView(MetricsService(), EventService(), lambda: status, lambda: rows)
    by_name = {m["name"]: m for m in v.mesh()["members"]}
    assert by_name["me"]["via"] is None and by_name["lan"]["via"] == "lan"


def test_the_blob_store_is_shown_held_and_transferred() -> None:
    blobs = {"used": 300, "quota": 1000, "fetched_bytes": 200, "served_bytes": 100}
    status = {"node": {"name": "me"}, "overlay": {}, "cluster": {}, "blobs": blobs}
    v = ObserveView(MetricsService(), EventService(), lambda: status, lambda: [])
    assert v.mesh()["blobs"] == {"held": 300, "quota": 1000, "in": 200, "out": 100}
    assert view([]).mesh()["blobs"] is None  # the blob service is still starting
