"""Route choice: which node serves a request, and in what order the others take over.

Sans-IO and pure, like `swim/`: the caller hands in its view of the mesh (one
`Candidate` per member it knows, with the ``models`` section of its verified record)
and the earned reliability of each node; `choose_route` returns a `RouteDecision` that
explains itself, in the style of a Nomad scheduler pipeline:

1. *Feasibility*, each filter recording why it removed a node: the node is alive (not
   suspect, dead or left), not draining, and its record's ``models`` section lists the
   model (which only happens while one of its engines answers its health poll).
2. *Ranking*, in this order: the model loaded (every survivor has it loaded: the
   section lists only what engines report; a key kept so a future "can load" tier
   ranks below), then earned reliability (`leases.reliability.earned_reliability`,
   the scheduler's own function; nodes without history sit at the prior), then load
   (requests in flight against `capacity`), then round-trip time, then node id (a total
   order, so the same view gives the same route in every process).

The choice and the fallback list are fixed here, before the first byte is sent. At
10,000 candidates only the best `max_candidates` are ranked in full
(``heapq.nsmallest``: O(n log k)).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

__all__ = ["Candidate", "RouteDecision", "choose_route"]

#: Default: how many nodes (the choice plus fallbacks) a decision keeps.
MAX_CANDIDATES: Final = 4
#: Default: requests in flight per model that count as a full node.
DEFAULT_CAPACITY: Final = 4
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
class RouteDecision:
    """The route for one request: `order[0]` serves, the rest take over in turn."""

    model: str
    order: tuple[str, ...]
    #: Per ranked node: (reliability, load, rtt) as used to rank it.
    scores: Mapping[str, tuple[float, float, float | None]]
    #: Per ruled-out node: why (one short phrase).
    ruled_out: Mapping[str, str]
    #: Nodes removed by each filter.
    counts: Mapping[str, int]

    def header(self) -> str:
        """The ``x-populi-route`` header: why the first node was chosen."""
        if not self.order:
            return "none"
        rel, load, rtt = self.scores[self.order[0]]
        rtt_text = "-" if rtt is None else f"{rtt * 1000:.1f}ms"
        return (
            f"loaded;reliability={rel:.3f};load={load:.2f};rtt={rtt_text};"
            f"candidates={len(self.order)};ruled_out={len(self.ruled_out)}"
        )


def _why_not(c: Candidate, model: str) -> str | None:
    if c.state != "alive":
        return c.state
    if c.draining:
        return "draining"
    if model not in c.models:
        return "does not serve the model" if c.models else "no healthy engine"
    return None


def choose_route(
    model: str,
    candidates: Iterable[Candidate],
    reliability: Mapping[str, float],
    prior: float,
    *,
    capacity: int = DEFAULT_CAPACITY,
    max_candidates: int = MAX_CANDIDATES,
) -> RouteDecision:
    """Filter and rank `candidates` for `model`.

    Args:
        reliability: earned reliability per node id; absent nodes get `prior`.
        capacity: in-flight requests that make a node "full" (load 1.0).
        max_candidates: the choice plus at most this many minus one fallbacks.
    """
    ruled_out: dict[str, str] = {}
    counts: dict[str, int] = {}
    keyed: list[tuple[tuple[float, float, float, str], Candidate]] = []
    for c in candidates:
        why = _why_not(c, model)
        if why is not None:
            ruled_out[c.node_id] = why
            counts[why] = counts.get(why, 0) + 1
            continue
        facts = c.models[model]
        inflight = facts.get("inflight", 0)
        load = (inflight if isinstance(inflight, int) else 0) / max(1, capacity)
        rel = reliability.get(c.node_id, prior)
        rtt = 0.0 if c.is_self else (_NO_RTT if c.rtt is None else c.rtt)
        keyed.append(((-rel, load, rtt, c.node_id), c))
    best = heapq.nsmallest(max_candidates, keyed, key=lambda kc: kc[0])
    return RouteDecision(
        model=model,
        order=tuple(c.node_id for _, c in best),
        scores={
            c.node_id: (-key[0], key[1], None if key[2] == _NO_RTT else key[2]) for key, c in best
        },
        ruled_out=ruled_out,
        counts=counts,
    )
