"""The mDNS service: advertise and browse `_populi._udp` on the LAN interfaces (never
the overlay). Events out: each peer found goes to `on_found` (discovery), its addresses
on one of our own networks first. zeroconf is imported only when this service runs.

What it announces is where it can be reached on those interfaces (`announced`): the
node's advertised address when it is one of them, then their other addresses; never
loopback, which would send a peer to itself (a host with no default route used to
advertise 127.0.0.1).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence

import trio

from overlay.base import Address

from .._log import event, get_logger

__all__ = ["MdnsService", "announced", "nearest_first"]

_log = get_logger("node")


def announced(advertise_host: str, lan: Sequence[str]) -> list[str]:
    """The addresses mDNS announces: `advertise_host` first when it is one of the LAN
    addresses mDNS runs on, then the others; never a loopback address."""
    usable = [a for a in lan if not ipaddress.ip_address(a).is_loopback]
    if advertise_host in usable:
        usable.remove(advertise_host)
        usable.insert(0, advertise_host)
    return usable


def nearest_first(
    addresses: tuple[Address, ...],
    networks: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network],
) -> tuple[Address, ...]:
    """`addresses` with those on one of our `networks` first (order kept otherwise):
    a peer with a LAN and a second interface is joined on the network we share."""

    def shared(address: Address) -> bool:
        try:
            ip = ipaddress.ip_address(address[0].split("%", 1)[0])
        except ValueError:
            return False
        return any(ip.version == n.version and ip in n for n in networks)

    return tuple(sorted(addresses, key=lambda a: not shared(a)))


def _own_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """This host's interface networks, loopback left out (ifaddr, as zeroconf uses)."""
    import ifaddr

    out: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for adapter in ifaddr.get_adapters():
        for entry in adapter.ips:
            host = entry.ip[0] if isinstance(entry.ip, tuple) else entry.ip
            try:
                network = ipaddress.ip_network(f"{host}/{entry.network_prefix}", strict=False)
            except ValueError:
                continue
            if not network.is_loopback:
                out.append(network)
    return out


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
        addresses = [a for a in addresses if not ipaddress.ip_address(a).is_loopback]
        if not addresses:
            why = "bound to loopback: nothing another machine could reach to announce"
            event(_log, 30, "mdns.off", reason=why, fix="--bind a LAN address, or no --bind")
            return
        shown = announced(self._advertise[0], addresses)
        announcer = MdnsAnnouncer(
            node_id=self._node_id,
            port=self._advertise[1],
            fingerprint=self._fingerprint,
            addresses=addresses,
            advertise_addresses=shown,
        )
        networks = _own_networks()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(announcer.run)
                event(_log, 20, "mdns.on", addresses=",".join(addresses),
                      announced=",".join(shown), fp=self._fingerprint)  # fmt: skip
                async for peer in announcer.discoveries:
                    self._on_found(peer.node_id, nearest_first(peer.addresses, networks))
        except OSError as exc:
            event(_log, 30, "mdns.off", reason=str(exc))
