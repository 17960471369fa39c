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
#: The snapshot's sections that other services fill (`ObserveView.provide`).
_SECTIONS: Final = ("tasks", "routes")
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
        self._sections: dict[str, Callable[[], list[dict[str, Any]]]] = {}

    def provide(self, section: str, rows: Callable[[], list[dict[str, Any]]]) -> None:
        """Fill a section of the snapshot: ``tasks`` (the lease service: id, owner,
        epoch, phase, ...) or ``routes`` (the inference router: recent requests). Each
        row is a flat JSON-able dict; the page shows one table row per dict."""
        if section not in _SECTIONS:
            raise ValueError(f"unknown dashboard section {section!r} (one of {_SECTIONS})")
        self._sections[section] = rows

    def metrics(self) -> bytes:
        return self._metrics.render()

    def mesh(self) -> dict[str, Any]:
        """The dashboard's snapshot; `tasks` and `routes` are None until provided."""
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
            # Ourselves: through the overlay when there is one, else nothing to say.
            kind = overlay.get("kind") or "none"
            if row.get("self"):
                via = None if kind == "none" else kind
            else:
                via = reached_over(row["address"])
            entry = {key: row.get(key) for key in _MEMBER_KEYS}
            members.append(entry | {"gpus": devices, "via": via})
        return {
            "node": status.get("node", {}),
            "overlay": {"kind": overlay.get("kind"), "description": overlay.get("description")},
            "cluster": status.get("cluster", {}),
            "members": members,
            # None until a service provides the section: the page shows a placeholder.
            **{name: (rows() if (rows := self._sections.get(name)) else None)
               for name in _SECTIONS},
        }  # fmt: skip
