"""Per-peer UDP and TCP counters, to notice "UDP is filtered but TCP gets through".

A known pain of memberlist deployments: a firewall drops UDP between two hosts while
TCP works, and the only symptom is flapping suspicions. The swim core retries a failed
UDP probe over TCP; this module gives the daemon the evidence to say so in the log, once
per peer. "UDP blocked, TCP works" is a strong claim, so it needs strong evidence, all
in one episode of UDP silence (since the peer was last heard over UDP):

* at least `udp_silence_threshold` (5) datagrams that ask for an answer (a ping, an
  indirect ping: the sender says which) went unanswered in a row, and the
  first of them is at least `udp_silence_min` (10 s) older than the last: one probe
  that timed out while a daemon was starved of CPU (100 daemons starting on 2 cores)
  is not a blocked path;
* and a TCP exchange with that peer *succeeded* during the silence: a connection
  handshake completed (`record_tcp_connected`) or the peer sent a frame back on our
  connection (`record_tcp_received`). A write into an already open connection proves
  nothing (the kernel buffers it even when every packet is dropped), so
  `record_tcp_sent` is counted but is not evidence. A node cut off completely is
  therefore never told that TCP works.

Datagrams that expect nothing back (gossip, acks) are counted but open no episode: right
after a cluster forms, a member gossips to a peer that, by chance, sends it nothing for
half a minute, and a push-pull over TCP between them then looked like "UDP silent, TCP
works" (untrue warnings, seen in start storms and idle windows).

Keys are the addresses we *send to*. UDP replies come from the peer's bound port (one
socket sends and receives), so they match; inbound TCP comes from ephemeral ports and is
not attributed to a peer here. Memory is bounded: least recently used peers are evicted.
Times are monotonic seconds passed in by the transports.
"""

from __future__ import annotations

import collections

import attrs

from overlay.base import Address

#: UDP datagrams sent since the last one heard back, before UDP "seems blocked".
DEFAULT_UDP_SILENCE_THRESHOLD = 5
#: Seconds between the first and the last unanswered datagram, before UDP "seems blocked".
DEFAULT_UDP_SILENCE_MIN = 10.0
#: Peers tracked at most; the least recently touched is forgotten first.
DEFAULT_MAX_PEERS = 4096


@attrs.frozen
class PeerPathStatistics:
    """What the transports saw for one peer address.

    Attributes:
        udp_sent: datagrams sent to the peer.
        udp_received: datagrams received from it.
        udp_sent_since_received: datagrams that expect an answer sent since the last
            one received.
        tcp_sent: frames written to it (not evidence that it got them).
        tcp_failed: frame sends (connect or write) that failed.
        tcp_ok_since_udp_received: a TCP exchange (a handshake, or a frame back) succeeded
            while datagrams to it went unanswered.
        udp_silent_for: seconds between the first and the last unanswered datagram.
    """

    udp_sent: int
    udp_received: int
    udp_sent_since_received: int
    tcp_sent: int
    tcp_failed: int
    tcp_ok_since_udp_received: bool
    udp_silent_for: float


@attrs.define
class _Peer:
    udp_sent: int = 0
    udp_received: int = 0
    udp_sent_since_received: int = 0
    tcp_sent: int = 0
    tcp_failed: int = 0
    tcp_ok_since_udp_received: bool = False
    first_unanswered: float = 0.0
    last_sent: float = 0.0
    warned: bool = False


class PathHealth:
    """Bounded per-peer counters shared by a node's UDP and TCP endpoints.

    Args:
        udp_silence_threshold: datagrams sent with no reply before UDP "seems blocked".
        udp_silence_min: seconds the silence must span (first to last unanswered datagram).
        max_peers: peers remembered at most (LRU).
    """

    def __init__(
        self,
        *,
        udp_silence_threshold: int = DEFAULT_UDP_SILENCE_THRESHOLD,
        udp_silence_min: float = DEFAULT_UDP_SILENCE_MIN,
        max_peers: int = DEFAULT_MAX_PEERS,
    ) -> None:
        if udp_silence_threshold < 1 or max_peers < 1 or udp_silence_min < 0:
            raise ValueError(
                "udp_silence_threshold and max_peers must be positive, udp_silence_min >= 0"
            )
        self._threshold = udp_silence_threshold
        self._silence_min = udp_silence_min
        self._max = max_peers
        self._peers: collections.OrderedDict[Address, _Peer] = collections.OrderedDict()

    def _touch(self, address: Address) -> _Peer:
        peer = self._peers.get(address)
        if peer is None:
            peer = _Peer()
            self._peers[address] = peer
            if len(self._peers) > self._max:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(address)
        return peer

    def record_udp_sent(self, address: Address, now: float, *, expects_answer: bool = True) -> None:
        """A datagram to `address` left our socket at `now`; only one that
        `expects_answer` counts as unanswered until the peer is heard."""
        peer = self._touch(address)
        peer.udp_sent += 1
        if not expects_answer:
            return
        if peer.udp_sent_since_received == 0:
            peer.first_unanswered = now
        peer.udp_sent_since_received += 1
        peer.last_sent = now

    def record_udp_received(self, address: Address) -> None:
        """A datagram from `address` arrived (and passed the accept policy).

        Only peers we have sent to are tracked, so a flood from strangers cannot evict
        the peers the daemon cares about.
        """
        peer = self._peers.get(address)
        if peer is None:
            return
        peer.udp_received += 1
        peer.udp_sent_since_received = 0
        peer.tcp_ok_since_udp_received = False
        peer.warned = False

    def record_tcp_sent(self, address: Address) -> None:
        """A frame to `address` was written (into the kernel: no evidence it arrived)."""
        self._touch(address).tcp_sent += 1

    def record_tcp_connected(self, address: Address) -> None:
        """A TCP handshake with `address` completed: its host answered over TCP."""
        self._tcp_ok(self._touch(address))

    def record_tcp_received(self, address: Address) -> None:
        """A frame arrived on our connection to `address`: it answered over TCP."""
        peer = self._peers.get(address)
        if peer is not None:
            self._tcp_ok(peer)

    @staticmethod
    def _tcp_ok(peer: _Peer) -> None:
        # Evidence only while UDP to it is going unanswered (the same episode).
        if peer.udp_sent_since_received > 0:
            peer.tcp_ok_since_udp_received = True

    def record_tcp_failed(self, address: Address) -> None:
        """Connecting to or writing to `address` failed."""
        self._touch(address).tcp_failed += 1

    def udp_seems_blocked(self, address: Address) -> bool:
        """True if UDP to `address` has gone unanswered while TCP to it worked.

        See the module doc for the evidence this needs.
        """
        peer = self._peers.get(address)
        return (
            peer is not None
            and peer.udp_sent_since_received >= self._threshold
            and peer.last_sent - peer.first_unanswered >= self._silence_min
            and peer.tcp_ok_since_udp_received
        )

    def warn_udp_blocked_once(self, address: Address) -> bool:
        """True exactly once per blocked episode: the daemon logs the warning when it is.

        The flag re-arms when UDP from the peer is heard again, so a later, separate
        outage is reported again.
        """
        if not self.udp_seems_blocked(address):
            return False
        peer = self._peers[address]
        if peer.warned:
            return False
        peer.warned = True
        return True

    def blocked_peers(self) -> list[Address]:
        """Every tracked peer for which UDP seems blocked, in address order."""
        return sorted(a for a in self._peers if self.udp_seems_blocked(a))

    def get(self, address: Address) -> PeerPathStatistics | None:
        """The counters for `address`, or None if it is not tracked."""
        peer = self._peers.get(address)
        if peer is None:
            return None
        return PeerPathStatistics(
            udp_sent=peer.udp_sent,
            udp_received=peer.udp_received,
            udp_sent_since_received=peer.udp_sent_since_received,
            tcp_sent=peer.tcp_sent,
            tcp_failed=peer.tcp_failed,
            tcp_ok_since_udp_received=peer.tcp_ok_since_udp_received,
            udp_silent_for=(
                peer.last_sent - peer.first_unanswered if peer.udp_sent_since_received else 0.0
            ),
        )

    def __len__(self) -> int:
        return len(self._peers)
