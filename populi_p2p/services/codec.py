"""Packet admission: seals what the node sends and opens what it receives.

The driver's `PacketCodec`. Kept apart from the services so the driver, the tests and
the benchmarks can use it without a node.
"""

from __future__ import annotations

import time
from collections import OrderedDict
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

__all__ = ["WIRE_PACKET_BUDGET", "AuthCodec", "lane"]

#: Bytes a sealed datagram may occupy on the wire. Below WireGuard's 1420-byte MTU less
#: IPv6 and UDP headers, so an overlay never fragments protocol packets.
WIRE_PACKET_BUDGET: Final = 1350
#: How long (monotonic seconds) the node id of a sender that just authenticated from an
#: address addresses what we send back there, when that address is no member's: long
#: enough for a reply, short enough that a new key at the address is not refused long.
REPLY_BINDING_SECONDS: Final = 5.0
#: Addresses remembered for that (least recently heard forgotten first).
REPLY_BINDINGS_MAX: Final = 1024

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
    forged from a member's address never costs that member its packets; every drop is
    counted by reason in the authenticator's `drops`. Our certificate rides only in
    packets to peers that may not know us (`introductions`, fed by the node's membership
    events and by senders that start a new session), and only until the peer shows that
    it holds it (`open`).

    Args:
        auth: seals and opens.
        max_frame_size: the largest stream frame `open` accepts.
        on_stale: told the source and skew (seconds ahead) of each packet refused as
            stale (`SkewWatch.observe`).
        on_tcp_answer: told a member's address whenever a frame from that member
            authenticates. The transport can attribute a frame on our own outbound
            connection to its peer, but a peer answers over whichever connection it
            pooled, often one it opened to us; only here, after authentication, is the
            sender known. The node gives `PathHealth.record_tcp_received`, the evidence
            behind "UDP blocked, TCP works".
        clock, realtime: monotonic and Unix seconds.
    """

    def __init__(
        self,
        auth: PacketAuthenticator,
        max_frame_size: int,
        *,
        on_stale: Callable[[Address, float], None] = lambda _source, _skew: None,
        on_tcp_answer: Callable[[Address], None] = lambda _address: None,
        clock: Callable[[], float] = time.monotonic,
        realtime: Callable[[], float] = time.time,
    ) -> None:
        self.auth = auth
        self._clock = clock
        self._realtime = realtime
        self.recipients: dict[Address, str] = {}
        #: Address -> (node id, when) of the last sender authenticated from it (see seal).
        self._replies: OrderedDict[Address, tuple[str, float]] = OrderedDict()
        self.introductions = Introductions()
        self.datagrams_with_certificate = 0
        self.datagrams_without_certificate = 0
        self._max_frame = max_frame_size
        self._on_stale = on_stale
        self._on_tcp_answer = on_tcp_answer
        self.bytes_out = 0
        #: Of `bytes_out`, those sealed as stream frames (push-pull, TCP fallback probes).
        self.frame_bytes_out = 0
        self.bytes_in = 0
        #: The node id of the sender whose packet `open` accepted last (the driver hands
        #: it to the core with the payload); None before any, or after a refused one.
        self.last_sender: str | None = None

    def learn_certificate(self, public_key: bytes, certificate: bytes) -> bool:
        """Hold a member's certificate from its verified record (the roster's hook).

        Its packets then open without the certificate from the first one on, and our
        packets addressed to it are evidence, at its end, that we hold it (see `open`).
        """
        return self.auth.learn(public_key, certificate, self._realtime())

    def seal(self, destination: Address, payload: bytes, reliable: bool) -> bytes:
        """Seal for `destination`, addressed (ADDRESSED) to whoever we know is there.

        A member's address gives its node id. Any other address is addressed to the
        sender that authenticated from it in the last `REPLY_BINDING_SECONDS` (our reply
        to a non-member's ping): so a reply captured on its way cannot be replayed to
        another member, nor reflected back to us (tests/attacks).
        """
        now = self._clock()
        recipient = self.recipients.get(destination)
        include = self.introductions.include(recipient, reliable, now)
        addressee = recipient
        if addressee is None:
            bound = self._replies.get(destination)
            if bound is not None and now - bound[1] < REPLY_BINDING_SECONDS:
                addressee = bound[0]
        if not reliable:
            if include:
                self.datagrams_with_certificate += 1
            else:
                self.datagrams_without_certificate += 1
        sealed = self.auth.seal(
            payload, self._realtime(), recipient=addressee, include_certificate=include
        )
        self.bytes_out += len(sealed)
        if reliable:
            self.frame_bytes_out += len(sealed)
        return sealed

    def open(self, incoming: Incoming) -> bytes | None:
        now = self._realtime()
        self.bytes_in += len(incoming.payload)
        self.last_sender = None
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
                skew = stale_skew(exc)
                if skew is not None:
                    self._on_stale(incoming.source, skew)
            source = format_address(incoming.source)
            event(_log, 10, "packet.dropped", source=source, reason=str(exc))
            return None
        if incoming.vouch is not None:
            incoming.vouch()  # a member's TCP connection: keep it (overlay/tcp.py)
        if incoming.reliable:
            for address, node_id in self.recipients.items():
                if node_id == opened.sender_node_id:
                    self._on_tcp_answer(address)  # it reached us over TCP (any connection)
        self._replies[incoming.source] = (opened.sender_node_id, self._clock())
        self._replies.move_to_end(incoming.source)
        if len(self._replies) > REPLY_BINDINGS_MAX:
            self._replies.popitem(last=False)
        if opened.new_session:
            # New to us, or restarted: it may not hold our certificate (any more).
            self.introductions.introduce(opened.sender_node_id, self._clock())
        if opened.addressed or answers_a_probe(opened.payload):
            # It holds our certificate: it read a probe of ours, or it bound this packet
            # to our node id, which it does only for a member whose verified record (and
            # so certificate) it holds, or for a sender whose packet it just verified.
            self.introductions.acknowledged(opened.sender_node_id)
        self.last_sender = opened.sender_node_id
        return opened.payload
