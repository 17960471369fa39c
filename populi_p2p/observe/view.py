"""What the observability routes read: a read-only view over the node's services."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any, Final

from .events import EventService
from .metrics import MetricsService

__all__ = ["ObserveView", "reached_over"]

_TAILSCALE: Final = (
    ipaddress.ip_network("100.64.0.0/10"),
    ipaddress.ip_network("fd7a:115c:a1e0::/48"),
)
#: The member-row fields the page shows.
_MEMBER_KEYS: Final = (
    "name", "node_id", "address", "state", "incarnation", "rtt_ms", "capabilities",
    "verified", "self", "state_since",
)  # fmt: skip


def reached_over(address: str) -> str:
    """How a member's address is reached: tailscale, loopback, lan or internet."""
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "unknown"
    if any(ip in net for net in _TAILSCALE):
        return "tailscale"
    if ip.is_loopback:
        return "loopback"
    if ip.is_private or ip.is_link_local:
        return "lan"
    return "internet"


class ObserveView:
    """The `web.ObserveBackend` of a node.

    Args:
        metrics: the node's registry.
        events: the node's event feed.
        status: the ``/v1/status`` view (this node, its overlay, the cluster summary).
        members: the ``/v1/members`` rows.
    """

    def __init__(
        self,
        metrics: MetricsService,
        events: EventService,
        status: Callable[[], dict[str, Any]],
        members: Callable[[], list[dict[str, Any]]],
    ) -> None:
        self._metrics = metrics
        self.events = events
        self._status = status
        self._members = members

    def metrics(self) -> bytes:
        return self._metrics.render()

    def mesh(self) -> dict[str, Any]:
        """The dashboard's snapshot; `tasks` and `routes` stay None until those exist."""
        status = self._status()
        overlay = status.get("overlay", {})
        members = []
        for row in self._members():
            gpu = row.get("gpu") or {}
            devices = []
            for d in gpu.get("gpus", []):
                capacity = d.get("capacity") or {}
                devices.append(
                    {
                        "name": d.get("name"),
                        "memory_total": d.get("memory_total"),
                        "memory_used": d.get("memory_used"),
                        "allocatable": capacity.get("vram"),
                        "health": (d.get("health") or {}).get("state"),
                        # Layer A: measured on the member; signed into its record.
                        "verified": True,
                    }
                )
            for g in gpu.get("declared_gpus", []):
                for _ in range(int(g.get("count") or 0)):
                    devices.append({"name": g.get("model"), "memory_total": g.get("vram"),
                                    "memory_used": None, "allocatable": None,
                                    "health": None, "verified": False})  # fmt: skip
            via = overlay.get("kind", "none") if row.get("self") else reached_over(row["address"])
            entry = {key: row.get(key) for key in _MEMBER_KEYS}
            members.append(entry | {"gpus": devices, "via": via})
        return {
            "node": status.get("node", {}),
            "overlay": {"kind": overlay.get("kind"), "description": overlay.get("description")},
            "cluster": status.get("cluster", {}),
            "members": members,
            "tasks": None,
            "routes": None,
        }
