"""An enrolled member against the other members' answers and tables (issue 18, rows 4
and 5).

Row 4: a pull (swim message type 12) was answered at the address the request names:
6.15 bytes out per byte in with 3 members, 9.08 with 5, towards any host and port,
and over TCP members connected to it. An insider (`attacker.Insider`, a member every
daemon holds at its own address) now sends pulls naming a victim, over UDP and TCP, and
in another member's name; a non-member sends them too. The victim (a UDP socket and a
TCP listener on one port) counts what reaches it: nothing may.

Row 5: a member's own signed name with escapes and a newline made `members` print raw
escape codes and a forged "ghost" row. A second insider announces such a record: every
daemon refuses it on decode (counted as a malformed record), and `populi-node members`
shows nothing a terminal would act on, and no extra row.

One 3-daemon mesh (LAN preset) on 127.0.0.41-43 for the module; see docs/security.md,
"Attack suite".
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import attrs
import pytest

from swim import wire
from tests.node.harness import Daemon, wait_until

from .attacker import TALLY, Address, Attacker, Insider
from .conftest import AttackMesh, start_mesh
from .helpers import swim_counter

HOSTS = ("127.0.0.41", "127.0.0.42", "127.0.0.43")
INSIDER_HOST = "127.0.0.49"
VICTIM_HOST = "127.0.0.48"
STRANGER_HOST = "127.0.0.47"
HOSTILE_HOST = "127.0.0.46"
#: Pulls sent to each daemon per attack.
REQUESTS = 10
GHOST = "ghost  ffff  10.6.6.6:7950  alive"
#: 51 characters: within the 64 a name may have, so only its characters are wrong.
HOSTILE_NAME = f"box\x1b[31m\x1b[2J\n{GHOST}\u202e\x9b0m"


class Victim:
    """A host that never asked for anything: a UDP socket and a TCP listener on one
    port, counting every byte and connection that reaches them."""

    def __init__(self, host: str) -> None:
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((host, 0))
        self.address = (host, int(self.udp.getsockname()[1]))
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind(self.address)
        self.tcp.listen(64)
        self.udp_bytes = 0
        self.connections = 0
        self.tcp_bytes = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._read_udp, daemon=True),
            threading.Thread(target=self._accept, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def received(self) -> int:
        return self.udp_bytes + self.tcp_bytes + self.connections

    def _read_udp(self) -> None:
        self.udp.settimeout(0.2)
        while not self._stop.is_set():
            try:
                self.udp_bytes += len(self.udp.recv(65536))
            except TimeoutError:
                continue
            except OSError:
                return

    def _accept(self) -> None:
        self.tcp.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.tcp.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.settimeout(1.0)
            try:
                while chunk := conn.recv(65536):
                    self.tcp_bytes += len(chunk)
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self.udp.close()
        self.tcp.close()


@attrs.define
class PullMesh:
    attack: AttackMesh
    insider: Insider
    victim: Victim

    @property
    def daemons(self) -> list[Daemon]:
        return self.attack.daemons

    def names(self) -> tuple[str, ...]:
        return (*(d.node_id for d in self.daemons), self.insider.node_id)


def _held_everywhere(mesh: AttackMesh, node_id: str, *, verified: bool | None) -> bool:
    """Every daemon holds `node_id` alive (and, unless None, `verified` or not)."""
    for d in mesh.daemons:
        rows = [m for m in d.members() if m["node_id"] == node_id]
        if not (rows and rows[0]["state"] == "alive"):
            return False
        if verified is not None and rows[0]["verified"] != verified:
            return False
    return True


@pytest.fixture(scope="module")
def pull_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PullMesh]:
    mesh = start_mesh(tmp_path_factory.mktemp("pull-attack-mesh"), "lan", HOSTS)
    insider = Insider(INSIDER_HOST, mesh.mesh.authority, seed=81)
    victim = Victim(VICTIM_HOST)
    try:
        insider.start()
        insider.join(mesh.address(mesh.daemons[0]), mesh.daemons[0].node_id)
        wait_until(
            lambda: _held_everywhere(mesh, insider.node_id, verified=True),
            30, "every daemon to hold the insider, verified",
        )  # fmt: skip
        yield PullMesh(mesh, insider, victim)
    finally:
        insider.close()
        victim.close()
        mesh.mesh.stop_all()


def _wait_pulls_read(daemons: list[Daemon], before: dict[str, int], count: int) -> None:
    for d in daemons:
        wait_until(
            lambda d=d: swim_counter(d, "pulls_received") - before[d.node_id] >= count,
            15, f"{d.name} to read every pull",
        )  # fmt: skip


def _counters(daemons: list[Daemon], *names: str) -> dict[str, dict[str, int]]:
    return {d.node_id: {n: swim_counter(d, n) for n in names} for d in daemons}


def test_pulls_naming_a_victim_are_answered_to_the_insider_only(pull_mesh: PullMesh) -> None:
    """Over UDP: each daemon answers the insider (at the address it holds for it: it
    asked), and the named victim gets not one byte."""
    mesh, insider, victim = pull_mesh.attack, pull_mesh.insider, pull_mesh.victim
    watch = mesh.watch()
    daemons = pull_mesh.daemons
    names = pull_mesh.names()
    before = _counters(daemons, "pulls_received", "pulled_records_sent")
    answers_before = insider.alive_datagram_bytes
    sent_bytes = 0
    for d in daemons:
        pull = wire.Pull(insider.node_id, victim.address, names)
        packets = [insider.seal(pull, recipient=d.node_id) for _ in range(REQUESTS)]
        sent_bytes += sum(map(len, packets))
        insider.send_paced(mesh.address(d), packets, per_second=100)
    _wait_pulls_read(daemons, {k: v["pulls_received"] for k, v in before.items()}, REQUESTS)
    records = len(names) * REQUESTS  # each daemon holds every name alive

    def answered_records() -> int:
        return sum(
            swim_counter(d, "pulled_records_sent") - before[d.node_id]["pulled_records_sent"]
            for d in daemons
        )

    wait_until(lambda: answered_records() >= records * len(daemons), 15, "every daemon to answer")
    wait_until(
        lambda: insider.alive_datagram_bytes > answers_before or victim.received > 0,
        15, "the answers to arrive (at the insider, or at the victim)",
    )  # fmt: skip
    answered = insider.alive_datagram_bytes - answers_before
    changes = watch.settled()
    print(
        f"pulls over UDP: {sent_bytes} bytes asked, {answered} bytes answered to the insider"
        f" ({answered / sent_bytes:.2f} per byte), {victim.received} to the victim"
    )
    TALLY.add("pulls naming a victim (UDP)", insider.sent, len(changes),
              f"victim received {victim.received} bytes")  # fmt: skip
    assert victim.received == 0, (victim.udp_bytes, victim.connections, victim.tcp_bytes)
    assert answered > 0
    assert changes == []


def test_pulls_over_tcp_never_open_a_connection_to_the_named_address(
    pull_mesh: PullMesh,
) -> None:
    """The insider, then a non-member, sends pulls as TCP frames naming the victim: the
    insider's are answered at its held address (from its own host), the stranger's are
    refused (its host holds no member); nobody connects to the victim."""
    mesh, insider, victim = pull_mesh.attack, pull_mesh.insider, pull_mesh.victim
    watch = mesh.watch()
    daemons = pull_mesh.daemons
    names = pull_mesh.names()
    stranger = Attacker(STRANGER_HOST, mesh.mesh.authority, seed=82)
    try:
        before = _counters(daemons, "pulls_received", "pulls_refused")
        for sender, requester in ((insider, insider.node_id), (stranger, stranger.node_id)):
            for d in daemons:
                conn = sender.tcp(mesh.address(d))
                try:
                    for _ in range(REQUESTS):
                        pull = wire.Pull(requester, victim.address, names)
                        sender.send_frame(conn, sender.seal(pull, recipient=d.node_id))
                    _wait_pulls_read(
                        [d],
                        {d.node_id: before[d.node_id]["pulls_received"]},
                        REQUESTS * (1 if sender is insider else 2),
                    )
                finally:
                    conn.close()
        for d in daemons:
            refused = swim_counter(d, "pulls_refused") - before[d.node_id]["pulls_refused"]
            assert refused >= REQUESTS, (d.name, refused)  # the stranger's, at least
        changes = watch.settled()
        TALLY.add("pulls naming a victim (TCP frames)", insider.sent + stranger.sent,
                  len(changes), f"victim: {victim.connections} connections")  # fmt: skip
        assert victim.connections == 0 and victim.received == 0
        assert changes == []
    finally:
        stranger.close()


def test_a_pull_in_another_members_name_is_refused(pull_mesh: PullMesh) -> None:
    """The insider asks in the name of a member (at that member's own address): the
    packet is signed by the insider, so the pull is refused and counted, and the member
    named gets no records it did not ask for."""
    mesh, insider = pull_mesh.attack, pull_mesh.insider
    watch = mesh.watch()
    daemons = pull_mesh.daemons
    names = pull_mesh.names()
    before = _counters(daemons, "pulls_received", "pulls_refused", "pulled_records_sent")
    for i, d in enumerate(daemons):
        named = daemons[(i + 1) % len(daemons)]
        pull = wire.Pull(named.node_id, mesh.address(named), names)
        packets = [insider.seal(pull, recipient=d.node_id) for _ in range(REQUESTS)]
        insider.send_paced(mesh.address(d), packets, per_second=100)
    _wait_pulls_read(daemons, {k: v["pulls_received"] for k, v in before.items()}, REQUESTS)
    for d in daemons:
        grown = {n: swim_counter(d, n) - before[d.node_id][n] for n in before[d.node_id]}
        assert grown["pulls_refused"] >= REQUESTS, (d.name, grown)
    changes = watch.settled()
    TALLY.add("pulls in another member's name", insider.sent, len(changes))
    assert changes == []


def test_a_non_members_pull_gets_no_more_than_it_sent(pull_mesh: PullMesh) -> None:
    """A sender no daemon holds, asking for every record and naming the victim: the
    answer goes to the packet's source, within the request's own size."""
    mesh, victim = pull_mesh.attack, pull_mesh.victim
    daemons = pull_mesh.daemons
    stranger = Attacker(STRANGER_HOST, mesh.mesh.authority, seed=83)
    try:
        # Names nobody holds pad the request: room for one record in the answer.
        names = (*pull_mesh.names(), *(f"nobody-{i:03}-{'z' * 20}" for i in range(14)))
        request = wire.encode(wire.Pull(stranger.node_id, victim.address, names))
        before = _counters(daemons, "pulls_received", "pull_answers_capped")
        for d in daemons:
            pull = wire.Pull(stranger.node_id, victim.address, names)
            stranger.send(mesh.address(d), stranger.seal(pull, recipient=d.node_id))
        _wait_pulls_read(daemons, {k: v["pulls_received"] for k, v in before.items()}, 1)
        answers = []
        while (reply := stranger.receive(timeout=2.0)) is not None:
            answers.append(stranger.auth.open(reply, time.time()).payload)
        assert answers, "no answer at the packet's source"
        sizes = [len(a) for a in answers]
        assert all(size <= len(request) for size in sizes), (len(request), sizes)
        for d in daemons:
            capped = swim_counter(d, "pull_answers_capped")
            assert capped - before[d.node_id]["pull_answers_capped"] == 1, d.name
        note = f"answers of {sizes} bytes to requests of {len(request)}"
        TALLY.add("a non-member's pull, cut to its size", stranger.sent, 0, note)
        assert victim.received == 0
    finally:
        stranger.close()


########################################################################################
# Row 4, the other replies: pings, indirect pings, syncs and push-pulls naming a victim


def _requests_naming(
    requester: str, victim: Address, daemon: Daemon, other: Daemon, insider: Insider
) -> list[wire.Message]:
    """Every kind of request a member answers, each naming `victim` to answer at (an
    indirect ping names it as its target's address too). Syncs and push-pulls are
    padded with stale entries (the insider at incarnation 0: every daemon holds it
    above), so that an answer could be several times the request."""
    padding = tuple((insider.node_id, insider.address, 0, 0, b"p" * 40) for _ in range(6))
    return [
        wire.Ping(7, daemon.node_id, requester, victim),
        wire.IndirectPing(8, other.node_id, victim, True, requester, victim),
        wire.Sync(0, False, requester, victim, (), padding, (), b"", b""),
        wire.Sync(0, True, requester, victim, (), padding, (), b"", b""),
        wire.Sync(1, False, requester, victim, (), (), (other.node_id,) * 8, b"", b""),
        wire.PushPull(True, False, requester, victim, padding),
    ]


def test_pings_and_syncs_naming_a_victim_send_it_nothing(pull_mesh: PullMesh) -> None:
    """The insider (from its held address) and a non-member (from its own) send every
    request a member answers, naming the victim, over UDP: the victim gets not one byte;
    the non-member gets at most one byte back per byte it sent."""
    mesh, insider, victim = pull_mesh.attack, pull_mesh.insider, pull_mesh.victim
    watch = mesh.watch()
    daemons = pull_mesh.daemons
    stranger = Attacker(STRANGER_HOST, mesh.mesh.authority, seed=85)
    names = ("replies_capped", "replies_refused", "packets_received")
    try:
        before = _counters(daemons, *names)
        sent = {insider.node_id: 0, stranger.node_id: 0}
        for sender in (insider, stranger):
            for i, d in enumerate(daemons):
                other = daemons[(i + 1) % len(daemons)]
                requests = _requests_naming(sender.node_id, victim.address, d, other, insider)
                packets = [
                    sender.seal(r, recipient=d.node_id) for _ in range(REQUESTS) for r in requests
                ]
                sent[sender.node_id] += sum(map(len, packets))
                sender.send_paced(mesh.address(d), packets, per_second=200)
        count = 2 * 6 * REQUESTS
        for d in daemons:
            wait_until(
                lambda d=d: swim_counter(d, "packets_received")
                - before[d.node_id]["packets_received"] >= count,
                15, f"{d.name} to read every request",
            )  # fmt: skip
        answered = 0
        while (reply := stranger.receive(timeout=2.0)) is not None:
            answered += len(reply)
        assert victim.received == 0, (victim.udp_bytes, victim.connections, victim.tcp_bytes)
        for d in daemons:
            capped = swim_counter(d, "replies_capped") - before[d.node_id]["replies_capped"]
            assert capped >= REQUESTS, (d.name, capped)  # the stranger's, at least
        changes = watch.settled()
        ratio = answered / sent[stranger.node_id]
        print(
            f"pings, syncs and push-pulls naming a victim over UDP: victim received"
            f" {victim.received} bytes; the non-member sent {sent[stranger.node_id]} bytes"
            f" and got {answered} back ({ratio:.2f} per byte)"
        )
        TALLY.add("pings, indirect pings, syncs naming a victim (UDP)",
                  insider.sent + stranger.sent, len(changes),
                  f"victim received {victim.received} bytes; a non-member got"
                  f" {ratio:.2f} bytes back per byte")  # fmt: skip
        assert victim.received == 0, (victim.udp_bytes, victim.connections, victim.tcp_bytes)
        assert answered > 0 and ratio <= 1.0, (answered, sent[stranger.node_id])
        assert changes == []
    finally:
        stranger.close()


def test_pings_and_syncs_over_tcp_never_open_a_connection_to_the_named_address(
    pull_mesh: PullMesh,
) -> None:
    """The same requests as TCP frames, from the insider and from a non-member: the
    non-member's are refused (counted), nobody connects to the victim."""
    mesh, insider, victim = pull_mesh.attack, pull_mesh.insider, pull_mesh.victim
    watch = mesh.watch()
    daemons = pull_mesh.daemons
    stranger = Attacker(STRANGER_HOST, mesh.mesh.authority, seed=86)
    try:
        before = _counters(daemons, "replies_refused", "packets_received")
        for sender in (insider, stranger):
            for i, d in enumerate(daemons):
                other = daemons[(i + 1) % len(daemons)]
                requests = _requests_naming(sender.node_id, victim.address, d, other, insider)
                conn = sender.tcp(mesh.address(d))
                try:
                    for request in requests:
                        sender.send_frame(conn, sender.seal(request, recipient=d.node_id))
                    expected = len(requests) * (1 if sender is insider else 2)
                    wait_until(
                        lambda d=d, n=expected: swim_counter(d, "packets_received")
                        - before[d.node_id]["packets_received"] >= n,
                        15, f"{d.name} to read every frame",
                    )  # fmt: skip
                finally:
                    conn.close()
        assert victim.connections == 0 and victim.received == 0
        for d in daemons:
            refused = swim_counter(d, "replies_refused") - before[d.node_id]["replies_refused"]
            assert refused >= 6, (d.name, refused)  # the stranger's
        changes = watch.settled()
        TALLY.add("pings and syncs naming a victim (TCP frames)", insider.sent + stranger.sent,
                  len(changes), f"victim: {victim.connections} connections")  # fmt: skip
        assert victim.connections == 0 and victim.received == 0
        assert changes == []
    finally:
        stranger.close()


########################################################################################
# Row 5 (last: its hostile member stops answering when done, and is then declared dead)


def test_a_hostile_name_is_refused_and_members_prints_no_escape(pull_mesh: PullMesh) -> None:
    """A second insider signs a record named with escapes, a newline and a forged row:
    every daemon refuses it (a malformed record, counted) and shows the member as
    unverified; `populi-node members` prints one row for it, escaped or not named."""
    mesh = pull_mesh.attack
    daemons = pull_mesh.daemons
    before = {d.node_id: int(d.status()["drops"]["records"]["malformed"]) for d in daemons}
    hostile = Insider(HOSTILE_HOST, mesh.mesh.authority, seed=84, name=HOSTILE_NAME)
    try:
        hostile.start()
        hostile.join(mesh.address(daemons[0]), daemons[0].node_id)
        wait_until(
            lambda: _held_everywhere(mesh, hostile.node_id, verified=None),
            30, "every daemon to hold the hostile member",
        )  # fmt: skip
        for d in daemons:
            row = next(m for m in d.members() if m["node_id"] == hostile.node_id)
            assert row["unverified"] == "malformed" and row["name"].isprintable(), row
            assert int(d.status()["drops"]["records"]["malformed"]) > before[d.node_id]
        shown = subprocess.run(
            [sys.executable, "-m", "populi_p2p.cli", "members",
             "--state-dir", str(daemons[0].state_dir)],
            check=True, capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip
        lines = shown.rstrip("\n").split("\n")
        assert all(line.isprintable() for line in lines), shown
        assert "\x1b" not in shown and not any(line.startswith("ghost") for line in lines)
        members = daemons[0].members()
        assert len(lines) == 1 + len(members), shown  # the header, one row each
        assert sum(hostile.node_id in line for line in lines) == 1
        TALLY.add("a member's signed name with escapes and a forged row", hostile.sent, 0,
                  "refused as malformed; members shows it unverified")  # fmt: skip
    finally:
        hostile.close()
