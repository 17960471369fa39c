"""Attacks with a key: replays, a revoked key, overflowing integers from an enrolled
insider, a skewed clock, and an insider's forged suspicions (issue 7, "A standing
fault-and-attack suite"). The limit case, `Suspect(victim, 2**62)`, has its own mesh
(test_attacks_limit.py) because it takes the victim out for a while, by design.
"""

from __future__ import annotations

import subprocess
import sys
import time

from swim import SwimConfig, wire
from tests.node.harness import wait_until

from .attacker import TALLY, Attacker
from .conftest import AttackMesh
from .helpers import auth_drops, swim_counter, wait_for_drops


def test_replayed_packets_are_refused(attack_mesh: AttackMesh) -> None:
    """An enrolled attacker's own packets sent again, its packet for one member sent to
    another, and members' replies to it (captured) sent back and to the others."""
    watch = attack_mesh.watch()
    daemons = attack_mesh.daemons
    attacker = Attacker("127.0.0.61", attack_mesh.mesh.authority, seed=61)
    try:
        pings = {d.node_id: attacker.ping(d.node_id, seq=61, recipient=d.node_id) for d in daemons}
        captured = {}
        for d in daemons:
            attacker.send(attack_mesh.address(d), pings[d.node_id])
            reply = attacker.receive(timeout=10)
            assert reply is not None, f"{d.name} did not answer an enrolled sender"
            assert attacker.auth.open(reply, time.time()).sender_node_id == d.node_id
            captured[d.node_id] = reply
        before = {d.node_id: auth_drops(d) for d in daemons}
        for i, d in enumerate(daemons):
            target = attack_mesh.address(d)
            for _ in range(10):  # the very same bytes again
                attacker.send(target, pings[d.node_id])
            other = daemons[(i + 1) % len(daemons)]
            attacker.send(target, pings[other.node_id])  # addressed to someone else
            for reply in captured.values():  # a member's reply, captured and replayed
                attacker.send(target, reply)
        for d in daemons:
            # Its own reply comes back signed for the attacker (bad_signature); the
            # others' replies too, or (once the window moved on) replayed or rate limited.
            replies = len(daemons)
            now = wait_for_drops(d, before[d.node_id], {"replayed": 10, "bad_signature": 1})
            refused = sum(now.values()) - sum(before[d.node_id].values())
            assert refused >= 10 + 1 + replies, (before[d.node_id], now)
        assert attacker.receive(timeout=0.3) is None  # no replay was answered
        changes = watch.settled()
        TALLY.add("replay of captured packets", attacker.sent, len(changes))
        assert changes == []
    finally:
        attacker.close()


def test_a_revoked_key_is_refused_everywhere(attack_mesh: AttackMesh) -> None:
    """Revoked with `populi-node cluster revoke`, handed to one member, gossiped."""
    watch = attack_mesh.watch()
    daemons = attack_mesh.daemons
    attacker = Attacker("127.0.0.62", attack_mesh.mesh.authority, seed=62)
    try:
        for d in daemons:  # accepted while enrolled: every member answers
            attacker.send(attack_mesh.address(d), attacker.ping(d.node_id, recipient=d.node_id))
            assert attacker.receive(timeout=10) is not None, f"{d.name} did not answer"
        revocation = attack_mesh.mesh.root / "attacker.rev"
        subprocess.run(
            [
                sys.executable, "-m", "populi_p2p.cli", "cluster", "revoke",
                "--key", attacker.public_key.hex(),
                "--authority-dir", str(attack_mesh.mesh.root / "authority"),
                "--out", str(revocation),
            ],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        first, *rest = daemons
        (first.state_dir / "revocations").mkdir(exist_ok=True)
        (first.state_dir / "revocations" / "attacker.rev").write_bytes(revocation.read_bytes())
        wait_until(
            lambda: all(
                list((d.state_dir / "revocations").glob("gossip-*.rev")) for d in rest
            ),
            30, "the revocation to reach every member by gossip",
        )  # fmt: skip
        before = {d.node_id: auth_drops(d) for d in daemons}
        victim = daemons[1]
        for d in daemons:
            packets = [attacker.ping(d.node_id, seq=i, recipient=d.node_id) for i in range(3)]
            packets.append(
                attacker.seal(wire.Dead(victim.node_id, 10, attacker.node_id), recipient=d.node_id)
            )
            for p in packets:
                attacker.send(attack_mesh.address(d), p)
        for d in daemons:
            wait_for_drops(d, before[d.node_id], {"revoked": 4})
        assert attacker.receive(timeout=0.3) is None  # refused: no answer any more
        changes = watch.settled()
        TALLY.add("revoked sender (gossiped revocation)", attacker.sent, len(changes))
        assert changes == []
    finally:
        attacker.close()


def test_overflowing_integers_from_an_insider_are_dropped(attack_mesh: AttackMesh) -> None:
    """`Suspect(victim, 2**64-1)` and `2**63` (and Dead, Alive), sent by an enrolled key to
    every member, about itself and about the others: dropped and counted, no crash."""
    watch = attack_mesh.watch()
    daemons = attack_mesh.daemons
    attacker = Attacker("127.0.0.63", attack_mesh.mesh.authority, seed=63)
    try:
        before = {d.node_id: swim_counter(d, "dropped_out_of_range") for d in daemons}
        sent: dict[str, int] = {}
        for d in daemons:
            packets = []
            for victim in daemons:
                address = attack_mesh.address(victim)
                for huge in (2**64 - 1, 2**63, 2**62 + 1):
                    for message in (
                        wire.Suspect(victim.node_id, huge, attacker.node_id),
                        wire.Dead(victim.node_id, huge, attacker.node_id),
                        wire.Alive(victim.node_id, huge, address, b""),
                    ):
                        packets.append(attacker.seal(message, recipient=d.node_id))
            attacker.send_paced(attack_mesh.address(d), packets, per_second=500)
            sent[d.node_id] = len(packets)
        for d in daemons:
            wait_until(
                lambda d=d: swim_counter(d, "dropped_out_of_range") - before[d.node_id]
                >= sent[d.node_id],
                15, f"{d.name} to drop every out-of-range integer",
            )  # fmt: skip
        changes = watch.settled()
        TALLY.add("overflowing integers (2**64-1, 2**63, 2**62+1)", attacker.sent, len(changes))
        assert changes == []
    finally:
        attacker.close()


def test_a_sender_600_s_ahead_is_refused_and_named(attack_mesh: AttackMesh) -> None:
    """An enrolled sender whose clock is 10 minutes ahead: refused as stale, counted,
    and named in `status` with the fix."""
    watch = attack_mesh.watch()
    daemons = attack_mesh.daemons
    attacker = Attacker("127.0.0.64", attack_mesh.mesh.authority, seed=64)
    try:
        before = {d.node_id: auth_drops(d) for d in daemons}
        for d in daemons:
            for seq in range(3):
                ping = attacker.ping(d.node_id, seq=seq, recipient=d.node_id, clock_offset=600)
                attacker.send(attack_mesh.address(d), ping)
        for d in daemons:
            wait_for_drops(d, before[d.node_id], {"stale": 3})

            def said(d=d) -> list[str]:  # type: ignore[no-untyped-def]
                return [
                    w for w in d.status()["warnings"] if w.startswith("packets from 127.0.0.64")
                ]

            (warning,) = wait_until(said, 10, f"{d.name} to name the skewed sender")
            assert "in the future: check its clock (NTP)" in warning
            assert " are 59" in warning or " are 60" in warning, warning
        assert attacker.receive(timeout=0.3) is None
        changes = watch.settled()
        TALLY.add("skewed clock (+600 s)", attacker.sent, len(changes))
        assert changes == []
    finally:
        attacker.close()


def test_an_insiders_forged_suspicion_is_refuted(attack_mesh: AttackMesh) -> None:
    """An enrolled insider tells two members that a third is suspect, and dead, at its
    current incarnation: the victim refutes, and ends alive everywhere."""
    daemons = attack_mesh.daemons
    victim = daemons[3]
    watch = attack_mesh.watch()
    attacker = Attacker("127.0.0.65", attack_mesh.mesh.authority, seed=65)
    try:
        incarnation = {m["node_id"]: m for m in victim.members()}[victim.node_id]["incarnation"]
        refutes = swim_counter(victim, "refutes")
        suspect = wire.Suspect(victim.node_id, incarnation, attacker.node_id)
        dead = wire.Dead(victim.node_id, incarnation, attacker.node_id)
        attacker.send(
            attack_mesh.address(daemons[0]), attacker.seal(suspect, recipient=daemons[0].node_id)
        )
        attacker.send(
            attack_mesh.address(daemons[1]), attacker.seal(dead, recipient=daemons[1].node_id)
        )
        wait_until(lambda: swim_counter(victim, "refutes") > refutes, 15, "the victim to refute")
        # Membership as before, except what the refute explains: the victim's
        # incarnation rose, and members that heard "dead" believed it until the refute.
        changes = watch.settled(rumored_dead=True)
        TALLY.add("insider's forged suspect and dead (refuted)", attacker.sent, len(changes))
        assert changes == []
    finally:
        attacker.close()


def test_a_lean_packet_in_a_members_name_signed_by_another_key_is_refused(
    attack_mesh: AttackMesh,
) -> None:
    """Every member holds every other's certificate (from its record, or its packets), so
    a member's packets may come without it. An enrolled insider sends, in a member's
    name and without a certificate, a properly signed envelope, signed by its own key,
    carrying a "dead" rumor about a third member. It must open nowhere."""
    watch = attack_mesh.watch()
    daemons = attack_mesh.daemons
    victim, target, *_ = daemons
    victim_key = bytes.fromhex(victim.status()["node"]["public_key"])
    rumor = wire.Dead(target.node_id, 10, victim.node_id)
    attacker = Attacker("127.0.0.67", attack_mesh.mesh.authority, seed=67)
    try:
        before = {d.node_id: auth_drops(d) for d in daemons}
        for d in daemons:
            if d is victim:
                continue
            for _ in range(5):
                forged = attacker.lean_in_name_of(victim_key, d.node_id, rumor)
                attacker.send(attack_mesh.address(d), forged)
        for d in daemons:
            if d is victim:
                continue
            wait_until(
                lambda d=d: sum(auth_drops(d)[r] - before[d.node_id][r]
                                for r in ("bad_signature", "rate_limited")) >= 5,
                15, f"{d.name} to refuse the forgeries",
            )  # fmt: skip
        assert attacker.receive(timeout=0.3) is None
        changes = watch.settled()
        TALLY.add("lean packet in a member's name, another key", attacker.sent, len(changes))
        assert changes == []
    finally:
        attacker.close()


def test_an_insiders_flood_of_pulls_costs_bounded_answers(attack_mesh: AttackMesh) -> None:
    """An enrolled key that is no member asks each member, over and over, for every
    record it holds (twice over) and for names nobody holds, 200 names a request: at
    most `pull_names_max` names are looked at, and since no member holds the sender,
    each answer goes to the packet's source within the request's own size (issue 18:
    at most one byte back per byte asked), and nothing changes."""
    watch = attack_mesh.watch()
    daemons = attack_mesh.daemons
    attacker = Attacker("127.0.0.66", attack_mesh.mesh.authority, seed=66)
    most = SwimConfig.lan().pull_names_max
    requests = 20
    try:
        held = [d.node_id for d in daemons]
        # Short unknown names keep the request one datagram (the daemon takes 2,048 bytes).
        names = tuple(held + held + [f"x{i}" for i in range(200 - 2 * len(held))])
        request = wire.encode(wire.Pull(attacker.node_id, attacker.address, names))
        counters = ("pulls_received", "pull_answers_capped", "pull_names_refused")
        before = {d.node_id: {c: swim_counter(d, c) for c in counters} for d in daemons}
        for d in daemons:
            pull = wire.Pull(attacker.node_id, attacker.address, names)
            packets = [attacker.seal(pull, recipient=d.node_id) for _ in range(requests)]
            attacker.send_paced(attack_mesh.address(d), packets, per_second=100)
        for d in daemons:
            wait_until(
                lambda d=d: swim_counter(d, "pulls_received") - before[d.node_id]["pulls_received"]
                >= requests,
                15, f"{d.name} to read every pull",
            )  # fmt: skip
        for d in daemons:
            grown = {c: swim_counter(d, c) - before[d.node_id][c] for c in counters}
            assert grown["pull_answers_capped"] == requests, grown
            assert grown["pull_names_refused"] == requests * (len(names) - most), grown
        answered = 0
        while (reply := attacker.receive(timeout=1.0)) is not None:
            opened = attacker.auth.open(reply, time.time())
            assert len(opened.payload) <= len(request)
            for message in wire.decode_packet(opened.payload):
                assert isinstance(message, wire.Alive) and message.name in held
                answered += 1
        assert 0 < answered < len(daemons) * requests * len(held)
        changes = watch.settled()
        TALLY.add("a flood of pulls for every record", attacker.sent, len(changes))
        assert changes == []
    finally:
        attacker.close()


def test_task_output_is_served_to_members_only(attack_mesh: AttackMesh) -> None:
    """An enrolled certificate that never ran a daemon asks the owner's peer API for a
    task's output (issue 18, row 6): 403, counted, no byte of it; a member's
    ``logs`` (another daemon fetching from the owner) still gets the output."""
    import base64

    import trio

    from populi_p2p.executor.logs import LOG_PEER_PATH
    from populi_p2p.inference.peer_auth import PeerCallSigner
    from populi_p2p.inference.peer_client import PeerClient, peer_base_url
    from populi_p2p.trust.identity import NodeIdentity

    daemons = attack_mesh.daemons
    first = daemons[0]
    tid = str(first.client.post("/v1/tasks", {"command": ["echo", "secret-output"]})["id"])

    def ended() -> dict[str, object] | None:
        t = first.client.get(f"/v1/tasks/{tid}")
        return t if t["finished"] else None  # type: ignore[no-any-return]

    done = wait_until(ended, 30, "the task to end")
    assert done["phase"] == "succeeded", done
    owner = next(d for d in daemons if d.node_id == done["owner"])
    other = next(d for d in daemons if d is not owner)
    port = owner.status()["node"]["peer_port"]
    identity = NodeIdentity.generate()
    cert = attack_mesh.mesh.authority.enroll(identity.public_key, now=time.time())
    before = owner.status()["tasks"]["logs_refused_not_member"]

    async def fetch() -> tuple[int, bytes]:
        client = PeerClient(PeerCallSigner(identity, cert.raw, clock=time.time))
        try:
            path = f"{LOG_PEER_PATH}?id={tid}&stream=stdout&offset=0"
            base = peer_base_url(owner.address.rsplit(":", 1)[0], port)
            r = await client.call(owner.node_id, base, "GET", path)
            return r.status_code, r.content
        finally:
            await client.aclose()

    status, body = trio.run(fetch)
    assert status == 403, (status, body)
    assert b"secret-output" not in body and base64.b64encode(b"secret-output") not in body
    assert owner.status()["tasks"]["logs_refused_not_member"] == before + 1
    chunk = other.client.get(f"/v1/tasks/{tid}/logs?stream=stdout&offset=0")
    assert base64.b64decode(chunk["data"]) == b"secret-output\n"
    TALLY.add("an enrolled non-member asks for a task's output", 1, 0)
