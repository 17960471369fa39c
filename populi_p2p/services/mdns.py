"""The mDNS service: advertise and browse `_populi._udp` on the LAN interfaces (never
the overlay). Events out: each peer found goes to `on_found` (discovery). zeroconf is
imported only when this service runs.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import trio

from overlay.base import Address

from .._log import event, get_logger

__all__ = ["MdnsService"]

_log = get_logger("node")


class MdnsService:
    """Args: our node id, bind host, advertised address, cluster fingerprint, the
    overlay's interface (excluded), and where discoveries go."""

    def __init__(
        self,
        node_id: str,
        *,
        bind: str,
        advertise: Address,
        fingerprint: str,
        overlay_interface: str | None,
        on_found: Callable[[str, tuple[Address, ...]], None],
    ) -> None:
        self._node_id = node_id
        self._bind = bind
        self._advertise = advertise
        self._fingerprint = fingerprint
        self._overlay_interface = overlay_interface
        self._on_found = on_found

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        from overlay.detect import list_interfaces
        from overlay.mdns import MdnsAnnouncer, lan_addresses

        bind = self._bind
        if bind not in ("0.0.0.0", "::"):
            addresses = [bind] if ipaddress.ip_address(bind).version == 4 else []
        else:
            try:
                interfaces = await list_interfaces()
            except (OSError, TimeoutError, ValueError) as exc:
                event(_log, 30, "mdns.off", reason=f"cannot list interfaces: {exc}")
                return
            exclude = [self._overlay_interface] if self._overlay_interface else []
            addresses = lan_addresses(interfaces, exclude=exclude)
        if not addresses:
            event(_log, 30, "mdns.off", reason="no LAN IPv4 address to run mDNS on")
            return
        announcer = MdnsAnnouncer(
            node_id=self._node_id,
            port=self._advertise[1],
            fingerprint=self._fingerprint,
            addresses=addresses,
            advertise_addresses=[self._advertise[0]],
        )
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(announcer.run)
                event(_log, 20, "mdns.on", addresses=",".join(addresses), fp=self._fingerprint)
                async for peer in announcer.discoveries:
                    self._on_found(peer.node_id, peer.addresses)
        except OSError as exc:
            event(_log, 30, "mdns.off", reason=str(exc))
