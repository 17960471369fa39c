"""Where the node listens and what it advertises, from the flags and overlay detection."""

from __future__ import annotations

import ipaddress
import socket

import attrs

from overlay.detect import OverlayInfo, OverlayKind, OverlayNotFoundError, detect_overlay
from overlay.netfilter import AcceptPolicy

from ..config import NodeConfig
from .errors import NodeStartError

__all__ = ["Addressing", "advertise_host", "choose_addresses", "outside_accept"]


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
    """The address this host would use to reach the outside (no packet is sent)."""
    family = socket.AF_INET6 if ipv6 else socket.AF_INET
    target = "2001:db8::1" if ipv6 else "192.0.2.1"  # documentation ranges: never routed
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            host = str(s.getsockname()[0])
            ipaddress.ip_address(host)
            return host
    except OSError:
        return "::1" if ipv6 else "127.0.0.1"


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
