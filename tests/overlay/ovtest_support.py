"""Shared bits of the overlay tests."""

from __future__ import annotations

import socket

import pytest

from overlay.netfilter import AcceptPolicy


def _have_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


HAVE_IPV6 = _have_ipv6_loopback()
needs_ipv6 = pytest.mark.skipif(not HAVE_IPV6, reason="no IPv6 loopback (::1) on this machine")

LOOPBACK = AcceptPolicy.from_cidrs(["127.0.0.0/8", "::1/128"])
