"""Admission over real sockets: only enrolled nodes get in, and forged, replayed or
mis-signed data changes nothing and is counted."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import attrs
import pytest

from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.envelope_keys import packet_authenticator
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.record import RECORD_CONTEXT, Capabilities, NodeRecord, NodeStatus
from swim import wire
from tests.node.harness import Daemon, Mesh, wait_until


def drops(daemon: Daemon, kind: str, reason: str) -> int:
    return int(daemon.status()["drops"][kind][reason])


def test_start_refused_without_valid_certificate(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    try:
        # A certificate from another cluster's authority: refused before any socket opens.
        state = mesh.prepare("stranger", authority=ClusterAuthority.generate())
        d = mesh.spawn("stranger", state=state)
        assert d.wait_exit(timeout=30) == 1
        lines = d.log().strip().splitlines()
        assert len(lines) == 1, lines
        assert "wrong_authority" in lines[0] and "populi-node cluster enroll" in lines[0]
        # No certificate at all: says how to get one.
        state = mesh.prepare("nocert")
        (state / "node.cert").unlink()
        d = mesh.spawn("nocert", state=state)
        assert d.wait_exit(timeout=30) == 1
        line = d.log().strip()
        assert "no enrollment certificate" in line and "\n" not in line
    finally:
        mesh.stop_all()


@pytest.mark.slow
def test_rogue_cluster_cannot_join(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    try:
        a = mesh.start("a")
        # The rogue runs fine under its own authority (it trusts it), but a's authority
        # never enrolled it: every packet it sends a is refused.
        rogue_authority = ClusterAuthority.create(tmp_path / "rogue-authority")
        state = tmp_path / "rogue"
        identity = NodeIdentity.load_or_create(state)
        from populi_p2p.trust.certificate import write_certificate

        write_certificate(
            state / "node.cert", rogue_authority.enroll(identity.public_key, now=time.time())
        )
        pub = (tmp_path / "rogue-authority" / "authority.pub").read_bytes()
        (state / "authority.pub").write_bytes(pub)
        rogue = mesh.start("rogue", "--bootstrap", a.address, state=state)
        wait_until(lambda: drops(a, "auth", "bad_certificate") >= 2, 20, "a to refuse the rogue")
        assert rogue.node_id not in a.view()
        assert a.view() == {}
        assert a.status()["cluster"]["members"]["alive"] == 1
    finally:
        mesh.stop_all()


@pytest.mark.slow
def test_forged_replayed_and_missigned(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        a = mesh.start("a")
        b = mesh.start("b", "--bootstrap", a.address)
        wait_until(
            lambda: mesh.converged([a, b], {a.node_id: "alive", b.node_id: "alive"}),
            20, "a and b to converge",
        )  # fmt: skip
        # An insider key, enrolled by the real authority, speaking from the test.
        insider = NodeIdentity.generate()
        cert = mesh.authority.enroll(insider.public_key, now=time.time())
        auth = packet_authenticator(insider, cert.raw, mesh.authority.public_key)
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5.0)
        me = sock.getsockname()
        host, port = a.address.rsplit(":", 1)
        target = (host, int(port))

        # 1. A sealed ping is answered: the envelope is right ...
        ping = wire.encode(wire.Ping(7, a.node_id, insider.node_id, me))
        packet = auth.seal(ping, time.time(), recipient=a.node_id)
        sock.sendto(packet, target)
        reply, _ = sock.recvfrom(4096)
        assert auth.open(reply, time.time()).sender_node_id == a.node_id
        # ... and the very same bytes again are a replay: dropped and counted.
        before = drops(a, "auth", "replayed")
        sock.sendto(packet, target)
        wait_until(lambda: drops(a, "auth", "replayed") == before + 1, 10, "replay counted")

        # 2. A forged packet (a signed "b is dead", one byte changed) changes nothing.
        b_before = {m["node_id"]: m for m in a.members()}[b.node_id]
        dead = wire.encode(wire.Dead(b.node_id, b_before["incarnation"] + 5, insider.node_id))
        forged = bytearray(auth.seal(dead, time.time(), recipient=a.node_id))
        forged[-80] ^= 0x01  # inside the payload, before the signature
        before = drops(a, "auth", "bad_signature")
        sock.sendto(bytes(forged), target)
        wait_until(lambda: drops(a, "auth", "bad_signature") == before + 1, 10, "forgery counted")
        garbage_before = drops(a, "auth", "malformed") + drops(a, "auth", "bad_version")
        sock.sendto(b"\x01\x00garbage", target)
        sock.sendto(b"\x7fnot a packet at all", target)
        wait_until(
            lambda: drops(a, "auth", "malformed") + drops(a, "auth", "bad_version")
            == garbage_before + 2,
            10, "garbage counted",
        )  # fmt: skip
        b_after = {m["node_id"]: m for m in a.members()}[b.node_id]
        assert b_after["state"] == "alive"
        assert b_after["incarnation"] == b_before["incarnation"]

        # 3. A record for b signed by the insider's key: the core may relay it, but the
        # record book drops it and a keeps b's own record.
        b_status = b.status()["node"]
        fake = NodeRecord(
            node_id=b.node_id,
            public_key=bytes.fromhex(b_status["public_key"]),
            name="evil",
            address="127.0.0.1",
            port=1,
            software_version="x",
            protocol_version=1,
            started_at=time.time(),
            sequence=int(time.time() * 1000) + 10**9,
            status=NodeStatus.DRAINING,
            capabilities=Capabilities(1, 1),
            labels={"owned": "yes"},
            certificate=cert.raw,
        )
        body = fake.encode_body()
        missigned = body + insider.sign(RECORD_CONTEXT, body)
        b_host, b_port = b_before["address"].rsplit(":", 1)
        alive = wire.encode(
            wire.Alive(b.node_id, b_before["incarnation"] + 1, (b_host, int(b_port)), missigned)
        )
        before = drops(a, "records", "bad_signature")
        sock.sendto(auth.seal(alive, time.time(), recipient=a.node_id), target)
        wait_until(
            lambda: drops(a, "records", "bad_signature") > before, 10, "bad record counted"
        )
        # Until b hears the forged rumor and refutes it, a's view of b carries a record
        # that did not verify: a says so, once, and shows b as unverified meanwhile.
        refused = f"record.refused id={b.node_id} reason=bad_signature"
        wait_until(lambda: refused in a.log(), 10, "a to log the refused record")

        def b_verified_again() -> dict[str, object] | None:
            row = {m["node_id"]: m for m in a.members()}[b.node_id]
            return row if row["verified"] else None

        row = wait_until(b_verified_again, 20, "b to refute with its own record")
        assert row["name"] == "b" and row["labels"] == {} and row["unverified"] is None
        assert row["status"] == "available"
        assert row["incarnation"] > b_before["incarnation"] + 1  # b outbid the forgery

        # 4. An insider gossips a member whose record another cluster's authority
        # vouches for: a holds it (membership is the core's), but as unverified, with
        # nothing of what its record claims, in members and in status.
        stranger = NodeIdentity.generate()
        foreign = ClusterAuthority.generate().enroll(stranger.public_key, now=time.time())
        record = attrs.evolve(
            fake, node_id=stranger.node_id, public_key=stranger.public_key, name="stranger",
            certificate=foreign.raw,
        )  # fmt: skip
        alive = wire.encode(
            wire.Alive(stranger.node_id, 1, ("127.0.0.1", 9), record.sign(stranger).raw)
        )
        sock.sendto(auth.seal(alive, time.time(), recipient=a.node_id), target)

        def stranger_row() -> dict[str, object] | None:
            return {m["node_id"]: m for m in a.members()}.get(stranger.node_id)

        row = wait_until(stranger_row, 10, "a to hold the gossiped stranger")
        assert not row["verified"] and row["unverified"] == "wrong_authority"
        assert row["name"] == "?" and row["capabilities"] == "-" and row["labels"] == {}
        status = a.status()
        listed = {u["node_id"]: u["reason"] for u in status["unverified"]}
        assert listed == {stranger.node_id: "wrong_authority"}
        assert status["cluster"]["unverified"] == 1
        assert "1 unverified" in status["cluster"]["summary"]
        assert any(stranger.node_id in w and "unverified" in w for w in status["warnings"])
    finally:
        sock.close()
        mesh.stop_all()


@pytest.mark.slow
def test_revocation_gossips_and_removes(tmp_path: Path) -> None:
    """A revocation handed to one node reaches the others, which then refuse the node."""
    from populi_p2p.trust.revocation import write_revocation

    mesh = Mesh(tmp_path)
    try:
        a = mesh.start("a")
        b = mesh.start("b", "--bootstrap", a.address)
        c = mesh.start("c", "--bootstrap", a.address)
        everyone = {d.node_id: "alive" for d in (a, b, c)}
        wait_until(lambda: mesh.converged([a, b, c], everyone), 30, "converge")
        c_key = bytes.fromhex(c.status()["node"]["public_key"])
        revocation = mesh.authority.revoke(now=time.time(), node_public_key=c_key)
        (a.state_dir / "revocations").mkdir()
        write_revocation(a.state_dir / "revocations" / "c.rev", revocation)
        # b never got the file: it learns the revocation from a, and keeps it.
        wait_until(
            lambda: list((b.state_dir / "revocations").glob("gossip-*.rev")),
            20, "b to receive the revocation by gossip",
        )  # fmt: skip
        # a holds c until it is reaped, as unverified from the moment it adopted the
        # revocation (alive, suspect or dead: its record no longer counts).
        wait_until(
            lambda: any(
                m["node_id"] == c.node_id and m["unverified"] == "revoked" and not m["verified"]
                for m in a.members()
            ),
            10, "a to show c as unverified (revoked)",
        )  # fmt: skip
        wait_until(
            lambda: a.view().get(c.node_id) in ("dead", None)
            and b.view().get(c.node_id) in ("dead", None),
            40, "a and b to drop the revoked node",
        )  # fmt: skip
        assert drops(a, "auth", "revoked") > 0
        assert "revocation.adopted" in b.log() and "source=gossip" in b.log()
    finally:
        mesh.stop_all()


def test_cluster_secret_encrypts_and_a_loose_secret_file_is_refused(tmp_path: Path) -> None:
    from populi_p2p.trust.authority import generate_cluster_secret, write_cluster_secret

    mesh = Mesh(tmp_path)
    try:
        secret = tmp_path / "cluster.secret"
        write_cluster_secret(secret, generate_cluster_secret())
        a = mesh.start("sa", "--cluster-secret", str(secret))
        b = mesh.start("sb", "--cluster-secret", str(secret), "--bootstrap", a.address)
        expect = {a.node_id: "alive", b.node_id: "alive"}
        wait_until(lambda: mesh.converged([a, b], expect), 30, "secret-sharing nodes to meet")
        # A third node without the secret cannot be understood: it never gets in.
        c = mesh.start("sc", "--bootstrap", a.address)
        wait_until(lambda: drops(a, "auth", "decrypt_failed") > 0, 30, "undecryptable packets")
        assert c.node_id not in a.view()
        # A secret file others can read is refused before any socket opens.
        loose = tmp_path / "loose.secret"
        loose.write_bytes(secret.read_bytes())
        loose.chmod(0o644)
        d = mesh.spawn("sd", "--cluster-secret", str(loose))
        assert d.wait_exit(timeout=30) == 1
        line = d.log().strip()
        assert "cluster secret refused" in line and "\n" not in line
        assert c.running
    finally:
        mesh.stop_all()
