"""Where the node listens and what it advertises, from the flags and overlay detection."""

from __future__ import annotations

import ipaddress
import socket

import attrs

from overlay.detect import OverlayInfo, OverlayNotFoundError, detect_overlay
from overlay.netfilter import AcceptPolicy

from ..config import NodeConfig
from .errors import NodeStartError

__all__ = ["Addressing", "advertise_host", "choose_addresses"]


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
