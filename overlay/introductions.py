"""When to carry our enrollment certificate: only while a peer may not know us.

The envelope can carry the sender's certificate (about 136 bytes, more than half of the
envelope) so that a receiver that has never heard of the sender can verify its very
first packet. A receiver caches every certificate it verified, so once a peer holds
ours, sending it again is waste; but a peer that does not hold it (it restarted, or it
is new) refuses a packet without it as `unknown_sender`. `Introductions` decides per
packet, from what the daemon knows, leaning towards sending it:

* always to an address with no known node id (bootstrap seeds, mDNS finds), and in
  every stream frame (push-pull, the reliable fallback probe: rare, and the fallback
  path must not depend on the fast path's guesses);
* always to a member we suspect or believe dead: if it stopped answering because it
  cannot read us, this is what lets it answer again (and the buddy suspicion we send
  it is then readable, so it can refute);
* for an *introduction*: `INTRODUCTION_SECONDS` and at least `INTRODUCTION_PACKETS`
  packets after a member joined, recovered or changed its record (a restart signs a
  new one), after its first packet reached us or its packet counter jumped (it
  restarted: see `overlay.auth.Opened.new_session`), and to everybody after somebody
  suspected us (we refuted: maybe they could not read our acks).

An introduction ends early, at once, when the peer shows that it holds our certificate
(`acknowledged`): it answered a probe of ours (an ack or nack), or it sent us a packet
bound to our node id (ADDRESSED). A daemon addresses only a member whose signed record
it verified, and that record carries the member's certificate, which it hands to its
authenticator (`PacketAuthenticator.learn`); or the sender whose packet it has just
verified. Either way it can open our packets without the certificate. In a mesh of 50
a member sends to one given peer about once in 20 s (2.4 datagrams a second over 49
peers), so waiting for `INTRODUCTION_PACKETS` packets kept introductions open for a
minute after the mesh converged; the first packet back now ends them.

Everything else goes without. Pure: the daemon passes a monotonic `now`; state is one
small entry per member with an open introduction or in doubt, pruned by `prune`.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Final

__all__ = ["INTRODUCTION_PACKETS", "INTRODUCTION_SECONDS", "Introductions"]

#: An introduction lasts at least this long, seconds: long enough for the peer to hear
#: from us a few times (a probe, an ack, a gossip round) even in a large mesh.
INTRODUCTION_SECONDS: Final = 5.0
#: ... and until this many packets carried the certificate to the peer, so that one
#: lost datagram (or a window in which we sent nothing to it) does not end it early.
INTRODUCTION_PACKETS: Final = 3


class _Open:
    __slots__ = ("remaining", "until")

    def __init__(self, until: float, remaining: int) -> None:
        self.until = until
        self.remaining = remaining


class Introductions:
    """Per-peer decision: include our certificate in this packet or not.

    Args:
        seconds: `INTRODUCTION_SECONDS`.
        packets: `INTRODUCTION_PACKETS`.
    """

    def __init__(
        self, *, seconds: float = INTRODUCTION_SECONDS, packets: int = INTRODUCTION_PACKETS
    ) -> None:
        self._seconds = seconds
        self._packets = packets
        self._open: dict[str, _Open] = {}
        self._doubt: set[str] = set()
        self._everyone_until = -1.0
        #: Packets decided with and without the certificate, since creation.
        self.with_certificate = 0
        self.without_certificate = 0

    def __len__(self) -> int:
        """Peers with an open introduction or in doubt (for bounds checks)."""
        return len(self._open) + len(self._doubt)

    def introduce(self, node_id: str, now: float) -> None:
        """Carry the certificate to `node_id` for a while (see the module doc)."""
        self._open[node_id] = _Open(now + self._seconds, self._packets)

    def acknowledged(self, node_id: str) -> None:
        """`node_id` showed it holds our certificate (an answer to our probe, or a packet
        addressed to us): end its introduction now rather than after `packets` more."""
        self._open.pop(node_id, None)

    def introduce_to_everyone(self, now: float) -> None:
        """Carry it to every peer for `seconds` (we were suspected: refute readably)."""
        self._everyone_until = now + self._seconds

    def doubt(self, node_id: str, in_doubt: bool) -> None:
        """Mark a member suspect or dead (True), or alive again or gone (False)."""
        if in_doubt:
            self._doubt.add(node_id)
        else:
            self._doubt.discard(node_id)

    def include(self, node_id: str | None, reliable: bool, now: float) -> bool:
        """Whether the packet about to be sealed for `node_id` carries our certificate.

        Counts the decision, and one packet of an open introduction.

        Args:
            node_id: the recipient's node id, or None when only its address is known.
            reliable: the packet goes as a stream frame.
            now: the daemon's monotonic clock, seconds.
        """
        include = (
            node_id is None
            or reliable
            or node_id in self._doubt
            or now < self._everyone_until
            or self._introducing(node_id, now)
        )
        if include:
            self.with_certificate += 1
        else:
            self.without_certificate += 1
        return include

    def _introducing(self, node_id: str, now: float) -> bool:
        entry = self._open.get(node_id)
        if entry is None:
            return False
        if entry.remaining <= 0 and now >= entry.until:
            del self._open[node_id]
            return False
        entry.remaining -= 1
        return True

    def prune(self, members: Container[str], now: float) -> None:
        """Forget peers that are no longer members, and introductions that are over."""
        self._doubt = {n for n in self._doubt if n in members}
        self._open = {
            n: e
            for n, e in self._open.items()
            if n in members and (e.remaining > 0 or now < e.until)
        }
