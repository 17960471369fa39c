"""Where the node listens and what it advertises, from the flags and overlay detection."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from overlay.detect import OverlayInfo, OverlayKind, OverlayNotFoundError, detect_overlay
from overlay.netfilter import AcceptPolicy

from ..config import NodeConfig
from .errors import NodeStartError

__all__ = [
    "Addressing",
    "advertise_host",
    "choose_addresses",
    "interface_address",
    "loopback_with_discovery",
    "outside_accept",
]


@attrs.frozen
class Addressing:
    """The overlay found, the bind host and the accept policy."""

    overlay: OverlayInfo
    bind: str
    policy: AcceptPolicy


async def choose_addresses(config: NodeConfig) -> Addressing:
    """Raises `NodeStartError` when the overlay asked for is not there or a CIDR is bad."""
    try:
        info = await detect_overlay(config.overlay)
    except OverlayNotFoundError as exc:
        raise NodeStartError(
            f"{exc} (bring the overlay up, or use --overlay none with --bind)"
        ) from None
    try:
        policy = info.accept_policy(config.allow_cidr)
    except ValueError as exc:
        raise NodeStartError(f"--allow-cidr: {exc}") from None
    bind = config.bind or info.preferred_address() or "0.0.0.0"
    return Addressing(info, bind, policy)


def advertise_host(config: NodeConfig, overlay: OverlayInfo, bind: str) -> str:
    """The host peers should reach us at."""
    if config.advertise:
        return config.advertise
    if bind not in ("0.0.0.0", "::"):
        return bind
    preferred = overlay.preferred_address()
    if preferred is not None:
        return preferred  # bound to all, but peers must come in through the overlay
    return _guess_local_address(ipv6=bind == "::")


def _guess_local_address(*, ipv6: bool) -> str:
    """The address this host would use to reach the outside (no packet is sent); on a
    host with no default route (a LAN with no gateway), its first interface address
    that is not loopback (`interface_address`); loopback only when it has no other."""
    family = socket.AF_INET6 if ipv6 else socket.AF_INET
    target = "2001:db8::1" if ipv6 else "192.0.2.1"  # documentation ranges: never routed
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            host = str(s.getsockname()[0])
            ipaddress.ip_address(host)
            return host
    except OSError:
        pass
    found = interface_address(ipv6=ipv6)
    if found is not None:
        return found
    return "::1" if ipv6 else "127.0.0.1"


def interface_address(
    *, ipv6: bool, adapters: Callable[[], Iterable[Any]] | None = None
) -> str | None:
    """This host's first address of that family on an interface, loopback and link-local
    left out (private ranges first), from ifaddr (what zeroconf uses); None if none.

    Args:
        adapters: ``ifaddr.get_adapters`` (injected in tests).
    """
    if adapters is None:
        import ifaddr  # zeroconf's own dependency

        adapters = ifaddr.get_adapters
    found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for adapter in adapters():
        for entry in adapter.ips:
            host = entry.ip[0] if isinstance(entry.ip, tuple) else entry.ip
            try:
                ip = ipaddress.ip_address(host)
            except ValueError:
                continue
            if (ip.version == 6) == ipv6 and not (ip.is_loopback or ip.is_link_local):
                found.append(ip)
    found.sort(key=lambda ip: not ip.is_private)  # stable: interface order otherwise
    return str(found[0]) if found else None


def loopback_with_discovery(host: str, config: NodeConfig) -> str | None:
    """The warning when we advertise a loopback address while `--mdns` is on, else None:
    peers on the LAN would be told to reach us at their own loopback."""
    if not config.mdns:
        return None
    try:
        loopback = ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return None
    if not loopback:
        return None
    return (
        f"advertised address {host} is loopback while --mdns is on: peers on other machines"
        " cannot reach it (mDNS announces the LAN interfaces' addresses instead, but the"
        " mesh gossips this one); pass --advertise with this host's LAN address, or --bind it"
    )


def outside_accept(host: str, policy: AcceptPolicy, overlay: OverlayInfo) -> str | None:
    """The warning when our advertised `host` is outside our own accept list, else None.

    Peers then reach us from an address we refuse, or (with `--overlay auto` and no
    overlay) we advertise an underlay address the mesh was never meant to use.
    """
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None  # a name, not an address: nothing to compare
    if policy.allows(host):
        return None
    network = "/128" if ":" in host else "/32"
    found = (
        "no overlay was found" if overlay.kind == OverlayKind.NONE else f"overlay {overlay.kind}"
    )
    return (
        f"advertised address {host} is outside this node's accept list"
        f" ({', '.join(policy.cidrs) or 'nothing'}; {found}): peers on that network are refused;"
        f" add --allow-cidr {host}{network} (or its network's range), bring the overlay up,"
        " or use --overlay none with --bind"
    )
