"""Which host the node advertises, and the warnings when peers could not reach it."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlay.detect import OverlayInfo, OverlayKind
from overlay.netfilter import AcceptPolicy
from populi_p2p.config import NodeConfig
from populi_p2p.services import addressing
from populi_p2p.services.addressing import advertise_host, loopback_with_discovery, outside_accept

WIREGUARD = OverlayInfo(OverlayKind.WIREGUARD, "wg0", ("10.77.0.2", "fd77::2"), ("10.77.0.0/16",))
NO_OVERLAY = OverlayInfo(OverlayKind.NONE, None, (), ("127.0.0.0/8",))


def config(tmp_path: Path, **fields: object) -> NodeConfig:
    return NodeConfig(state_dir=tmp_path, overlay="none", **fields)  # type: ignore[arg-type]


def test_advertise_wins_then_a_specific_bind_then_the_overlay(tmp_path: Path) -> None:
    assert advertise_host(config(tmp_path, advertise="192.168.1.77"), WIREGUARD, "10.77.0.2") == (
        "192.168.1.77"
    )
    assert advertise_host(config(tmp_path), WIREGUARD, "192.168.1.5") == "192.168.1.5"
    assert advertise_host(config(tmp_path), WIREGUARD, "0.0.0.0") == "10.77.0.2"
    assert advertise_host(config(tmp_path), WIREGUARD, "::") == "10.77.0.2"


def test_bound_to_all_without_an_overlay_guesses_the_route_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []

    def guess(*, ipv6: bool) -> str:
        seen.append(ipv6)
        return "fd00::9" if ipv6 else "192.168.1.9"

    monkeypatch.setattr(addressing, "_guess_local_address", guess)
    assert advertise_host(config(tmp_path), NO_OVERLAY, "0.0.0.0") == "192.168.1.9"
    assert advertise_host(config(tmp_path), NO_OVERLAY, "::") == "fd00::9"
    assert seen == [False, True]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "127.0.0.2"])
def test_loopback_with_mdns_is_a_warning_naming_the_fix(tmp_path: Path, host: str) -> None:
    line = loopback_with_discovery(host, config(tmp_path, mdns=True))
    assert line is not None and host in line and "--advertise" in line
    assert loopback_with_discovery(host, config(tmp_path)) is None  # no mDNS: no LAN peers


@pytest.mark.parametrize("host", ["192.168.1.5", "gpu1.lan", "fe80::1%eth0"])
def test_other_hosts_with_mdns_are_fine(tmp_path: Path, host: str) -> None:
    assert loopback_with_discovery(host, config(tmp_path, mdns=True)) is None


def test_an_advertised_host_outside_the_accept_list_is_a_warning() -> None:
    policy = WIREGUARD.accept_policy()
    assert outside_accept("10.77.0.2", policy, WIREGUARD) is None
    assert outside_accept("gpu1.lan", policy, WIREGUARD) is None  # a name: nothing to compare
    line = outside_accept("192.168.1.5", policy, WIREGUARD)
    assert line is not None
    assert "10.77.0.0/16" in line and "overlay wireguard" in line
    assert "--allow-cidr 192.168.1.5/32" in line
    line6 = outside_accept("fd00::5", AcceptPolicy.from_cidrs([]), NO_OVERLAY)
    assert line6 is not None
    assert "nothing; no overlay was found" in line6 and "--allow-cidr fd00::5/128" in line6
