"""Node-side messages that say plainly what is wrong and how to fix it (issue 7 §4, §7):
an expired certificate, and an advertised address outside our own accept list."""

from __future__ import annotations

import time
from pathlib import Path

from populi_p2p.certificate import write_certificate
from populi_p2p.identity import NodeIdentity

from .harness import Mesh, wait_until

CERT_LIFETIME = 8.0


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
        ok = mesh.start("lan", "--advertise", "127.0.0.1", network=network)
        assert not [w for w in ok.status()["warnings"] if "accept list" in w]
    finally:
        mesh.stop_all()
