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
import time
from pathlib import Path
from typing import Any

import attrs

from overlay.auth import PacketAuthenticator
from populi_p2p.authority import ClusterAuthority
from populi_p2p.envelope_keys import packet_authenticator
from populi_p2p.identity import NodeIdentity
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
