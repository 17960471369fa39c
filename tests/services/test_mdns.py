"""mDNS announces where the node can be reached (issue 20, item 2).

With ``--mdns`` on a LAN host with no default route, the node advertised 127.0.0.1
(the "which source address would reach the outside" trick fails without a route) and
mDNS announced it: nobody joined and nothing said why. Now the address comes from the
interfaces (ifaddr, what zeroconf uses), mDNS announces the LAN interfaces' addresses
and never loopback, and a loopback advertise address with ``--mdns`` is a warning.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import attrs
import pytest

from overlay.detect import OverlayInfo, OverlayKind
from populi_p2p.config import NodeConfig
from populi_p2p.services import addressing
from populi_p2p.services.addressing import (
    advertise_host,
    interface_address,
    loopback_with_discovery,
)
from populi_p2p.services.mdns import announced, nearest_first

NO_OVERLAY = OverlayInfo(OverlayKind.NONE, None, (), ("127.0.0.0/8",))


@attrs.frozen
class FakeIP:
    ip: Any
    network_prefix: int


@attrs.frozen
class FakeAdapter:
    nice_name: str
    ips: list[FakeIP]


#: A LAN host with a loopback, a link-local-only link and a LAN interface; no gateway.
ADAPTERS = [
    FakeAdapter("lo", [FakeIP("127.0.0.1", 8), FakeIP(("::1", 0, 0), 128)]),
    FakeAdapter("eth1", [FakeIP("169.254.9.9", 16)]),
    FakeAdapter("eth0", [FakeIP("192.168.7.2", 24), FakeIP(("fe80::1", 0, 2), 64)]),
]


class NoRoute:
    """A socket whose connect fails as it does on a host with no default route."""

    def __init__(self, *args: object) -> None:
        pass

    def __enter__(self) -> NoRoute:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def connect(self, address: object) -> None:
        raise OSError(101, "Network is unreachable")


def test_no_default_route_advertises_the_lan_address_not_loopback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import ifaddr

    monkeypatch.setattr(addressing.socket, "socket", NoRoute)
    monkeypatch.setattr(ifaddr, "get_adapters", lambda: ADAPTERS)
    config = NodeConfig(state_dir=tmp_path, overlay="none", mdns=True)
    assert advertise_host(config, NO_OVERLAY, "0.0.0.0") == "192.168.7.2"


def test_interface_address_skips_loopback_and_link_local_and_prefers_private() -> None:
    public_first = [FakeAdapter("eth9", [FakeIP("93.184.216.34", 24)]), *ADAPTERS]
    assert interface_address(ipv6=False, adapters=lambda: public_first) == "192.168.7.2"
    assert interface_address(ipv6=True, adapters=lambda: ADAPTERS) is None
    only_lo = ADAPTERS[:1]
    assert interface_address(ipv6=False, adapters=lambda: only_lo) is None


def test_mdns_announces_lan_addresses_advertised_one_first_never_loopback() -> None:
    assert announced("127.0.0.1", ["192.168.7.2"]) == ["192.168.7.2"]
    assert announced("10.1.0.2", ["192.168.7.2", "10.1.0.2"]) == ["10.1.0.2", "192.168.7.2"]
    assert announced("127.0.0.1", ["127.0.0.1", "192.168.7.2"]) == ["192.168.7.2"]
    assert announced("127.0.0.1", ["127.0.0.1"]) == []


def test_a_peer_is_joined_on_the_network_we_share() -> None:
    """A peer with two interfaces announces both; the one on our LAN is tried first."""
    ours = [ipaddress.ip_network("192.168.7.0/24")]
    peer = (("172.17.0.1", 7950), ("192.168.7.9", 7950))
    assert nearest_first(peer, ours) == (("192.168.7.9", 7950), ("172.17.0.1", 7950))
    assert nearest_first(peer, []) == peer


def test_loopback_advertised_with_mdns_is_a_warning(tmp_path: Path) -> None:
    with_mdns = NodeConfig(state_dir=tmp_path, overlay="none", mdns=True)
    warning = loopback_with_discovery("127.0.0.1", with_mdns)
    assert warning is not None and "127.0.0.1 is loopback while --mdns is on" in warning
    assert loopback_with_discovery("192.168.7.2", with_mdns) is None
    without = NodeConfig(state_dir=tmp_path, overlay="none")
    assert loopback_with_discovery("127.0.0.1", without) is None


def test_the_real_host_has_an_interface_address_or_says_none() -> None:
    found = interface_address(ipv6=False)
    assert found is None or not ipaddress.ip_address(found).is_loopback
