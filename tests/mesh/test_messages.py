"""Node-side messages that say plainly what is wrong and how to fix it (issue 7 §4, §7):
an expired certificate, a peer's clock that is off, and an advertised address outside
our own accept list."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from populi_p2p.trust.certificate import write_certificate
from populi_p2p.trust.envelope_keys import packet_authenticator
from populi_p2p.trust.identity import NodeIdentity
from swim import wire
from tests.node.harness import Mesh, wait_until

#: Long enough for a daemon to start on a loaded machine (it refuses an expired one).
CERT_LIFETIME = 12.0


def test_certificate_that_expires_while_running_is_said_once(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    try:
        state = mesh.prepare("short")
        identity = NodeIdentity.load_or_create(state)
        cert = mesh.authority.enroll(identity.public_key, expires_in=CERT_LIFETIME, now=time.time())
        (state / "node.cert").unlink()
        write_certificate(state / "node.cert", cert)
        d = mesh.start("short", state=state)
        assert not any("certificate expired" in w for w in d.status()["warnings"])

        def expired() -> str | None:
            return next((w for w in d.status()["warnings"] if "certificate expired" in w), None)

        warning = wait_until(expired, CERT_LIFETIME + 20, "the expiry in status")
        assert "populi-node cluster enroll" in warning and str(state / "node.cert") in warning
        assert "restart" in warning
        assert d.log().count("certificate.expired") == 1
        assert d.running  # it says so; it does not die
    finally:
        mesh.stop_all()


def test_advertised_address_outside_the_accept_list_is_warned(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    try:
        # As a host with a public eth0 and no overlay: `auto` finds none, the accept list
        # is the LAN ranges, and the address it would advertise is outside them.
        network = ("--bind", "127.0.0.1", "--port", "0", "--overlay", "auto")
        d = mesh.start("public", "--advertise", "198.51.100.7", network=network)
        warnings = d.status()["warnings"]
        match = [w for w in warnings if "outside this node's accept list" in w]
        assert len(match) == 1, warnings
        assert "198.51.100.7" in match[0] and "--allow-cidr 198.51.100.7/32" in match[0]
        assert "--overlay none" in match[0]
        assert d.log().count("advertise.outside_accept") == 1
        loopback = ("--bind", "127.0.0.1", "--port", "0", "--overlay", "none")
        ok = mesh.start("lan", "--advertise", "127.0.0.1", network=loopback)
        assert not [w for w in ok.status()["warnings"] if "accept list" in w]
    finally:
        mesh.stop_all()


def test_a_peer_whose_clock_is_10_minutes_ahead_is_named_in_status(tmp_path: Path) -> None:
    """An enrolled key whose clock is 600 s ahead: its packets are refused as stale, and
    the daemon says so once, in the log and in `status`."""
    mesh = Mesh(tmp_path)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        a = mesh.start("a")
        skewed = NodeIdentity.generate()
        cert = mesh.authority.enroll(skewed.public_key, now=time.time())
        auth = packet_authenticator(skewed, cert.raw, mesh.authority.public_key)
        sock.bind(("127.0.0.1", 0))
        me = sock.getsockname()
        host, port = a.address.rsplit(":", 1)
        for sequence in range(3):
            ping = wire.encode(wire.Ping(sequence, a.node_id, skewed.node_id, me))
            sock.sendto(auth.seal(ping, time.time() + 600, recipient=a.node_id), (host, int(port)))

        def said() -> list[str]:
            return [w for w in a.status()["warnings"] if "in the future" in w]

        (warning,) = wait_until(said, 10, "the skew in status")
        assert warning.startswith("packets from 127.0.0.1 are 60") and "(NTP)" in warning
        assert a.status()["drops"]["auth"]["stale"] >= 3
        assert a.log().count("clock.skew") == 1
        # The allowed skew is configurable: a node allowing 15 minutes takes the same
        # packets (it answers the ping; nothing is refused as stale).
        b = mesh.start("b", "--max-clock-skew", "900")
        host, port = b.address.rsplit(":", 1)
        ping = wire.encode(wire.Ping(7, b.node_id, skewed.node_id, me))
        sock.sendto(auth.seal(ping, time.time() + 600, recipient=b.node_id), (host, int(port)))
        sock.settimeout(10)
        answer, _ = sock.recvfrom(65536)
        assert answer and b.status()["drops"]["auth"]["stale"] == 0
    finally:
        sock.close()
        mesh.stop_all()
