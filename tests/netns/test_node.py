"""Daemons in network namespaces: over a real WireGuard overlay, and found by mDNS.

Needs root, `ip`, `iptables` and (for the overlay) `wireguard-go` and `wg`; skipped with
the reason otherwise. Uses the lab in tests/netns/lab.py (namespaces on a bridge,
wireguard-go in each). The daemons' control sockets are files, so the test reads them
from the root namespace like any operator would.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.node.harness import Daemon, Mesh, wait_until

from . import lab

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _skip_unless_lab(wireguard: bool) -> ModuleType:
    reason = lab.missing_requirements(wireguard=wireguard)
    if reason:
        pytest.skip(reason)
    return lab


def udp_refused(d: Daemon) -> int:
    return int(d.status()["transport"]["udp"]["refused_source"])


def test_wireguard_overlay(tmp_path: Path) -> None:
    netns = _skip_unless_lab(wireguard=True)
    mesh = Mesh(tmp_path, preset="local")
    with netns.NetnsLab(3, keepalive=1) as lab:
        try:
            n0, _, n2 = lab.nodes
            seed = f"{n0.overlay_v4}:7950"
            daemons: list[Daemon] = []
            for node in lab.nodes:
                # n0, n1: detection picks the overlay address to bind. n2 binds all
                # addresses, so the accept policy alone must keep the underlay out.
                network: tuple[str, ...] = ("--overlay", "wireguard")
                if node is n2:
                    network += ("--bind", "0.0.0.0")
                flags = () if node is n0 else ("--bootstrap", seed)
                wrap = ("ip", "netns", "exec", node.netns)
                daemons.append(
                    mesh.spawn(f"w{node.index}", *flags, network=network, wrap=wrap)
                )
            for d in daemons:
                mesh.ready(d)
            d0, d1, d2 = daemons
            for d, node in zip(daemons, lab.nodes, strict=True):
                status = d.status()
                assert status["overlay"]["kind"] == "wireguard"
                assert status["node"]["address"] == f"{node.overlay_v4}:7950"
                assert "10.77.0.0/24" in status["overlay"]["accept"]
                assert not any(c.startswith("10.66.") for c in status["overlay"]["accept"])
            everyone = {d.node_id: "alive" for d in daemons}
            wait_until(lambda: mesh.converged(daemons, everyone), 60, "overlay mesh to converge")

            # A datagram to n2's underlay address is refused (source outside the overlay).
            before = udp_refused(d2)
            lab.exec(
                n0, sys.executable, "-c",
                "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM);"
                f" s.sendto(b'hello', ('{n2.underlay}', 7950))",
            )  # fmt: skip
            wait_until(lambda: udp_refused(d2) > before, 10, "underlay packet refused")

            # Cut n2 off the underlay (so its overlay dies too): the others declare it dead.
            lab.cut(n2)
            wait_until(
                lambda: all(d.view().get(d2.node_id) == "dead" for d in (d0, d1)),
                40, "the others to declare the cut node dead",
            )  # fmt: skip
            # Heal: the mesh takes it back without anybody restarting anything.
            lab.heal(n2)
            wait_until(lambda: mesh.converged(daemons, everyone), 60, "the mesh to heal")
        finally:
            mesh.stop_all()


def test_mdns_discovery(tmp_path: Path) -> None:
    netns = _skip_unless_lab(wireguard=False)
    mesh = Mesh(tmp_path, preset="local")
    with netns.NetnsLab(3, wireguard=False) as lab:
        try:
            daemons = [
                mesh.spawn(
                    f"m{node.index}", "--mdns",
                    network=("--overlay", "none", "--bind", node.underlay),
                    wrap=("ip", "netns", "exec", node.netns),
                )
                for node in lab.nodes
            ]
            for d in daemons:
                mesh.ready(d)
            everyone = {d.node_id: "alive" for d in daemons}
            # No --bootstrap anywhere: only mDNS can have introduced them.
            wait_until(lambda: mesh.converged(daemons, everyone), 60, "mDNS peers to join")
            wait_until(
                lambda: all("mdns.on" in d.log() for d in daemons), 10, "all to log mdns.on"
            )
            # The TXT fingerprint is the cluster fingerprint `status` shows, not another hash.
            for d in daemons:
                fingerprint = d.status()["cluster"]["fingerprint"]
                (line,) = [line for line in d.log().splitlines() if " mdns.on " in line]
                assert f"fp={fingerprint}" in line.split()
            for d in daemons:
                assert "--bootstrap" not in str(d.proc.args)
        finally:
            mesh.stop_all()




def test_udp_blocked_tcp_works(tmp_path: Path) -> None:
    """UDP filtered between two nodes, TCP open: they stay members, each says so once."""
    netns = _skip_unless_lab(wireguard=False)
    mesh = Mesh(tmp_path, preset="local")
    with netns.NetnsLab(2, wireguard=False) as lab:
        try:
            n0, n1 = lab.nodes
            daemons = [
                mesh.spawn(
                    f"u{node.index}",
                    *(() if node is n0 else ("--bootstrap", f"{n0.underlay}:7950")),
                    network=("--overlay", "none", "--bind", node.underlay),
                    wrap=("ip", "netns", "exec", node.netns),
                )
                for node in lab.nodes
            ]
            for d in daemons:
                mesh.ready(d)
            d0, d1 = daemons
            everyone = {d.node_id: "alive" for d in daemons}
            wait_until(lambda: mesh.converged(daemons, everyone), 30, "converge")
            # A filter on the path: each side's UDP leaves but never arrives.
            for node, other in ((n0, n1), (n1, n0)):
                lab.exec(
                    node, "iptables", "-I", "INPUT", "-p", "udp", "-s", other.underlay,
                    "-j", "DROP",
                )  # fmt: skip
            wait_until(
                lambda: "udp.blocked" in d0.log() and "udp.blocked" in d1.log(),
                30, "both to notice UDP is blocked",
            )  # fmt: skip
            # Probes went over TCP instead: nobody was declared dead.
            assert mesh.converged(daemons, everyone)
            for d in daemons:
                assert "member.dead" not in d.log()
                assert d.log().count("udp.blocked") == 1
                assert any("UDP" in w for w in d.status()["warnings"])
        finally:
            mesh.stop_all()
