"""The transport and detection over a REAL WireGuard overlay between network namespaces.

Three namespaces on one bridge run wireguard-go (see netns.py). Each test talks to small
agents (ns_agent.py) inside the namespaces and waits for their JSON lines.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .lab import (
    OVERLAY_V4_CIDR,
    OVERLAY_V6_CIDR,
    ChildProcess,
    NetnsLab,
    NetnsNode,
    missing_requirements,
)

AGENT = Path(__file__).parent / "ns_agent.py"
_reason = missing_requirements()
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(_reason is not None, reason=_reason or ""),
]


@pytest.fixture(scope="module")
def lab() -> Iterator[NetnsLab]:
    with NetnsLab(3) as lab:
        yield lab


def start_node(lab: NetnsLab, node: NetnsNode, host: str, port: int, *extra: str) -> ChildProcess:
    child = lab.spawn_python(node, AGENT, "node", "--host", host, "--port", str(port), *extra)
    child.expect(lambda m: m["event"] == "ready", timeout=15)
    return child


def is_packet(payload: str):
    return lambda m: m["event"] == "packet" and m["payload"] == payload


def send(child: ChildProcess, to: tuple[str, int], payload: str, cmd: str = "send") -> None:
    child.send_json({"cmd": cmd, "to": list(to), "payload": payload})
    reply = child.expect(lambda m: m["event"] in ("sent", "send_error") and m["payload"] == payload)
    assert reply["event"] == "sent", reply


def test_lab_wireguard_is_up(lab: NetnsLab) -> None:
    a, b, _ = lab.nodes
    shown = lab.exec(a, "wg", "show", a.wg, "peers").stdout.split()
    assert sorted(shown) == sorted(n.public_key for n in lab.nodes if n is not a)
    out = lab.exec(b, "ip", "-j", "addr", "show", "dev", b.wg).stdout
    assert b.overlay_v4 in out and b.overlay_v6 in out


def test_datagram_over_the_overlay_reaches_a_transport_bound_to_wg_address(lab) -> None:
    a, b, _ = lab.nodes
    accept = ["--accept", OVERLAY_V4_CIDR, "--accept", OVERLAY_V6_CIDR]
    for host_a, host_b in [(a.overlay_v4, b.overlay_v4), (a.overlay_v6, b.overlay_v6)]:
        receiver = start_node(lab, a, host_a, 7950, *accept)
        sender = start_node(lab, b, host_b, 7950, *accept)
        send(sender, (host_a, 7950), f"hello over wg to {host_a}")
        got = receiver.expect(is_packet(f"hello over wg to {host_a}"), timeout=10)
        assert got["source"] == [host_b, 7950] and got["reliable"] is False
        send(sender, (host_a, 7950), f"frame to {host_a}", cmd="frame")
        got = receiver.expect(is_packet(f"frame to {host_a}"), timeout=10)
        assert got["reliable"] is True and got["source"][0] == host_b  # bound source address
        receiver.stop()
        sender.stop()


def test_detection_inside_a_namespace_finds_the_wireguard_interface(lab) -> None:
    a = lab.nodes[0]
    child = lab.spawn_python(a, AGENT, "detect", "--mode", "auto")
    info = child.expect(lambda m: m["event"] == "detected", timeout=15)
    assert info["kind"] == "wireguard"
    assert info["interface"] == a.wg  # not another namespace's wireguard-go socket
    assert info["addresses"] == [a.overlay_v4, a.overlay_v6]
    assert info["accept_cidrs"] == [OVERLAY_V4_CIDR, OVERLAY_V6_CIDR]
    assert info["peers"] == []


def test_underlay_datagram_refused_by_overlay_policy(lab) -> None:
    a, b, _ = lab.nodes
    # A listens everywhere (dual stack) but accepts only what detection found: the overlay.
    receiver = start_node(lab, a, "::", 7951, "--dual-stack", "--accept-detected")
    ready = receiver.messages[-1]
    assert ready["accept"] == [OVERLAY_V4_CIDR, OVERLAY_V6_CIDR]
    sender = start_node(lab, b, "0.0.0.0", 7951)
    send(sender, (a.underlay, 7951), "via underlay")
    stats = receiver.expect(lambda m: m["event"] == "stats" and m["refused_source"] == 1)
    assert stats["udp_received"] == 1
    send(sender, (a.overlay_v4, 7951), "via overlay")
    got = receiver.expect(is_packet("via overlay"))
    assert got["source"] == [b.overlay_v4, 7951]
    assert not [m for m in receiver.messages if m.get("payload") == "via underlay"]
    receiver.stop()
    sender.stop()


def test_cutting_a_namespace_off_stops_delivery_and_healing_restores_it(lab) -> None:
    a, _, c = lab.nodes
    receiver = start_node(lab, a, a.overlay_v4, 7952, "--accept", OVERLAY_V4_CIDR)
    sender = start_node(lab, c, c.overlay_v4, 7952, "--accept", OVERLAY_V4_CIDR)
    send(sender, (a.overlay_v4, 7952), "before cut")
    receiver.expect(is_packet("before cut"), timeout=10)

    lab.cut(c)
    try:
        # While cut, nothing gets through: send for a second, nothing may arrive.
        deadline = time.monotonic() + 1.0
        i = 0
        while time.monotonic() < deadline:
            send(sender, (a.overlay_v4, 7952), f"during cut {i}")
            i += 1
            time.sleep(0.1)
        assert i >= 5
        with pytest.raises(TimeoutError):
            receiver.expect(lambda m: m["event"] == "packet", timeout=0.5)
    finally:
        lab.heal(c)

    # Healed: keep sending until one arrives (WireGuard may need to re-handshake).
    deadline = time.monotonic() + 15
    while True:
        send(sender, (a.overlay_v4, 7952), "after heal")
        try:
            receiver.expect(is_packet("after heal"), timeout=0.5)
            break
        except TimeoutError:
            assert time.monotonic() < deadline, "delivery did not resume after heal"
    receiver.stop()
    sender.stop()
