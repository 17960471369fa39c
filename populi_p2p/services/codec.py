"""Packet admission: seals what the node sends and opens what it receives.

The driver's `PacketCodec`. Kept apart from the services so the driver, the tests and
the benchmarks can use it without a node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from overlay.admission import source_key
from overlay.auth import AuthError, PacketAuthenticator
from overlay.base import Address, format_address
from overlay.inbox import BULK, URGENT, Incoming
from overlay.introductions import Introductions
from swim.wire import answers_a_probe

from .._log import event, get_logger
from .clock import stale_skew

__all__ = ["CONTROL_PREFIX", "CONTROL_REVOCATIONS", "WIRE_PACKET_BUDGET", "AuthCodec", "lane"]

#: Bytes a sealed datagram may occupy on the wire. Below WireGuard's 1420-byte MTU less
#: IPv6 and UDP headers, so an overlay never fragments protocol packets.
WIRE_PACKET_BUDGET: Final = 1350
#: First byte of a populi control message inside an authenticated envelope. swim
#: packets start with their protocol version byte, which is never 0xFF.
CONTROL_PREFIX: Final = b"\xff"
#: Control message kinds (second byte). ONLY APPEND; values are part of the protocol.
CONTROL_REVOCATIONS: Final = b"R"

_log = get_logger("node")


def lane(payload: bytes) -> int:
    """Inbox lane for a raw (still sealed) payload: big frames are state exchange.

    Runs on unauthenticated bytes, so it only looks at the size: every protocol packet
    (probe, ack, suspicion, refute) fits a datagram, push-pull state does not.
    """
    return BULK if len(payload) > WIRE_PACKET_BUDGET else URGENT


class AuthCodec:
    """Seals outgoing payloads and opens incoming packets (the driver's `PacketCodec`).

    Which packets earn a signature check is the authenticator's `AdmissionGate`: junk
    forged from a member's address never costs that member its packets; every drop is counted
    by reason in the authenticator's `drops`. Our certificate rides only in packets to
    peers that may not know us (`introductions`, fed by the node's membership events
    and by senders that start a new session).
    """

    def __init__(
        self,
        auth: PacketAuthenticator,
        max_frame_size: int,
        on_control: Callable[[bytes], None] = lambda _: None,
        *,
        on_stale: Callable[[Address, float], None] = lambda _source, _skew: None,
        clock: Callable[[], float] = time.monotonic,
        realtime: Callable[[], float] = time.time,
    ) -> None:
        self.auth = auth
        self._clock = clock
        self._realtime = realtime
        self.recipients: dict[Address, str] = {}
        self.introductions = Introductions()
        self.datagrams_with_certificate = 0
        self.datagrams_without_certificate = 0
        self._max_frame = max_frame_size
        self._on_control = on_control
        self._on_stale = on_stale
        self.bytes_out = 0
        self.bytes_in = 0
        self.control_in = 0

    def set_control_handler(self, on_control: Callable[[bytes], None]) -> None:
        """Where populi's own control messages go (the revocation service)."""
        self._on_control = on_control

    def set_stale_handler(self, on_stale: Callable[[Address, float], None]) -> None:
        """Where the skew of packets refused as stale goes (source, seconds ahead)."""
        self._on_stale = on_stale

    def seal(self, destination: Address, payload: bytes, reliable: bool) -> bytes:
        recipient = self.recipients.get(destination)
        include = self.introductions.include(recipient, reliable, self._clock())
        if not reliable:
            if include:
                self.datagrams_with_certificate += 1
            else:
                self.datagrams_without_certificate += 1
        sealed = self.auth.seal(
            payload, self._realtime(), recipient=recipient, include_certificate=include
        )
        self.bytes_out += len(sealed)
        return sealed

    def open(self, incoming: Incoming) -> bytes | None:
        now = self._realtime()
        self.bytes_in += len(incoming.payload)
        key = source_key(incoming.source[0])
        try:
            opened = self.auth.open(
                incoming.payload,
                now,
                max_size=self._max_frame if incoming.reliable else None,
                source=key,
            )
        except AuthError as exc:
            if exc.reason == "stale":
                skew = stale_skew(exc, now)
                if skew is not None:
                    self._on_stale(incoming.source, skew)
            source = format_address(incoming.source)
            event(_log, 10, "packet.dropped", source=source, reason=str(exc))
            return None
        if incoming.vouch is not None:
            incoming.vouch()  # a member's TCP connection: keep it (overlay/tcp.py)
        if opened.new_session:
            # New to us, or restarted: it may not hold our certificate (any more).
            self.introductions.introduce(opened.sender_node_id, self._clock())
        if answers_a_probe(opened.payload):
            # It read a probe of ours, so it holds our certificate already.
            self.introductions.acknowledged(opened.sender_node_id)
        if opened.payload[:1] == CONTROL_PREFIX:
            # Not for the core: populi's own authenticated messages (revocation gossip).
            self.control_in += 1
            self._on_control(opened.payload[1:])
            return None
        return opened.payload
