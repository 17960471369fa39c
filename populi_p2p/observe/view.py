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
_SECTIONS: Final = ("tasks", "models", "routes")
#: The member-row fields the page shows (``status``: ``draining`` or ``active``;
#: ``last_seen`` and ``version`` when the rows carry them).
_MEMBER_KEYS: Final = (
    "name", "node_id", "address", "state", "incarnation", "rtt_ms", "capabilities",
    "verified", "self", "state_since", "status", "last_seen", "version",
)  # fmt: skip
_GONE: Final = ("dead", "left")


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
        epoch, phase, ...), ``models`` (what the mesh serves, and by whom) or ``routes``
        (the inference router: recent requests). Each row is a flat JSON-able dict
        (`observe.sections` builds them); the page shows one table row per dict."""
        if section not in _SECTIONS:
            raise ValueError(f"unknown dashboard section {section!r} (one of {_SECTIONS})")
        self._sections[section] = rows

    def metrics(self) -> bytes:
        return self._metrics.render()

    def mesh(self) -> dict[str, Any]:
        """The dashboard's snapshot; a section is None until a service provides it."""
        status = self._status()
        overlay = status.get("overlay", {})
        members = []
        for row in self._members():
            # Ourselves: through the overlay when there is one, else nothing to say.
            kind = overlay.get("kind") or "none"
            if row.get("self"):
                via = None if kind == "none" else kind
            else:
                via = reached_over(row["address"])
            entry = {key: row.get(key) for key in _MEMBER_KEYS}
            if entry["state"] in _GONE:
                entry["rtt_ms"] = None  # a smoothed RTT from before it went is not news
            members.append(entry | {"gpus": _devices(row.get("gpu") or {}), "via": via})
        return {
            "node": status.get("node", {}),
            "overlay": {"kind": overlay.get("kind"), "description": overlay.get("description")},
            "cluster": status.get("cluster", {}),
            "blobs": _blobs(status.get("blobs")),
            "members": members,
            # None until a service provides the section: the page shows a placeholder.
            **{name: (rows() if (rows := self._sections.get(name)) else None)
               for name in _SECTIONS},
        }  # fmt: skip


def _blobs(stats: dict[str, Any] | None) -> dict[str, int] | None:
    """This node's blob store for the page: bytes held, the quota, bytes fetched from
    members (in) and served to them (out). None while the blob service starts."""
    if not stats:
        return None
    return {"held": stats.get("used", 0), "quota": stats.get("quota", 0),
            "in": stats.get("fetched_bytes", 0), "out": stats.get("served_bytes", 0)}  # fmt: skip


def _devices(gpu: dict[str, Any]) -> list[dict[str, Any]]:
    """A member's GPUs for the page: measured ones (Layer A, `verified`: signed into
    its record) with VRAM, utilisation and temperature, then declared ones (Layer C,
    the operator's word: a model and a size, nothing measured)."""
    devices = []
    for d in gpu.get("gpus", []):
        capacity = d.get("capacity") or {}
        devices.append(
            {
                "name": d.get("name"),
                "memory_total": d.get("memory_total"),
                "memory_used": d.get("memory_used"),
                "allocatable": capacity.get("vram"),
                "utilization": d.get("utilization_gpu"),
                "temperature_c": d.get("temperature_c"),
                "health": (d.get("health") or {}).get("state"),
                "verified": True,
            }
        )
    for g in gpu.get("declared_gpus", []):
        for _ in range(int(g.get("count") or 0)):
            devices.append({"name": g.get("model"), "memory_total": g.get("vram"),
                            "memory_used": None, "allocatable": None, "utilization": None,
                            "temperature_c": None, "health": None,
                            "verified": False})  # fmt: skip
    return devices
