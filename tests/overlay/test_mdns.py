"""mDNS discovery: TXT checks offline, and real zeroconf between namespaces on a bridge."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from zeroconf import ServiceInfo

import overlay.mdns
from overlay.detect import Interface
from overlay.mdns import (
    MDNS_SERVICE_TYPE,
    MdnsAnnouncer,
    build_service_info,
    lan_addresses,
    peer_from_info,
)
from populi_p2p.trust.authority import cluster_fingerprint
from tests.netns.lab import ChildProcess, NetnsLab, NetnsNode, missing_requirements

AGENT = Path(__file__).parents[1] / "netns" / "ns_agent.py"
FP = cluster_fingerprint(b"\x01" * 32)
OTHER_FP = cluster_fingerprint(b"\x02" * 32)


################################################################################
# Offline: TXT layout, filtering, interface choice
################################################################################


def test_the_fingerprint_is_the_callers_and_overlay_computes_none() -> None:
    # One cluster fingerprint in the code base, the authority's (what `status` shows):
    # overlay takes it as a string and neither defines nor imports one.
    assert not hasattr(overlay.mdns, "cluster_fingerprint")
    tree = ast.parse(Path(overlay.mdns.__file__).read_text())
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert not [m for m in imported if m and m.split(".")[0] in ("populi_p2p", "hashlib")]
    assert len(FP) == 16 and FP != OTHER_FP


def test_service_info_round_trips_through_peer_check() -> None:
    info = build_service_info(
        node_id="NODEabc123", port=7950, fingerprint=FP, addresses=["fd77::5", "10.66.0.5"]
    )
    assert info.type == MDNS_SERVICE_TYPE
    assert info.name == f"NODEabc123.{MDNS_SERVICE_TYPE}"
    assert info.server == "populi-nodeabc123.local."
    assert info.decoded_properties == {"id": "NODEabc123", "port": "7950", "fp": FP, "v": "1"}
    peer, why = peer_from_info(info, fingerprint=FP, version=1)
    assert why == "" and peer is not None
    assert peer.node_id == "NODEabc123"
    assert peer.addresses == (("10.66.0.5", 7950), ("fd77::5", 7950))


@pytest.mark.parametrize(
    ("props", "fingerprint", "reason"),
    [
        ({"id": "n", "fp": FP, "v": "1", "port": "7950"}, OTHER_FP, "fingerprint"),
        ({"id": "n", "fp": FP, "v": "2", "port": "7950"}, FP, "version"),
        ({"id": "n", "v": "1"}, FP, "malformed"),
        ({"id": "n", "fp": FP, "v": "one"}, FP, "malformed"),
        ({"id": "", "fp": FP, "v": "1"}, FP, "malformed"),
        ({"id": "n", "fp": FP, "v": "1", "port": "99999"}, FP, "malformed"),
    ],
)
def test_peer_check_rejects(props, fingerprint, reason) -> None:
    info = ServiceInfo(
        MDNS_SERVICE_TYPE,
        f"x.{MDNS_SERVICE_TYPE}",
        port=7950,
        properties=props,
        server="x.local.",
        parsed_addresses=["10.66.0.9"],
    )
    assert peer_from_info(info, fingerprint=fingerprint, version=1) == (None, reason)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node_id": ""}, "node_id"),
        ({"port": 0}, "port"),
        ({"addresses": []}, "at least one address"),
        ({"addresses": ["not-an-ip"]}, "does not appear to be an IPv4 or IPv6 address"),
    ],
)
def test_build_service_info_validates(kwargs, message) -> None:
    args = {"node_id": "n", "port": 7950, "fingerprint": FP, "addresses": ["10.0.0.1"]}
    with pytest.raises(ValueError, match=message):
        build_service_info(**(args | kwargs))


def test_lan_addresses_skip_overlays_loopback_and_down_links() -> None:
    links = [
        Interface("lo", 1, "", True, ("127.0.0.1/8",)),
        Interface("eth0", 2, "", True, ("192.168.1.5/24", "2001:db8::5/64")),
        Interface("wg0", 3, "wireguard", True, ("10.77.0.1/24",)),
        Interface("pw1234500000", 4, "tun", True, ("10.77.0.2/24",)),
        Interface("tailscale0", 5, "tun", True, ("100.64.0.9/32",)),
        Interface("eth1", 6, "veth", False, ("10.1.0.5/24",)),
        Interface("br0", 7, "bridge", True, ("10.2.0.1/24",)),
    ]
    assert lan_addresses(links) == ["192.168.1.5", "10.2.0.1"]
    assert lan_addresses(links, exclude=["br0"]) == ["192.168.1.5"]


def test_announcer_needs_an_interface_address() -> None:
    with pytest.raises(ValueError, match="at least one interface address"):
        MdnsAnnouncer(node_id="n", port=7950, fingerprint=FP, addresses=[])


################################################################################
# Real zeroconf in three namespaces on one bridge
################################################################################

_reason = missing_requirements(wireguard=False)


@pytest.fixture(scope="module")
def bridge_lab() -> Iterator[NetnsLab]:
    if _reason:
        pytest.skip(_reason)
    with NetnsLab(3, wireguard=False) as lab:
        yield lab


@pytest.mark.root
def test_namespaces_on_a_bridge_find_each_other_and_ignore_other_clusters(
    bridge_lab: NetnsLab,
) -> None:
    a, b, c = bridge_lab.nodes

    def start(node: NetnsNode, node_id: str, fp: str) -> ChildProcess:
        child = bridge_lab.spawn_python(
            node,
            AGENT,
            "mdns",
            "--node-id",
            node_id,
            "--port",
            "7950",
            "--fingerprint",
            fp,
            "--address",
            node.underlay,
        )
        child.expect(lambda m: m["event"] == "ready", timeout=20)
        return child

    stranger = start(c, "node-c", OTHER_FP)
    alice = start(a, "node-a", FP)
    bob = start(b, "node-b", FP)

    def found(peer_id: str) -> Callable[[dict[str, Any]], bool]:
        return lambda m: m["event"] == "peer" and m["node_id"] == peer_id

    try:
        got = alice.expect(found("node-b"), timeout=20)
        assert got["addresses"] == [[b.underlay, 7950]] and got["fingerprint"] == FP
        assert bob.expect(found("node-a"), timeout=20)["addresses"] == [[a.underlay, 7950]]
        # Both saw the stranger's service and ignored it.
        alice.expect(lambda m: m["event"] == "stats" and m["mismatched"] >= 1, timeout=20)
        bob.expect(lambda m: m["event"] == "stats" and m["mismatched"] >= 1, timeout=20)
        stranger.expect(lambda m: m["event"] == "stats" and m["mismatched"] >= 2, timeout=20)
    except TimeoutError as exc:
        pytest.fail(f"mDNS over the bridge failed (multicast?): {exc}")
    for child in (alice, bob, stranger):
        child.stop(timeout=10)
        assert any(m["event"] == "stopped" for m in child.messages + child.drain())
    everyone = alice.messages + bob.messages + stranger.messages
    assert not [m for m in everyone if m["event"] == "peer" and m["node_id"] == "node-c"]
    assert not [m for m in stranger.messages if m["event"] == "peer"]
