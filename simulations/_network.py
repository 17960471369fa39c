"""The simulated network: latency, loss, duplication and partitions between nodes.

Nodes are small integers (the simulator's slot numbers), never addresses, so each
packet costs a few list lookups. `Network.route` decides the fate of one datagram and
returns the delays after which copies of it arrive: none when it is lost or blocked,
one normally, two when it is duplicated. Streams (`Network.stream_delay`) model TCP:
never lost at random, still blocked by a partition, and slower to arrive because a
connection has to be set up first.

Latency of a link is ``latency_min + extra[src] + extra[dst] + Exp(mean - min)``: the
exponential tail is the queueing delay memberlist's authors see on LANs, and the
per-node `extra` (uniform in ``[0, latency_spread]``) makes some links systematically
longer than others without storing an n-by-n matrix.

Loss on a link combines three independent coins: the global `loss`, the sender's
egress loss and the receiver's ingress loss. Giving one node ingress loss only makes
the loss asymmetric: it can still be heard, but hears others badly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

import attrs

__all__ = ["Network", "NetworkConfig", "NetworkStatistics"]


def _probability(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{attribute.name} must be in [0, 1), got {value!r}")


def _non_negative(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value >= 0.0 or math.isinf(value):
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


@attrs.frozen
class NetworkConfig:
    """How links behave. All durations are seconds of virtual time.

    The defaults describe a quiet LAN: half a millisecond minimum, 2 ms mean, no loss.
    """

    #: Shortest one-way delay of any datagram (propagation plus serialization).
    latency_min: float = attrs.field(default=0.0005, validator=_non_negative)
    #: Mean one-way delay; the part above `latency_min` is exponentially distributed.
    latency_mean: float = attrs.field(default=0.002, validator=_non_negative)
    #: Each node adds a fixed extra one-way delay drawn uniformly from [0, spread] to
    #: every link it is on, so that some pairs are consistently farther apart.
    latency_spread: float = attrs.field(default=0.0, validator=_non_negative)
    #: Probability that a datagram is dropped, on every link.
    loss: float = attrs.field(default=0.0, validator=_probability)
    #: Probability that a datagram that got through arrives twice (with its own delay).
    duplicate: float = attrs.field(default=0.0, validator=_probability)
    #: One-way trips a stream message takes before delivery (TCP handshake plus data).
    stream_trips: float = attrs.field(default=3.0, validator=_non_negative)
    #: How long a stream connect to a dead or unreachable node takes to fail.
    connect_timeout: float = attrs.field(default=1.0, validator=_non_negative)

    def __attrs_post_init__(self) -> None:
        if self.latency_mean < self.latency_min:
            raise ValueError(
                f"latency_mean ({self.latency_mean}) must be >= latency_min ({self.latency_min})"
            )


@attrs.frozen
class NetworkStatistics:
    """What happened to the datagrams the network was asked to carry."""

    routed: int
    lost: int
    blocked: int
    duplicated: int


class Network:
    """Decides, packet by packet, whether and when a datagram arrives.

    Args:
        config: link behaviour.
        rng: the network's own generator (a child seed of the run), used for latency,
            loss and duplication, and for each node's extra latency.
    """

    def __init__(self, config: NetworkConfig, rng: random.Random) -> None:
        self.config = config
        self._rng = rng
        self._random = rng.random
        self._base = config.latency_min
        self._scale = config.latency_mean - config.latency_min
        self._loss = config.loss
        self._duplicate = config.duplicate
        self._extra: list[float] = []
        self._ingress: list[float] = []
        self._egress: list[float] = []
        self._asymmetric = False
        self._group: list[int] = []
        self._blocked: frozenset[tuple[int, int]] = frozenset()
        self._routed = 0
        self._lost = 0
        self._blocked_count = 0
        self._duplicated = 0

    ####################################################################################
    # Topology
    ####################################################################################

    def add_node(self) -> int:
        """Make room for one more node; returns its number (0, 1, 2, ... in order)."""
        spread = self.config.latency_spread
        self._extra.append(self._rng.uniform(0.0, spread) if spread else 0.0)
        self._ingress.append(0.0)
        self._egress.append(0.0)
        self._group.append(0)
        return len(self._group) - 1

    def set_node_loss(self, node: int, *, ingress: float = 0.0, egress: float = 0.0) -> None:
        """Make one node's links lossy in one or both directions.

        Raises:
            ValueError: a probability outside [0, 1].
        """
        for label, value in (("ingress", ingress), ("egress", egress)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{label} loss must be in [0, 1], got {value!r}")
        self._ingress[node] = ingress
        self._egress[node] = egress
        self._asymmetric = any(self._ingress) or any(self._egress)

    def partition(self, groups: Sequence[Iterable[int]], *, one_way: bool = False) -> None:
        """Split the nodes into groups that cannot reach one another.

        Args:
            groups: node numbers per group; nodes listed nowhere (including nodes added
                later) belong to the first group.
            one_way: block only traffic from a lower-numbered group to a higher one, so
                group 1 hears group 0 but group 0 never hears group 1.
        """
        group = [0] * len(self._group)
        for number, members in enumerate(groups):
            for node in members:
                group[node] = number
        self._group[:] = group
        count = len(groups)
        self._blocked = frozenset(
            (a, b) for a in range(count) for b in range(count) if a != b and (a < b or not one_way)
        )

    def heal(self) -> None:
        """Remove every partition."""
        self._group[:] = [0] * len(self._group)
        self._blocked = frozenset()

    def reachable(self, src: int, dst: int) -> bool:
        """Whether a partition currently lets `src` reach `dst`."""
        group = self._group
        return group[src] == group[dst] or (group[src], group[dst]) not in self._blocked

    def heal_loss(self) -> None:
        """Remove all random and asymmetric loss (the liveness phase calls this)."""
        self._loss = 0.0
        self._ingress[:] = [0.0] * len(self._ingress)
        self._egress[:] = [0.0] * len(self._egress)
        self._asymmetric = False

    ####################################################################################
    # Per packet
    ####################################################################################

    def route(self, src: int, dst: int) -> tuple[float, ...]:
        """Delays after which copies of one datagram from `src` arrive at `dst`.

        Returns:
            ``()`` when the datagram is lost or blocked, otherwise one delay, or two
            when it is duplicated.
        """
        self._routed += 1
        group = self._group
        if group[src] != group[dst] and (group[src], group[dst]) in self._blocked:
            self._blocked_count += 1
            return ()
        loss = self._loss
        if self._asymmetric:
            loss = 1.0 - (1.0 - loss) * (1.0 - self._egress[src]) * (1.0 - self._ingress[dst])
        rnd = self._random
        if loss and rnd() < loss:
            self._lost += 1
            return ()
        extra = self._extra
        base = self._base + extra[src] + extra[dst]
        scale = self._scale
        delay = base - scale * math.log(1.0 - rnd()) if scale else base
        if self._duplicate and rnd() < self._duplicate:
            self._duplicated += 1
            return (delay, base - scale * math.log(1.0 - rnd()) if scale else base)
        return (delay,)

    def stream_delay(self, src: int, dst: int) -> float | None:
        """Delay of one stream (TCP) message, or None when a partition blocks it.

        Streams are never lost at random (TCP retransmits), but take
        `stream_trips` one-way trips, each with its own sampled latency.
        """
        if not self.reachable(src, dst):
            return None
        extra = self._extra
        base = self._base + extra[src] + extra[dst]
        scale = self._scale
        trips = self.config.stream_trips
        if not scale:
            return base * trips
        rnd = self._random
        whole = int(trips)
        total = sum(base - scale * math.log(1.0 - rnd()) for _ in range(whole))
        return total + (trips - whole) * base

    def statistics(self) -> NetworkStatistics:
        return NetworkStatistics(
            routed=self._routed,
            lost=self._lost,
            blocked=self._blocked_count,
            duplicated=self._duplicated,
        )
