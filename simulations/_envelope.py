"""The bytes the daemon's packet envelope adds, modelled per packet.

The simulator carries the core's payloads bare, but the daemon seals every datagram
and stream frame in `overlay.auth`'s envelope: a fixed 114 bytes (kind, flags, sender
key, timestamp, counter, signature), plus the sender's enrollment certificate (2 + about
134 bytes, 250 in all) while the receiver may not know the sender yet. Without the
envelope, simulated bytes per member cannot be compared with a daemon's.

`EnvelopeModel` decides per packet whether the certificate rides along, following
`overlay.introductions.Introductions` (the daemon's rule), from what the simulation
knows:

* always in a stream frame (push-pull, the reliable fallback probe), and to an address
  whose node the sender has never heard of (a join through a seed);
* to a member the sender sees suspect or dead;
* during an *introduction*: at least `introduction_seconds` and `introduction_packets`
  packets after the sender learns of the member (`MemberJoined`, `MemberRecovered`),
  or after the member restarted (a new life: the daemon sees its counter jump), unless
  the member has since sent the sender a packet addressed to it (it addresses only
  members it knows, so it holds the sender's certificate: the daemon's early end);
* to everybody for `introduction_seconds` after the sender refuted a suspicion.

Everything else pays only the fixed part. The sizes are parameters (`[envelope]` in a
scenario), since the overlay may shrink the envelope. Pure bookkeeping: one small
entry per (sender, peer) it has sent to.
"""

from __future__ import annotations

from array import array

import attrs

from swim import Event, MemberJoined, MemberRecovered, SelfRefuted

from ._engine import NodeStatus, Simulator
from ._metrics import Metrics

__all__ = ["EnvelopeModel", "EnvelopeSpec"]

_SUSPECT = 2
_DEAD = 3
_UNKNOWN = 0
#: Beliefs about a peer under which we send our certificate (it may not hold it).
_INTRODUCE = frozenset((_UNKNOWN, _SUSPECT, _DEAD))


@attrs.frozen
class EnvelopeSpec:
    """Sizes and introduction rule of the daemon's envelope (see `overlay.auth`)."""

    #: Bytes every sealed packet adds without the certificate (`overlay.auth`: 114).
    base: int = attrs.field(default=114, validator=attrs.validators.ge(0))
    #: Bytes the certificate adds when it rides along: its 2-byte length plus the
    #: certificate (250 - 114 = 136 with today's certificates).
    certificate: int = attrs.field(default=136, validator=attrs.validators.ge(0))
    #: `overlay.introductions.INTRODUCTION_SECONDS`.
    introduction_seconds: float = attrs.field(default=5.0, validator=attrs.validators.ge(0))
    #: `overlay.introductions.INTRODUCTION_PACKETS`.
    introduction_packets: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    #: A packet the peer addresses to the sender ends the sender's introduction to it
    #: (`overlay.introductions`: the peer holds the sender's verified record). Off: the
    #: rule before certificates came from records.
    addressed_ends: bool = True


class EnvelopeModel:
    """An `Observer` that also prices each packet's envelope for the engine.

    Args:
        spec: sizes and the introduction rule.
        sim: the simulator (for node lives).
        metrics: the run's metrics (each node's view of the others).
    """

    def __init__(self, spec: EnvelopeSpec, sim: Simulator, metrics: Metrics) -> None:
        self.spec = spec
        self._sim = sim
        self._metrics = metrics
        self._beliefs = metrics.beliefs
        self._lives = sim.lives
        self._index_of = sim.name_index.get  # `index_of` without a call per event
        self._with = spec.base + spec.certificate
        self._without = spec.base
        self._addressed_ends = spec.addressed_ends
        self._introduction_seconds = spec.introduction_seconds
        self._introduction_packets = float(spec.introduction_packets)
        # Per sender, indexed by peer: when the introduction to it ends, how many
        # packets it still owes, and the peer's life it was for (-1: none recorded).
        # Flat arrays rather than a dict of small lists: at 1,000 members that is 24 MB
        # instead of about 200 MB of objects, read for every packet.
        self._until: list[array[float]] = []
        self._owed: list[array[float]] = []
        self._for_life: list[array[int]] = []
        self._everyone_until: list[float] = []
        #: Packets priced with and without the certificate.
        self.with_certificate = 0
        self.without_certificate = 0

    def _grow(self, node: int) -> None:
        while len(self._for_life) <= node:
            self._until.append(array("d"))
            self._owed.append(array("d"))
            self._for_life.append(array("q"))
            self._everyone_until.append(-1.0)

    def _set(self, src: int, dst: int, until: float, owed: float, life: int) -> None:
        """Record an introduction from `src` to `dst` (growing the sender's arrays)."""
        lifes = self._for_life[src]
        if dst >= len(lifes):
            extra = max(dst + 1, len(self._lives)) - len(lifes)
            self._until[src].extend(array("d", [0.0]) * extra)
            self._owed[src].extend(array("d", [0.0]) * extra)
            lifes.extend(array("q", [-1]) * extra)
        self._until[src][dst] = until
        self._owed[src][dst] = owed
        lifes[dst] = life

    def overhead(self, src: int, dst: int | None, reliable: bool, t: float) -> int:
        """Envelope bytes of one packet from `src` to `dst` (None: no such node) at `t`.

        Called for every packet of a run, so the common case (an introduced peer we
        see alive or suspect) is checked first and inline.
        """
        # `src` is running, so `on_status` has made room for it. `view_of`, `life` and
        # `_addressed` inline: this runs for every packet.
        if dst is not None:
            view = self._beliefs[src]
            belief = view[dst] if dst < len(view) else _UNKNOWN
            # `src` addresses its packet to `dst` when it knows `dst` (the daemon
            # addresses a packet only to a member whose verified record it holds),
            # which proves it holds `dst`'s certificate: `dst`'s introduction to `src`
            # ends (priced at the send, not the delivery: a packet lost on the way
            # ends it a little early).
            if self._addressed_ends and belief != _UNKNOWN and dst < len(self._owed):
                owed = self._owed[dst]
                if src < len(owed) and owed[src] > 0:
                    owed[src] = 0.0
                    self._until[dst][src] = -1.0
            if not reliable and t >= self._everyone_until[src]:
                lifes = self._for_life[src]
                if dst < len(lifes):
                    life = lifes[dst]
                    if (
                        life >= 0
                        and t >= self._until[src][dst]
                        and self._owed[src][dst] <= 0
                        and belief not in _INTRODUCE
                        and life == self._lives[dst]
                    ):
                        self.without_certificate += 1
                        return self._without
        if self._certificate(src, dst, reliable, t):
            self.with_certificate += 1
            return self._with
        self.without_certificate += 1
        return self._without

    def _certificate(self, src: int, dst: int | None, reliable: bool, t: float) -> bool:
        if reliable or dst is None:
            return True
        if t < self._everyone_until[src]:
            return True
        belief = self._metrics.view_of(src, dst)
        if belief in _INTRODUCE:
            return True
        life = self._lives[dst]
        lifes = self._for_life[src]
        held = lifes[dst] if dst < len(lifes) else -1
        if held < 0:
            # Known without an introduction (a primed cluster): it holds our certificate.
            self._set(src, dst, -1.0, 0.0, life)
            return False
        until, owed = self._until[src], self._owed[src]
        if held != life:  # it restarted: a fresh cache, introduce ourselves again
            until[dst] = t + self.spec.introduction_seconds
            owed[dst] = float(self.spec.introduction_packets)
            lifes[dst] = life
        if owed[dst] > 0 or t < until[dst]:
            owed[dst] -= 1
            return True
        return False

    def _introduce(self, src: int, dst: int, now: float) -> None:
        if src >= len(self._for_life):
            self._grow(src)
        self._set(
            src,
            dst,
            now + self.spec.introduction_seconds,
            float(self.spec.introduction_packets),
            self._lives[dst],
        )

    def on_event(self, now: float, node: int, event: Event) -> None:
        cls = event.__class__
        if cls is SelfRefuted:
            self._grow(node)
            self._everyone_until[node] = now + self.spec.introduction_seconds
        elif cls is MemberJoined or cls is MemberRecovered:
            subject = self._index_of(event.member.name)  # type: ignore[union-attr]
            if subject is not None and subject != node:
                # `_introduce`, written out: a forming cluster of n has n^2 of these.
                lifes = self._for_life[node] if node < len(self._for_life) else None
                if lifes is None or subject >= len(lifes):
                    self._introduce(node, subject, now)
                else:
                    self._until[node][subject] = now + self._introduction_seconds
                    self._owed[node][subject] = self._introduction_packets
                    lifes[subject] = self._lives[subject]

    def on_status(self, now: float, node: int, old: NodeStatus, new: NodeStatus) -> None:
        if old == NodeStatus.DOWN and new != NodeStatus.DOWN:
            self._grow(node)
            # A fresh process: introduces itself to everyone.
            self._until[node] = array("d")
            self._owed[node] = array("d")
            self._for_life[node] = array("q")
            self._everyone_until[node] = -1.0
