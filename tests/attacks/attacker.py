"""An in-test attacker for the standing attack suite (issue 7), and the suite's tally.

`Attacker` crafts what an attacker on loopback can send: raw datagrams and TCP frames,
envelopes sealed with an enrolled key (an insider), a rogue authority's key, an expired
certificate or none at all, replays of bytes it sealed or captured earlier, and packets
from a member's own address (it binds to the victim's 127.x address with another port:
the "spoofed source" of the issue). Every datagram and frame it sends is counted in
`sent`, so each test can report how many packets it tried.

`Tally` collects, per attack, the packets sent and the membership changes seen; the
suite's conftest writes it to ``$POPULI_ATTACK_REPORT`` (JSON) when that is set, which
is where the figures in docs/security.md ("Attack suite") come from.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import attrs

from overlay.auth import PacketAuthenticator
from populi_p2p.leases import agent_wire
from populi_p2p.leases.agent_wire import AgentMessage
from populi_p2p.leases.driver.service import LEASE_CONTEXT
from populi_p2p.leases.wire import DecodeError as LeaseDecodeError
from populi_p2p.services.app_channel import AppKind
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.certificate import EnrollmentCertificate, read_certificate
from populi_p2p.trust.envelope_keys import packet_authenticator
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.record import (
    RECORD_CONTEXT,
    Capabilities,
    NodeRecord,
    NodeStatus,
    next_sequence,
)
from swim import PROTOCOL_VERSION as SWIM_PROTOCOL_VERSION
from swim import wire

Address = tuple[str, int]


def split_address(text: str) -> Address:
    """``"127.0.0.11:7950"`` -> ``("127.0.0.11", 7950)``."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def frame(payload: bytes) -> bytes:
    """One TCP frame: 4-byte big-endian length, then the payload."""
    return struct.pack(">I", len(payload)) + payload


class Attacker:
    """A key, a certificate (or none) and a UDP socket bound to `host`.

    Args:
        host: the address to send from (a member's address forges its source).
        authority: who enrolls the key: the cluster's (an insider), another (a rogue),
            or None (no certificate at all; sealed packets then carry none).
        issued_at: the certificate's issue time (realtime); in the past with a short
            `expires_in`, the certificate is expired.
        expires_in: the certificate's validity, seconds (None: no expiry).
        seed: the RNG seed for junk, so a failing run can be replayed.
    """

    def __init__(
        self,
        host: str,
        authority: ClusterAuthority | None,
        *,
        issued_at: float | None = None,
        expires_in: float | None = None,
        seed: int = 7,
    ) -> None:
        self.host = host
        self.identity = NodeIdentity.generate()
        self.rng = random.Random(seed)
        self.sent = 0
        # Without an authority, a throwaway one signs a certificate that is never sent.
        signer = authority if authority is not None else ClusterAuthority.generate()
        now = time.time() if issued_at is None else issued_at
        cert = signer.enroll(self.identity.public_key, expires_in=expires_in, now=now)
        self.certificate = cert.raw if authority is not None else b""
        self.auth: PacketAuthenticator = packet_authenticator(
            self.identity, cert.raw, signer.public_key
        )
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(5.0)

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    @property
    def public_key(self) -> bytes:
        return self.identity.public_key

    @property
    def address(self) -> Address:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def close(self) -> None:
        self.sock.close()

    ####################################################################################
    # Crafting

    def seal(
        self,
        *messages: wire.Message,
        recipient: str | None = None,
        clock_offset: float = 0.0,
    ) -> bytes:
        """A sealed swim packet of `messages`; `clock_offset` skews our timestamp."""
        return self.auth.seal(
            wire.encode(*messages),
            time.time() + clock_offset,
            recipient=recipient,
            include_certificate=bool(self.certificate),
        )

    def ping(self, target_id: str, seq: int = 1, **options: Any) -> bytes:
        """A sealed Ping of `target_id`, answered to our socket."""
        return self.seal(wire.Ping(seq, target_id, self.node_id, self.address), **options)

    def forged_in_name_of(self, public_key: bytes) -> bytes:
        """An envelope that names `public_key` as sender: plausible header, random signature."""
        body = bytes([0x01, 0x02]) + public_key
        body += struct.pack(">QQ", int(time.time() * 1_000_000), self.rng.getrandbits(63))
        return body + self.rng.randbytes(20) + self.rng.randbytes(64)

    def lean_in_name_of(self, public_key: bytes, recipient: str, *messages: wire.Message) -> bytes:
        """A well-formed envelope naming `public_key` as sender, without its certificate
        (the receiver holds it from the member's record), addressed to `recipient` and
        properly signed, but by our key: what a member would send, forged."""
        from overlay.auth import FLAG_ADDRESSED, KIND_PLAIN_V1, PACKET_CONTEXT

        counter = self.rng.getrandbits(62)
        header = struct.pack(
            ">BB32sQQ", KIND_PLAIN_V1, FLAG_ADDRESSED, public_key, int(time.time() * 1e6), counter
        )
        body = header + wire.encode(*messages)
        return body + self.identity.sign(PACKET_CONTEXT + recipient.encode("ascii"), body)

    def junk(self, size: int) -> bytes:
        return self.rng.randbytes(size)

    ####################################################################################
    # Sending and receiving

    def send(self, target: Address, data: bytes) -> None:
        self.sock.sendto(data, target)
        self.sent += 1

    def send_paced(self, target: Address, packets: list[bytes], per_second: float) -> None:
        """Send `packets` at about `per_second`, so the receiver's socket never overflows
        and every one of them can be counted (pacing, not synchronisation)."""
        start = time.monotonic()
        for i, data in enumerate(packets):
            self.send(target, data)
            delay = start + (i + 1) / per_second - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def receive(self, timeout: float = 5.0) -> bytes | None:
        """The next datagram sent to us, or None after `timeout` seconds."""
        self.sock.settimeout(timeout)
        try:
            data, _ = self.sock.recvfrom(65536)
        except TimeoutError:
            return None
        return data

    def tcp(self, target: Address, timeout: float = 5.0) -> socket.socket:
        """A TCP connection from our host (any port) to `target`."""
        conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        conn.settimeout(timeout)
        conn.bind((self.host, 0))
        conn.connect(target)
        return conn

    def send_frame(self, conn: socket.socket, payload: bytes) -> None:
        conn.sendall(frame(payload))
        self.sent += 1


########################################################################################
# The tally


@attrs.define
class AttackRecord:
    attack: str
    packets: int
    state_changes: int
    note: str = ""


@attrs.define
class Tally:
    """What the suite tried: one record per attack."""

    records: list[AttackRecord] = attrs.field(factory=list)

    def add(self, attack: str, packets: int, state_changes: int, note: str = "") -> None:
        self.records.append(AttackRecord(attack, packets, state_changes, note))

    def write(self, path: Path) -> None:
        rows = [attrs.asdict(r) for r in self.records]
        totals = {
            "attacks": len(rows),
            "packets": sum(r.packets for r in self.records),
            "state_changes": sum(r.state_changes for r in self.records),
        }
        path.write_text(json.dumps({"attacks": rows, "totals": totals}, indent=2) + "\n")


#: The session's tally (written by conftest.py at the end of the session).
TALLY = Tally()


########################################################################################
# An insider that is a member


class Insider(Attacker):
    """An enrolled attacker that joined the mesh as a member: its signed record (status
    draining, so no work is placed on it) is in every daemon's roster, so the lease
    agents verify the messages it signs. A thread answers the daemons' probes (it stays
    alive, so its record stays trusted) and keeps the agent messages sent to it.

    Packets are sealed under a lock: the responder thread seals acks while the test
    thread seals attacks, and one authenticator's counter must not be used twice.
    """

    def __init__(
        self, host: str, authority: ClusterAuthority, *, seed: int = 7, name: str = "insider"
    ) -> None:
        super().__init__(host, authority, seed=seed)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.inbox: list[tuple[str, Any]] = []  # (sender, agent message) received
        self.acked = 0
        #: Datagrams received, those that did not open or decode, and the last error
        #: the responder survived (for a failing test's message).
        self.received = 0
        #: Our incarnation: raised to refute a suspicion, as a member does.
        self.incarnation = 1
        self.refuted = 0
        self._record = b""
        self.unopened = 0
        self.errors: list[str] = []
        #: The name our record gives (the hostile-name attack signs one no daemon
        #: would build: see `record`).
        self.name = name
        #: Full records (`Alive`) received, and the bytes of the datagrams that carried
        #: them (as sealed on the wire, and as the swim payload inside).
        self.alives_received = 0
        self.alive_datagram_bytes = 0
        self.alive_payload_bytes = 0

    def lease_sign(self, data: bytes) -> bytes:
        """What `LeaseService` signs with: the lease context, our key."""
        return self.identity.sign(LEASE_CONTEXT, data)

    def record(self) -> bytes:
        """Our signed NodeRecord (draining: placement never picks us).

        Signed from the record's own encoding, with `name` set after the checks: a
        modified daemon signs whatever name it likes, printable or not.
        """
        host, port = self.address
        record = NodeRecord(
            node_id=self.node_id, public_key=self.public_key, name="insider",
            address=host, port=port, software_version="0.1.0",
            protocol_version=int(SWIM_PROTOCOL_VERSION), started_at=time.time(),
            sequence=next_sequence(None, time.time()), status=NodeStatus.DRAINING,
            capabilities=Capabilities(cpu_cores=1, ram_bytes=1 << 30),
            certificate=self.certificate,
        )  # fmt: skip
        object.__setattr__(record, "name", self.name)  # past NodeRecord's own checks
        body = record.encode_body()
        return body + self.identity.sign(RECORD_CONTEXT, body)

    def seal(self, *messages: wire.Message, **options: Any) -> bytes:
        with self._lock:
            return super().seal(*messages, **options)

    def learn_certificates(self, state_dirs: list[Path], authority_key: bytes) -> None:
        """Hold the members' certificates, as a member does from their verified records
        (a daemon stops sending its certificate to a peer that addressed it a packet:
        without them our responder could not open the answers it waits for)."""
        for state in state_dirs:
            raw = read_certificate(state / "node.cert")
            cert = EnrollmentCertificate.from_bytes(raw, authority_key)
            assert self.auth.learn(cert.node_public_key, raw, time.time()), state

    def join(self, target: Address, target_id: str) -> None:
        """Announce ourselves (Alive with our record) to one member; gossip does the rest."""
        self._record = self.record()
        alive = wire.Alive(self.node_id, self.incarnation, self.address, self._record)
        self.send(target, self.seal(alive, recipient=target_id))

    def agent(self, message: AgentMessage, *, source: str | None = None) -> wire.App:
        """A swim App message carrying `message` (`AppKind.LEASE_AGENT`), in our name
        unless the App names another `source`. (Our envelope signs the packet either
        way; an agent message names no sender of its own.)"""
        body = agent_wire.encode(message)
        return wire.App(source or self.node_id, "", bytes([AppKind.LEASE_AGENT]) + body)

    def leases(self, delta: bytes, key: str = "x") -> wire.App:
        """A swim App message carrying a lease-table delta (`AppKind.LEASES`)."""
        return wire.App(self.node_id, key, bytes([AppKind.LEASES]) + delta)

    def send_apps(
        self, target: Address, target_id: str, apps: list[wire.App], *, per_packet: int = 4,
        per_second: float = 400.0,
    ) -> int:  # fmt: skip
        """Send `apps`, `per_packet` to a datagram, paced; the number of datagrams."""
        packets = [
            self.seal(*apps[i : i + per_packet], recipient=target_id)
            for i in range(0, len(apps), per_packet)
        ]
        assert all(len(p) <= 1400 for p in packets), "an attack packet over one datagram"
        self.send_paced(target, packets, per_second)
        return len(packets)

    ####################################################################################
    # The responder

    def start(self) -> None:
        self._thread = threading.Thread(target=self._respond, name="insider", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        super().close()

    def agent_messages(self, kind: type) -> list[tuple[str, Any]]:
        return [(s, m) for s, m in list(self.inbox) if isinstance(m, kind)]

    def diagnose(self) -> str:
        """What the responder saw: for the message of a test that waited in vain."""
        kinds: dict[str, int] = {}
        for _, m in list(self.inbox):
            kinds[type(m).__name__] = kinds.get(type(m).__name__, 0) + 1
        alive = self._thread is not None and self._thread.is_alive()
        return (
            f"responder alive={alive}, datagrams={self.received}, unopened={self.unopened}"
            f" (auth drops {self.auth.drops.as_dict()}), acked={self.acked},"
            f" refuted={self.refuted}, inbox={kinds},"
            f" errors={self.errors[-3:]}"
        )

    def _respond(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data, source = self.sock.recvfrom(65536)
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set() or self.sock.fileno() < 0:
                    return
                self.errors.append(f"recvfrom: {exc!r}")  # e.g. an ICMP error: go on
                continue
            self.received += 1
            try:
                self._handle(data, source)
            except Exception as exc:  # the responder must outlive anything it is sent
                self.errors.append(repr(exc))

    def _handle(self, data: bytes, source: Address) -> None:
        try:
            opened = self.auth.open(data, time.time())
            messages = wire.decode_packet(opened.payload)
        except Exception:  # not ours to judge: skip it
            self.unopened += 1
            return
        alives = sum(isinstance(m, wire.Alive) for m in messages)
        if alives:
            self.alives_received += alives
            self.alive_datagram_bytes += len(data)
            self.alive_payload_bytes += len(opened.payload)
        for message in messages:
            if isinstance(message, wire.Ping) and message.target == self.node_id:
                ack = self.seal(wire.Ack(message.seq), recipient=opened.sender_node_id)
                self.sock.sendto(ack, message.source_address)
                self.acked += 1
            elif isinstance(message, (wire.Suspect, wire.Dead)) and message.name == self.node_id:
                # A late ack on a loaded machine: refute, as a member does, so that
                # our record stays trusted for the rest of the module.
                if message.incarnation >= self.incarnation and self._record:
                    self.incarnation = message.incarnation + 1
                    alive = wire.Alive(self.node_id, self.incarnation, self.address, self._record)
                    self.sock.sendto(self.seal(alive, recipient=opened.sender_node_id), source)
                    self.refuted += 1
            elif isinstance(message, wire.App) and message.payload[:1] == bytes(
                [AppKind.LEASE_AGENT]
            ):
                try:
                    got = agent_wire.decode(message.payload[1:])
                except LeaseDecodeError:
                    continue
                self.inbox.append((message.source, got))
