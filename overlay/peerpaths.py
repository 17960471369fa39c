"""Per-peer UDP and TCP counters, to notice "UDP is filtered but TCP gets through".

A known pain of memberlist deployments: a firewall drops UDP between two hosts while
TCP works, and the only symptom is flapping suspicions. The swim core retries a failed
UDP probe over TCP; this module gives the daemon the evidence to say so in the log, once
per peer: we keep sending UDP to an address, nothing comes back from it over UDP, yet
our TCP frames to that same address get through.

Keys are the addresses we *send to*. UDP replies come from the peer's bound port (one
socket sends and receives), so they match; inbound TCP comes from ephemeral ports and is
not attributed to a peer here. Memory is bounded: least recently used peers are evicted.
"""

from __future__ import annotations

import collections

import attrs

from overlay.base import Address

#: UDP datagrams sent since the last one heard back, before UDP "seems blocked".
DEFAULT_UDP_SILENCE_THRESHOLD = 3
#: Peers tracked at most; the least recently touched is forgotten first.
DEFAULT_MAX_PEERS = 4096


@attrs.frozen
class PeerPathStatistics:
    """What the transports saw for one peer address.

    Attributes:
        udp_sent: datagrams sent to the peer.
        udp_received: datagrams received from it.
        udp_sent_since_received: datagrams sent since the last one received.
        tcp_sent: frames sent to it successfully.
        tcp_failed: frame sends (connect or write) that failed.
        tcp_ok_since_udp_received: a TCP send succeeded since UDP was last heard.
    """

    udp_sent: int
    udp_received: int
    udp_sent_since_received: int
    tcp_sent: int
    tcp_failed: int
    tcp_ok_since_udp_received: bool


@attrs.define
class _Peer:
    udp_sent: int = 0
    udp_received: int = 0
    udp_sent_since_received: int = 0
    tcp_sent: int = 0
    tcp_failed: int = 0
    tcp_ok_since_udp_received: bool = False
    warned: bool = False


class PathHealth:
    """Bounded per-peer counters shared by a node's UDP and TCP endpoints.

    Args:
        udp_silence_threshold: datagrams sent with no reply before UDP "seems blocked".
        max_peers: peers remembered at most (LRU).
    """

    def __init__(
        self,
        *,
        udp_silence_threshold: int = DEFAULT_UDP_SILENCE_THRESHOLD,
        max_peers: int = DEFAULT_MAX_PEERS,
    ) -> None:
        if udp_silence_threshold < 1 or max_peers < 1:
            raise ValueError("udp_silence_threshold and max_peers must be positive")
        self._threshold = udp_silence_threshold
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

    def record_udp_sent(self, address: Address) -> None:
        """A datagram to `address` left our socket."""
        peer = self._touch(address)
        peer.udp_sent += 1
        peer.udp_sent_since_received += 1

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
        """A frame to `address` was written on an established connection."""
        peer = self._touch(address)
        peer.tcp_sent += 1
        peer.tcp_ok_since_udp_received = True

    def record_tcp_failed(self, address: Address) -> None:
        """Connecting to or writing to `address` failed."""
        self._touch(address).tcp_failed += 1

    def udp_seems_blocked(self, address: Address) -> bool:
        """True if UDP to `address` has gone unanswered while TCP to it worked."""
        peer = self._peers.get(address)
        return (
            peer is not None
            and peer.udp_sent_since_received >= self._threshold
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
        )

    def __len__(self) -> int:
        return len(self._peers)
