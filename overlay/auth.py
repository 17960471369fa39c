"""The authentication envelope every UDP packet and TCP frame travels in.

Why every packet is signed: membership is decided by gossip, so one forged "X is dead"
or one replayed "X left" could take a healthy node out of the mesh. The envelope proves
who sent a packet (an Ed25519 signature by a key the cluster authority enrolled), that
it was not changed, and that it is new (a timestamp and a per-sender counter). A
receiver that has never heard of the sender can still verify the packet, because the
envelope can carry the sender's enrollment certificate; one that holds it already (from
an earlier packet, or handed in with `learn` from the sender's verified record) does not
need it, and the sender may leave it out (`overlay.introductions` decides when).

Layout (all integers big-endian; byte by byte in docs/security.md)::

    0    1   kind: 0x01 plain envelope v1, 0x02 SecretBox-wrapped envelope
    1    1   flags: bit 0 CERT (certificate included), bit 1 ADDRESSED (see below)
    2    32  sender Ed25519 public key
    34   8   timestamp, microseconds since the Unix epoch (sender's realtime clock)
    42   8   counter (see below)
    50   2   certificate length L           } only with CERT
    52   L   enrollment certificate bytes    }
    ..   n   payload
    -64  64  Ed25519 signature over b"populi/packet/v1" [+ recipient node id]
             + every byte above

Overhead: 114 bytes, plus 2 + len(certificate) (about 138) with CERT, plus 41
(a kind byte, the 24-byte nonce and the 16-byte MAC) with a cluster secret, where the
whole plain envelope is sealed in a `nacl.secret.SecretBox` behind kind 0x02.

ADDRESSED: the signature also covers the recipient's node id (not sent: the recipient
knows its own), so a packet captured on its way to one node cannot be replayed to
another. Use it whenever the recipient's node id is known (every member); bootstrap
pings to a bare address go without it.

The counter is seeded from the sender's realtime clock in microseconds at its first
packet and then counts up by one per packet. Dense counters keep the receiver's window
meaningful (1024 counters = 1024 packets), and seeding from the clock makes a restarted
sender's counters start above everything it sent before (it would have to have sent a
million packets per second to catch up with the clock), with no state on disk. A sender
whose clock stepped back across a restart is refused as `replayed` by receivers that
remember it until its last packet's timestamp goes stale (`freshness`); a daemon that
cares can persist `last_counter` and pass it back as `counter_floor`.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Hashable
from typing import Final, Literal

import attrs
import nacl.exceptions
import nacl.secret

from overlay.admission import AdmissionGate, DropCounters
from overlay.replay import ReplayTable
from overlay.verifier import (
    NODE_ID_LENGTH,
    SIGNATURE_BYTES,
    CredentialError,
    PacketSigner,
    PeerCredential,
    PeerVerifier,
)

__all__ = [
    "AUTH_REASONS",
    "DEFAULT_MAX_PACKET_SIZE",
    "AuthError",
    "AuthReason",
    "AuthStatistics",
    "ClockSkew",
    "Opened",
    "PacketAuthenticator",
]

#: Kind byte of a plain envelope, format version 1. ONLY APPEND new kinds.
KIND_PLAIN_V1: Final = 0x01
#: Kind byte of a SecretBox-wrapped plain envelope.
KIND_SECRETBOX_V1: Final = 0x02
#: Flag: the envelope carries the sender's enrollment certificate.
FLAG_CERT: Final = 0x01
#: Flag: the signature also covers the recipient's node id.
FLAG_ADDRESSED: Final = 0x02
_KNOWN_FLAGS: Final = FLAG_CERT | FLAG_ADDRESSED
#: Signature context (never sent: a signature made for one purpose is useless for another).
PACKET_CONTEXT: Final = b"populi/packet/v1"
_HEADER: Final = struct.Struct(">BB32sQQ")
_CERT_LENGTH: Final = struct.Struct(">H")
#: Bytes added to every payload, without certificate and cluster secret.
BASE_OVERHEAD: Final = _HEADER.size + SIGNATURE_BYTES
#: Bytes a cluster secret adds: kind byte, nonce, MAC.
SECRETBOX_OVERHEAD: Final = 1 + nacl.secret.SecretBox.NONCE_SIZE + nacl.secret.SecretBox.MACBYTES
#: A sender's counter must leap this much further than its clock moved (microseconds)
#: to count as a restart: a second's worth, which no sender's packet rate comes near.
RESTART_SLACK: Final = 1_000_000
#: How far above a known sender's highest counter a packet still "continues" its
#: window (see `AdmissionGate`): the packets it may send to others between two to us.
CONTINUATION_REACH: Final = 1 << 16
#: Refusals that cost a certificate or signature check; only these charge a budget.
_COSTLY: Final = frozenset({"bad_signature", "bad_certificate", "revoked"})
#: Members whose clock-skew evidence is kept (see `PacketAuthenticator.clock_skews`).
MAX_SKEW_REPORTS: Final = 256
#: Default allowed difference, either way, between a packet's timestamp and our clock.
DEFAULT_FRESHNESS: Final = 120.0
#: Largest datagram accepted by default; the swim packet budget is this minus overhead.
DEFAULT_MAX_PACKET_SIZE: Final = 1400

AuthReason = Literal[
    "too_large",
    "malformed",
    "bad_version",
    "unknown_sender",
    "bad_signature",
    "replayed",
    "stale",
    "bad_certificate",
    "revoked",
    "decrypt_failed",
    "rate_limited",
]
#: Every reason a packet is dropped for, in a fixed order (for counters and status).
#: `rate_limited`: the `AdmissionGate` refused to spend a signature check on it.
AUTH_REASONS: Final[tuple[AuthReason, ...]] = (
    "too_large",
    "malformed",
    "bad_version",
    "unknown_sender",
    "bad_signature",
    "replayed",
    "stale",
    "bad_certificate",
    "revoked",
    "decrypt_failed",
    "rate_limited",
)


class AuthError(Exception):
    """A packet failed authentication. Drop it (it is already counted), never crash.

    `reason` is one of `AUTH_REASONS`; `str()` adds a detail for debug logs. A `stale`
    refusal carries `skew`: seconds the packet's timestamp is ahead of our clock
    (negative: behind), for the node's "check its clock" report.
    """

    def __init__(self, reason: AuthReason, detail: str = "", *, skew: float | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason: AuthReason = reason
        self.skew = skew


@attrs.frozen
class Opened:
    """An authenticated packet: who sent it, and what it says."""

    sender_node_id: str
    sender_public_key: bytes
    payload: bytes
    #: The sender's (verified) credential: in populi an `EnrollmentCertificate`, with its
    #: scope, serial and expiry.
    certificate: PeerCredential = attrs.field(repr=False)
    #: The sender's signed timestamp, Unix seconds.
    sent_at: float
    #: The sender's packet counter.
    counter: int
    #: Whether the sender bound the packet to this node (see ADDRESSED in the module doc).
    addressed: bool
    #: The first packet we see from this sender key, or one whose counter leapt ahead
    #: of its clock (the sender restarted): either way it may not hold our certificate.
    new_session: bool = False


@attrs.frozen
class ClockSkew:
    """Signed evidence that a member's realtime clock is off: its packets were refused.

    The node logs it once and shows it in `status` (`describe()` is the sentence).
    """

    node_id: str
    #: The sender's clock minus ours, seconds, from its last refused packet (positive:
    #: it is ahead of us). Beyond `freshness` either way, its packets are refused.
    offset: float
    #: Signed packets refused as stale since it was last accepted (or first seen).
    packets: int
    #: Our realtime when the last one arrived, Unix seconds.
    seen_at: float

    def describe(self) -> str:
        """One line for the log and `status`, with the fix."""
        way = "in the future" if self.offset > 0 else "in the past"
        return (
            f"packets from {self.node_id} are {abs(self.offset):.0f} s {way}: check its clock (NTP)"
        )


@attrs.frozen
class AuthStatistics:
    """A snapshot for `status`: table sizes and drops by reason."""

    #: Senders whose replay windows are remembered.
    senders: int
    #: Verified certificates cached.
    certificates: int
    #: Packets refused by `open`, by reason.
    drops: dict[str, int]


def _recipient_context(recipient: str | None) -> bytes:
    if recipient is None:
        return PACKET_CONTEXT
    return PACKET_CONTEXT + recipient.encode("ascii")


class PacketAuthenticator:
    """Seals outgoing packets and opens incoming ones for one node.

    Pure: no I/O, no clock (realtime is passed in), state bounded by `max_senders` and
    `max_certificates`. Open packets are counted by reason in `drops`. Knows nothing of
    certificates itself: it is handed a `signer` and a `verifier` (`overlay/verifier.py`;
    populi's are `populi_p2p.trust.envelope_keys.EnvelopeKeys`).

    Args:
        signer: this node's key and credential (sent with CERT).
        verifier: checks senders' credentials and signatures.
        cluster_secret: 32 bytes to seal every packet in a SecretBox, or None.
        max_packet_size: largest packet `open` accepts unless told otherwise.
        freshness: the allowed clock skew: seconds a packet's timestamp may differ from
            our clock, either way (default `DEFAULT_FRESHNESS`, 120 s). Packets beyond
            it are refused as `stale`, and signed ones leave `clock_skews` evidence.
        replay_window: counters below a sender's highest that may still arrive.
        max_senders: senders whose replay windows are remembered.
        max_certificates: verified credentials cached (by sender key, exact bytes).
        counter_floor: the first counter used is at least this (see module doc).
        gate: decides which packets earn a signature check (`open` with a `source`).

    Raises:
        ValueError: the signer's credential is too large, or a bad secret length.
    """

    def __init__(
        self,
        signer: PacketSigner,
        verifier: PeerVerifier,
        *,
        cluster_secret: bytes | None = None,
        max_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
        freshness: float = DEFAULT_FRESHNESS,
        replay_window: int = 1024,
        max_senders: int = 4096,
        max_certificates: int = 4096,
        counter_floor: int = 0,
        gate: AdmissionGate | None = None,
    ) -> None:
        if len(signer.credential) > 0xFFFF:
            raise ValueError("the certificate is too large for the envelope")
        if cluster_secret is not None and len(cluster_secret) != nacl.secret.SecretBox.KEY_SIZE:
            raise ValueError(f"a cluster secret is {nacl.secret.SecretBox.KEY_SIZE} bytes")
        self.signer = signer
        self.verifier = verifier
        self._certificate = signer.credential
        self._box = None if cluster_secret is None else nacl.secret.SecretBox(cluster_secret)
        self.max_packet_size = max_packet_size
        self._replay = ReplayTable(
            window=replay_window,
            freshness_us=int(freshness * 1_000_000),
            max_senders=max_senders,
        )
        self._certs: OrderedDict[bytes, PeerCredential] = OrderedDict()
        #: Keys whose cached credential came from `learn` only: no packet of theirs
        #: has authenticated yet, so the gate still treats them as unknown senders.
        self._learned: set[bytes] = set()
        #: Per sender key: the highest counter and its timestamp (see `_session`).
        self._sessions: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        self._max_certs = max_certificates
        self._counter_floor = counter_floor
        self._counter: int | None = None
        self._skews: OrderedDict[str, ClockSkew] = OrderedDict()
        self.gate = gate if gate is not None else AdmissionGate()
        #: Packets refused by `open`, by reason (see `AUTH_REASONS`).
        self.drops = DropCounters(AUTH_REASONS)

    ####################################################################################
    # Sending
    ####################################################################################

    def overhead(self, *, include_certificate: bool = True) -> int:
        """Exactly how many bytes `seal` adds to a payload with these options."""
        size = BASE_OVERHEAD
        if include_certificate:
            size += _CERT_LENGTH.size + len(self._certificate)
        if self._box is not None:
            size += SECRETBOX_OVERHEAD
        return size

    def statistics(self) -> AuthStatistics:
        return AuthStatistics(len(self._replay), len(self._certs), self.drops.as_dict())

    @property
    def last_counter(self) -> int | None:
        """The counter of the last sealed packet (persist it to survive clock steps)."""
        return self._counter

    def seal(
        self,
        payload: bytes,
        now_real: float,
        *,
        recipient: str | None = None,
        include_certificate: bool = True,
    ) -> bytes:
        """Wrap `payload` in a signed (and, with a cluster secret, encrypted) envelope.

        Args:
            payload: the bytes to send (a swim packet or a TCP frame).
            now_real: realtime, Unix seconds.
            recipient: the recipient's node id, to bind the packet to it (ADDRESSED).
            include_certificate: carry our certificate, so a receiver that does not
                know us yet can verify the packet (CERT). Leave it on unless the
                recipient is known to have our certificate: without it, a receiver
                that never saw it refuses the packet as `unknown_sender`.

        Returns:
            The packet, `len(payload) + overhead(...)` bytes.
        """
        timestamp_us = int(now_real * 1_000_000)
        if self._counter is None:
            self._counter = max(self._counter_floor, timestamp_us)
        else:
            self._counter += 1
        flags = 0
        if include_certificate:
            flags |= FLAG_CERT
        if recipient is not None:
            if len(recipient) != NODE_ID_LENGTH or not recipient.isascii():
                raise ValueError(f"recipient must be a node id, got {recipient!r}")
            flags |= FLAG_ADDRESSED
        parts = [
            _HEADER.pack(KIND_PLAIN_V1, flags, self.signer.public_key, timestamp_us, self._counter)
        ]
        if include_certificate:
            parts += [_CERT_LENGTH.pack(len(self._certificate)), self._certificate]
        parts.append(payload)
        body = b"".join(parts)
        envelope = body + self.signer.sign(_recipient_context(recipient), body)
        if self._box is None:
            return envelope
        return bytes([KIND_SECRETBOX_V1]) + bytes(self._box.encrypt(envelope))

    ####################################################################################
    # Receiving
    ####################################################################################

    def open(
        self,
        packet: bytes,
        now_real: float,
        *,
        max_size: int | None = None,
        source: Hashable | None = None,
    ) -> Opened:
        """Authenticate a received packet.

        Checks run cheapest first (size, format, freshness, replay window, certificate
        cache) so that junk costs no signature check; then `gate` decides whether the
        packet earns one (refused as `rate_limited` if not). State (replay window,
        certificate cache) changes only after the signature verified.

        Args:
            packet: the bytes as received.
            now_real: realtime, Unix seconds.
            max_size: overrides `max_packet_size` (for TCP frames).
            source: the source address's rate-limiting key (`source_key`), or None.

        Raises:
            AuthError: the only exception, for any input; already counted in `drops`.
        """
        try:
            return self._open(packet, now_real, max_size, source)
        except AuthError as exc:
            self.drops.add(exc.reason)
            raise

    def _unwrap(self, packet: bytes) -> bytes:
        kind = packet[0]
        if kind == KIND_SECRETBOX_V1:
            if self._box is None:
                raise AuthError("decrypt_failed", "encrypted packet, but no cluster secret here")
            try:
                envelope = bytes(self._box.decrypt(packet[1:]))
            except (nacl.exceptions.CryptoError, ValueError, TypeError):
                raise AuthError("decrypt_failed", "not sealed with our cluster secret") from None
            if not envelope or envelope[0] != KIND_PLAIN_V1:
                raise AuthError("bad_version", "unknown envelope inside the secret box")
            return envelope
        if kind == KIND_PLAIN_V1:
            if self._box is not None:
                raise AuthError("decrypt_failed", "plain packet, but this cluster needs the secret")
            return packet
        raise AuthError("bad_version", f"unknown packet kind {kind:#04x}")

    def _open(
        self, packet: bytes, now_real: float, max_size: int | None, source: Hashable | None
    ) -> Opened:
        limit = self.max_packet_size if max_size is None else max_size
        if len(packet) > limit:
            raise AuthError("too_large", f"{len(packet)} bytes, limit {limit}")
        if not packet:
            raise AuthError("malformed", "empty packet")
        envelope = self._unwrap(packet)
        if len(envelope) < BASE_OVERHEAD:
            raise AuthError("malformed", f"{len(envelope)} bytes is shorter than any envelope")
        _, flags, sender, timestamp_us, counter = _HEADER.unpack_from(envelope)
        if flags & ~_KNOWN_FLAGS:
            raise AuthError("malformed", f"unknown flags {flags:#04x}")
        now_us = int(now_real * 1_000_000)
        verdict = self._replay.check(sender, counter, timestamp_us, now_us)
        if verdict == "stale":
            self._note_skew(envelope, flags, sender, timestamp_us, now_real, source)
        if verdict is not None:
            skew = timestamp_us / 1_000_000 - now_real if verdict == "stale" else None
            raise AuthError(verdict, f"counter {counter}, timestamp {timestamp_us}", skew=skew)

        known = self._known(sender)
        continues = known and self._replay.continues(sender, counter, now_us, CONTINUATION_REACH)
        if not self.gate.admit(source, sender, known=known, continues=continues, now=now_real):
            raise AuthError("rate_limited", f"claims {sender.hex()}")
        try:
            cert, offset, addressed = self._authenticate(envelope, flags, sender, now_real)
        except AuthError as exc:
            if exc.reason in _COSTLY:
                self.gate.failed(source, sender, known=known, now=now_real)
            raise

        # Authenticated: only now may the packet change state.
        self._replay.commit(sender, counter, timestamp_us, now_us)
        new_session = self._session(sender, counter, timestamp_us)
        self._remember(sender, cert)
        self._skews.pop(cert.node_id, None)  # its clock agrees with ours again
        return Opened(
            sender_node_id=cert.node_id,
            sender_public_key=sender,
            payload=envelope[offset:-SIGNATURE_BYTES],
            certificate=cert,
            sent_at=timestamp_us / 1_000_000,
            counter=counter,
            addressed=addressed,
            new_session=new_session,
        )

    def _note_skew(
        self,
        envelope: bytes,
        flags: int,
        sender: bytes,
        timestamp_us: int,
        now_real: float,
        source: Hashable | None,
    ) -> None:
        """Keep signed evidence that `sender`'s clock is off (see `clock_skews`).

        The timestamp is only believed once the signature verifies, so nobody can make us
        blame a member's clock. Each check spends the gate's budget even when it passes
        (a stale packet is refused anyway), so replayed old packets cost little.
        """
        known = self._known(sender)
        if not self.gate.admit(source, sender, known=known, continues=False, now=now_real):
            return
        self.gate.failed(source, sender, known=known, now=now_real)
        try:
            cert, _, _ = self._authenticate(envelope, flags, sender, now_real)
        except AuthError:
            return
        previous = self._skews.pop(cert.node_id, None)
        self._skews[cert.node_id] = ClockSkew(
            node_id=cert.node_id,
            offset=timestamp_us / 1_000_000 - now_real,
            packets=1 if previous is None else previous.packets + 1,
            seen_at=now_real,
        )
        while len(self._skews) > MAX_SKEW_REPORTS:
            self._skews.popitem(last=False)

    def clock_skews(self) -> dict[str, ClockSkew]:
        """Members whose signed packets we refused as stale, by node id, oldest first.

        Each entry is the latest evidence: `offset` is the sender's clock minus ours,
        seconds (positive: it is ahead). An entry goes when a packet from that member
        is accepted again. Bounded to `MAX_SKEW_REPORTS` members.
        """
        return dict(self._skews)

    def _authenticate(
        self, envelope: bytes, flags: int, sender: bytes, now_real: float
    ) -> tuple[PeerCredential, int, bool]:
        """Check the certificate and the signature; change nothing.

        Returns:
            The sender's certificate, where the payload starts, and whether ADDRESSED.
        """
        offset = _HEADER.size
        cached = self._certs.get(sender)
        if flags & FLAG_CERT:
            if len(envelope) < offset + _CERT_LENGTH.size + SIGNATURE_BYTES:
                raise AuthError("malformed", "truncated certificate length")
            (cert_length,) = _CERT_LENGTH.unpack_from(envelope, offset)
            offset += _CERT_LENGTH.size
            if len(envelope) < offset + cert_length + SIGNATURE_BYTES:
                raise AuthError("malformed", "truncated certificate")
            cert_bytes = envelope[offset : offset + cert_length]
            offset += cert_length
            if cached is None or cached.raw != cert_bytes:
                try:
                    cached = self.verifier.load(cert_bytes)
                except CredentialError as exc:
                    raise AuthError(exc.reason, str(exc)) from None
        elif cached is None:
            raise AuthError("unknown_sender", f"no certificate known for {sender.hex()}")
        cert = cached
        try:
            self.verifier.admit(cert, sender, now_real)
        except CredentialError as exc:
            raise AuthError(exc.reason, str(exc)) from None

        body, signature = envelope[:-SIGNATURE_BYTES], envelope[-SIGNATURE_BYTES:]
        addressed = bool(flags & FLAG_ADDRESSED)
        context = _recipient_context(self.signer.node_id if addressed else None)
        if not self.verifier.verify(sender, context, body, signature):
            raise AuthError("bad_signature", f"from {sender.hex()}")
        return cert, offset, addressed

    def _session(self, sender: bytes, counter: int, timestamp_us: int) -> bool:
        """Whether this packet starts a new session of `sender` (see `Opened`).

        A running sender's counter grows by one per packet, far slower than its
        microsecond clock; a restarted one seeds its counter from that clock, so the
        counter leaps ahead by about the previous run's age (less what it sent). A leap
        beyond the time elapsed plus `RESTART_SLACK` is a restart; a run shorter than
        the slack goes unnoticed. Kept per sender key, bounded like the certificates,
        and unlike the replay windows not forgotten when a sender is silent for long.
        """
        sessions = self._sessions
        last = sessions.get(sender)
        if last is None:
            new = True
            last_counter = counter
        else:
            last_counter, last_us = last
            new = counter - last_counter > max(0, timestamp_us - last_us) + RESTART_SLACK
            sessions.move_to_end(sender)
        if new or counter >= last_counter:
            sessions[sender] = (counter, timestamp_us)
        while len(sessions) > self._max_certs:
            sessions.popitem(last=False)
        return new

    def _known(self, sender: bytes) -> bool:
        """Whether the gate judges `sender` by its name: a packet of its verified here.

        A credential that only `learn` put in the cache does not count: until the
        sender's first packet authenticates, packets naming it are judged by their
        source address, exactly as before its credential was learned, so forgeries in
        its name cannot drain a budget its own first packets need (docs/security.md).
        """
        return sender in self._certs and sender not in self._learned

    def learn(self, public_key: bytes, credential: bytes, now_real: float) -> bool:
        """Cache a sender's credential that reached us some other way than a packet.

        populi hands in the certificate of every member whose signed record verified
        (a record carries its node's certificate), so that member's packets open
        without CERT from the first one on: a peer that holds our record needs no
        introduction (see `overlay.introductions`). The credential is checked here as
        if it came in a packet (`verifier.load`, then `verifier.admit` for
        `public_key`); each packet is still admitted and its signature checked. A
        credential already cached with the same bytes costs nothing.

        Returns:
            Whether it is cached now (False: refused, nothing changed).
        """
        cached = self._certs.get(public_key)
        if cached is None or cached.raw != credential:
            try:
                cached = self.verifier.load(credential)
                self.verifier.admit(cached, public_key, now_real)
            except CredentialError:
                return False
            if public_key not in self._certs:
                self._learned.add(public_key)
        self._store(public_key, cached)
        return True

    def _remember(self, sender: bytes, cert: PeerCredential) -> None:
        self._learned.discard(sender)
        self._store(sender, cert)

    def _store(self, sender: bytes, cert: PeerCredential) -> None:
        self._certs[sender] = cert
        self._certs.move_to_end(sender)
        while len(self._certs) > self._max_certs:
            evicted, _ = self._certs.popitem(last=False)
            self._learned.discard(evicted)
