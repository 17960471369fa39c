"""Route choice: which node serves a request, and which takes over when it fails.

Sans-IO and pure, like `swim/`: the caller hands in its view of the mesh (one
`Candidate` per member it knows, with the ``models`` section of its verified record),
the earned reliability of each node, and the requests outstanding at each node
(`load.LoadBook`: this node's own relays in flight plus the queue the serving node
last reported); `choose_route` returns a `RouteDecision` that explains itself, in the
style of a Nomad scheduler pipeline:

1. *Feasibility*, each filter recording why it removed a node: the node is alive or
   suspect (not dead or left), not draining, its record's ``models`` section lists the
   model (which only happens while one of its engines answers its health poll), and it
   was not already tried for this request (`exclude`).
2. *The gate*: a node is healthy unless its earned reliability is under
   `RELIABILITY_GATE` or the caller marks it failing (`failing`: its last relay from
   this node failed, moments ago). Failing nodes rank after every healthy one: they
   serve only when nothing healthy is left. Suspect nodes rank after every alive one:
   a suspicion is often a node busy for a moment (one just restarted, above all), so
   one is tried as the last resort rather than a stream lost or a request refused,
   and never while an alive node can serve.
3. *Ranking by load*, least outstanding requests weighted by capacity: the cost of a
   node is ``(outstanding + 1 + RELIABILITY_WEIGHT * (1 - reliability)) / slots``,
   its capacity in use once this request is added. ``slots`` is what its engine
   reports (llama.cpp's ``total_slots``; `DEFAULT_CAPACITY` when unknown). Reliability
   weighs as at most half a request: between healthy nodes at equal load the proven
   one serves, but it never outranks a difference of one whole request. Then
   round-trip time, then a tie-break that differs per accepting node (`salt`), so
   that accepting nodes do not all pick the same node among equals.

The relay calls this again at each failover, from the view as it is then.
At 10,000 candidates only the best `max_candidates` are ranked in full
(``heapq.nsmallest``: O(n log k)).
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final

import attrs

__all__ = ["Candidate", "RouteDecision", "choose_route", "slots_of"]

#: Default: how many nodes (the choice plus fallbacks) a decision keeps.
MAX_CANDIDATES: Final = 4
#: Requests in flight per model that make a full node when its engine does not say.
DEFAULT_CAPACITY: Final = 4
#: The largest capacity believed from a record (a lie cannot draw all the traffic).
MAX_CAPACITY: Final = 1024
#: Earned reliability under which a node is failing, whatever its load: a newcomer sits
#: at 0.25 (the prior); three losses with nothing else bring a node to 1/7.
RELIABILITY_GATE: Final = 0.15
#: What a reliability of 0 weighs against one of 1, in requests (under 1: load first).
RELIABILITY_WEIGHT: Final = 0.5
_NO_RTT: Final = 1e9


@attrs.frozen
class Candidate:
    """One member as the accepting node sees it."""

    node_id: str
    name: str
    #: ``alive``, ``suspect``, ``dead`` or ``left`` (the swim core's state).
    state: str
    draining: bool
    #: The ``models`` section of its verified record (empty: none, or unverified).
    models: Mapping[str, Mapping[str, Any]]
    rtt: float | None = None
    is_self: bool = False


@attrs.frozen
class Score:
    """Why a ranked node stands where it does."""

    healthy: bool
    reliability: float
    outstanding: int
    slots: int
    cost: float
    rtt: float | None
    #: Suspect in the membership: ranked after every alive node (the last resort).
    suspect: bool = False


@attrs.frozen
class RouteDecision:
    """The route for one request: `order[0]` serves, the rest take over in turn."""

    model: str
    order: tuple[str, ...]
    #: Per ranked node: what ranked it.
    scores: Mapping[str, Score]
    #: Per ruled-out node: why (one short phrase).
    ruled_out: Mapping[str, str]
    #: Nodes removed by each filter.
    counts: Mapping[str, int]

    def header(self) -> str:
        """The ``x-populi-route`` header: why the first node was chosen."""
        if not self.order:
            return "none"
        s = self.scores[self.order[0]]
        rtt_text = "-" if s.rtt is None else f"{s.rtt * 1000:.1f}ms"
        tier = "suspect" if s.suspect else "loaded" if s.healthy else "failing"
        return (
            f"{tier};reliability={s.reliability:.3f};"
            f"load={s.outstanding / s.slots:.2f};outstanding={s.outstanding}/{s.slots};"
            f"rtt={rtt_text};candidates={len(self.order)};ruled_out={len(self.ruled_out)}"
        )


def slots_of(facts: Mapping[str, Any]) -> int:
    """A node's capacity for a model, from its record's ``models`` entry."""
    slots = facts.get("slots")
    if isinstance(slots, int) and not isinstance(slots, bool) and slots > 0:
        return min(slots, MAX_CAPACITY)
    return DEFAULT_CAPACITY


def _why_not(c: Candidate, model: str, exclude: Collection[str]) -> str | None:
    if c.node_id in exclude:
        return "already tried"
    if c.state not in ("alive", "suspect"):
        return c.state
    if c.draining:
        return "draining"
    if model not in c.models:
        return "does not serve the model" if c.models else "no healthy engine"
    return None


def _tiebreak(salt: str, node: str) -> bytes:
    return hashlib.blake2b(f"{salt}\0{node}".encode(), digest_size=8).digest()


def choose_route(
    model: str,
    candidates: Iterable[Candidate],
    reliability: Mapping[str, float],
    prior: float,
    *,
    outstanding: Mapping[str, int] | None = None,
    failing: Collection[str] = (),
    exclude: Collection[str] = (),
    salt: str = "",
    max_candidates: int = MAX_CANDIDATES,
) -> RouteDecision:
    """Filter and rank `candidates` for `model`.

    Args:
        reliability: earned reliability per node id; absent nodes get `prior`.
        outstanding: requests outstanding per node for `model`; absent nodes count
            what their record says (``inflight``).
        failing: nodes gated out by recent failures (ranked after the healthy).
        exclude: nodes already tried for this request.
        salt: the accepting node's id: the tie-break among equal nodes.
        max_candidates: the choice plus at most this many minus one fallbacks.
    """
    ruled_out: dict[str, str] = {}
    counts: dict[str, int] = {}
    keyed: list[tuple[tuple[int, float, float, bytes, str], Score]] = []
    for c in candidates:
        why = _why_not(c, model, exclude)
        if why is not None:
            ruled_out[c.node_id] = why
            counts[why] = counts.get(why, 0) + 1
            continue
        facts = c.models[model]
        if outstanding is not None and c.node_id in outstanding:
            busy = outstanding[c.node_id]
        else:
            inflight = facts.get("inflight", 0)
            busy = inflight if isinstance(inflight, int) and inflight > 0 else 0
        slots = slots_of(facts)
        rel = min(1.0, max(0.0, reliability.get(c.node_id, prior)))
        healthy = rel >= RELIABILITY_GATE and c.node_id not in failing
        suspect = c.state == "suspect"
        cost = (busy + 1 + RELIABILITY_WEIGHT * (1 - rel)) / slots
        rtt = 0.0 if c.is_self else c.rtt
        score = Score(healthy, rel, busy, slots, cost, rtt, suspect)
        tier = 2 if suspect else 0 if healthy else 1
        key = (tier, cost, _NO_RTT if rtt is None else rtt,
               _tiebreak(salt, c.node_id), c.node_id)  # fmt: skip
        keyed.append((key, score))
    best = heapq.nsmallest(max_candidates, keyed, key=lambda ks: ks[0])
    return RouteDecision(
        model=model,
        order=tuple(key[-1] for key, _ in best),
        scores={key[-1]: score for key, score in best},
        ruled_out=ruled_out,
        counts=counts,
    )
