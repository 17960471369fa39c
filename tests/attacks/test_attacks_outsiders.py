"""Attacks that need no enrolled key: fuzzing, forged senders, spoofed-source junk, and
holding the TCP slots (issue 7, "A standing fault-and-attack suite").

Each test counts what it sent into the suite's tally, asserts that the daemons counted
the drops, and that membership did not change (`conftest.Watch`).
"""

from __future__ import annotations

import random
import socket
import threading
import time

from populi_p2p.trust.authority import ClusterAuthority
from swim import wire
from tests.node.harness import wait_until

from .attacker import TALLY, Attacker, frame
from .conftest import AttackMesh
from .helpers import auth_drops, counted, tcp_counter, wait_for_drops


def _bit_flipped(packet: bytes, rng: random.Random) -> bytes:
    data = bytearray(packet)
    i = rng.randrange(len(data))
    data[i] ^= 1 << rng.randrange(8)
    return bytes(data)


def test_fuzzed_datagrams_are_dropped_and_counted(attack_mesh: AttackMesh) -> None:
    """Random bytes, truncated and bit-flipped real envelopes, oversize datagrams."""
    watch = attack_mesh.watch()
    attacker = Attacker("127.0.0.51", attack_mesh.mesh.authority, seed=51)
    rng = random.Random(51)
    try:
        sent: dict[str, int] = {}
        before = {d.node_id: counted(d) for d in attack_mesh.daemons}
        for d in attack_mesh.daemons:
            real = [attacker.ping(d.node_id, seq=i, recipient=d.node_id) for i in range(60)]
            packets = [b""] + [attacker.junk(rng.randint(1, 1400)) for _ in range(59)]
            packets += [p[: rng.randrange(len(p))] for p in real[:30]]
            packets += [_bit_flipped(p, rng) for p in real[30:]]
            packets += [attacker.junk(rng.choice((1401, 9000, 65000))) for _ in range(10)]
            attacker.send_paced(attack_mesh.address(d), packets, per_second=1000)
            sent[d.node_id] = len(packets)
        for d in attack_mesh.daemons:
            wait_until(
                lambda d=d: counted(d) - before[d.node_id] >= sent[d.node_id],
                15, f"{d.name} to count every fuzzed datagram",
            )  # fmt: skip
        assert attacker.receive(timeout=0.5) is None  # nothing of it was answered
        changes = watch.settled()
        TALLY.add("fuzzing (UDP)", attacker.sent, len(changes))
        assert changes == []
    finally:
        attacker.close()


def test_forged_senders_are_refused(attack_mesh: AttackMesh) -> None:
    """A rogue authority's certificate, no certificate, an expired certificate."""
    watch = attack_mesh.watch()
    daemons = attack_mesh.daemons
    victim = daemons[1]
    attackers = {
        "a rogue authority's certificate": Attacker("127.0.0.52", ClusterAuthority.generate()),
        "no certificate": Attacker("127.0.0.53", None),
        "an expired certificate": Attacker(
            "127.0.0.54", attack_mesh.mesh.authority, issued_at=time.time() - 7200,
            expires_in=3600,
        ),
    }  # fmt: skip
    try:
        before = {d.node_id: auth_drops(d) for d in daemons}
        for d in daemons:
            for attacker in attackers.values():
                rumors = (
                    wire.Suspect(victim.node_id, 0, attacker.node_id),
                    wire.Dead(victim.node_id, 10, attacker.node_id),
                )
                packets = [attacker.ping(d.node_id, seq=i) for i in range(3)]
                packets += [attacker.seal(r, recipient=d.node_id) for r in rumors]
                for p in packets:
                    attacker.send(attack_mesh.address(d), p)
        for d in daemons:
            wait_for_drops(d, before[d.node_id], {"bad_certificate": 10, "unknown_sender": 5})
        for attacker in attackers.values():
            assert attacker.receive(timeout=0.3) is None  # no ping was answered
        changes = watch.settled()
        for name, attacker in attackers.items():
            TALLY.add(f"forged sender: {name}", attacker.sent, len(changes))
        assert changes == []
    finally:
        for attacker in attackers.values():
            attacker.close()


def test_junk_from_a_members_address_costs_it_nothing(attack_mesh: AttackMesh) -> None:
    """Spoofed-source junk: random datagrams and forgeries of the victim's name, over
    UDP and TCP, from the victim's own address (another port), for about 3 s."""
    watch = attack_mesh.watch()
    victim, *others = attack_mesh.daemons
    host = attack_mesh.address(victim)[0]
    attacker = Attacker(host, None, seed=12)
    victim_key = bytes.fromhex(victim.status()["node"]["public_key"])
    before = {d.node_id: auth_drops(d) for d in others}
    stop = threading.Event()
    seen: set[str] = set()

    def sample() -> None:
        while not stop.is_set():
            for d in others:
                seen.add(d.view().get(victim.node_id, "missing"))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    conns: list[socket.socket] = []
    try:
        conns = [attacker.tcp(attack_mesh.address(d)) for d in others]
        deadline = time.monotonic() + 3.0
        rounds = 0
        while time.monotonic() < deadline:
            for d, conn in zip(others, conns, strict=True):
                target = attack_mesh.address(d)
                for _ in range(2):
                    attacker.send(target, attacker.junk(32))
                    attacker.send(target, attacker.forged_in_name_of(victim_key))
                if rounds % 5 == 0:
                    try:
                        attacker.send_frame(conn, attacker.forged_in_name_of(victim_key))
                    except OSError:
                        pass  # the daemon closed it: fine, it was junk
            rounds += 1
            time.sleep(0.005)  # pacing: about 400 datagrams per second per member
    finally:
        stop.set()
        sampler.join()
        for conn in conns:
            conn.close()
        attacker.close()
    assert seen == {"alive"}, f"the victim was seen as {seen} during the junk"
    for d in others:
        after = auth_drops(d)
        assert after["bad_version"] + after["malformed"] > before[d.node_id]["bad_version"]
        forged = ("rate_limited", "bad_signature")
        assert sum(after[r] - before[d.node_id][r] for r in forged) > 0, (before, after)
    changes = watch.settled()
    TALLY.add("spoofed-source junk (UDP+TCP, 3 s)", attacker.sent, len(changes))
    assert changes == []


def test_idle_and_keepalive_connections_cannot_hold_the_tcp_slots(
    attack_mesh: AttackMesh,
) -> None:
    """200 idle and 100 keepalive-only connections, and a 4 GiB frame header; then an
    enrolled sender's frame still gets through and is answered over TCP."""
    watch = attack_mesh.watch()
    target = attack_mesh.daemons[2]
    address = attack_mesh.address(target)
    attacker = Attacker("127.0.0.55", attack_mesh.mesh.authority, seed=55)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conns: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.55", 0))
        listener.listen(4)
        listener.settimeout(15.0)
        evicted = tcp_counter(target, "inbound_evicted")
        oversize = tcp_counter(target, "oversize_frames")
        for _ in range(300):
            conns.append(attacker.tcp(address))
            attacker.sent += 1  # a connection is what this attack sends
        for conn in conns[200:]:
            try:
                conn.sendall(frame(b""))  # keepalive only: never authenticated
                attacker.sent += 1
            except OSError:
                pass  # already evicted
        wait_until(
            lambda: tcp_counter(target, "inbound_evicted") - evicted >= 300 - 64,
            15, "the daemon to evict unauthenticated connections",
        )  # fmt: skip
        huge = attacker.tcp(address)
        huge.sendall(b"\xff\xff\xff\xff")
        attacker.sent += 1
        wait_until(
            lambda: tcp_counter(target, "oversize_frames") > oversize, 15, "the oversize frame"
        )
        huge.close()
        # An enrolled sender still gets through: a sealed ping over TCP is answered,
        # over TCP, at the address it names.
        ping = wire.Ping(9, target.node_id, attacker.node_id, listener.getsockname())
        member = attacker.tcp(address)
        attacker.send_frame(member, attacker.seal(ping, recipient=target.node_id))
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(15.0)
            header = _read_exactly(conn, 4)
            reply = _read_exactly(conn, int.from_bytes(header, "big"))
        opened = attacker.auth.open(reply, time.time())
        assert opened.sender_node_id == target.node_id
        assert wire.decode_packet(opened.payload) == [wire.Ack(9)]
        member.close()
        changes = watch.settled()
        TALLY.add("TCP slot exhaustion (300 connections)", attacker.sent, len(changes))
        assert changes == []
    finally:
        for conn in conns:
            conn.close()
        listener.close()
        attacker.close()


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise AssertionError(f"connection closed after {len(data)} of {size} bytes")
        data += chunk
    return data
