"""Placement: a Nomad-style pipeline of feasibility gates and rankers that explains itself.

Every node runs the same function over its own view; nothing here is random except the
seeded sample order. Gates remove candidates and count why (alive, not draining, not
degraded for the kind, labels, a healthy GPU at all for GPU work, compute capability,
capacity with headroom after the leases the node already holds, not failed there
before). Rankers score the rest in
[0, 1]: capability fit (tighter is better, so big GPUs stay free for big tasks), earned
reliability, current load, RTT from the accepting node, and preferred labels; a member
its view suspects ranks after every alive one. Labels restrict and prefer; they never
create capacity. A rendezvous hash of (task, node)
breaks ties, so equal nodes share work without coordination.

At large scale the pipeline visits candidates in a seeded pseudo-random order (a
random start and a stride coprime with n) and stops once `placement_sample_max`
feasible ones are found, as Nomad's limit iterator does; feasibility of nodes holding
no leases is cached per hardware class, so homogeneous fleets cost one check per class.

A task asking for several GPUs is placed on one node as one unit: the capacity gate
demands that many suitable GPUs free on the same node.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Collection, Iterable, Mapping, Sequence

import attrs

from ._entry import EXPLANATION_CHARS_MAX, Phase, TaskEntry
from ._spec import Requirements, TaskKind, TaskSpec
from .config import LeaseConfig

#: Scores closer than this are a tie for ranking (broken by the rendezvous hash).
SCORE_QUANTUM = 1e-4

#: Gate names, in pipeline order; `Placement.removed` is keyed by them.
GATES = (
    "not_alive",
    "draining",
    "degraded",
    "labels",
    "no_gpu",
    "compute_capability",
    "capacity",
    "failed_here",
    "excluded",
    "anti_affinity",
)


@attrs.frozen
class Gpu:
    """One GPU as Layer A/B report it."""

    vram_allocatable: int  # bytes
    compute_capability: tuple[int, int] = (0, 0)
    healthy: bool = True


def _frozen(value: Collection[object]) -> frozenset[object]:
    return frozenset(value)


@attrs.frozen
class Candidate:
    """A plain view of one node, built by the caller from membership and NodeRecords."""

    node_id: str
    state: str = "alive"  # membership: alive | suspect | dead | left
    draining: bool = False
    degraded_kinds: frozenset[TaskKind] = attrs.field(default=frozenset(), converter=_frozen)
    gpus: tuple[Gpu, ...] = ()
    cpu_cores: float = 0.0
    ram: int = 0
    labels: frozenset[str] = attrs.field(default=frozenset(), converter=_frozen)
    rtt: float | None = None  # seconds from the accepting node; None if unknown
    reliability: float = 0.25  # from `reliability.earned_reliability`
    node_class: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        key = repr(
            (
                self.state,
                self.draining,
                sorted(k.value for k in self.degraded_kinds),
                self.gpus,
                self.cpu_cores,
                self.ram,
                sorted(self.labels),
            )
        ).encode()
        cls = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
        object.__setattr__(self, "node_class", cls)


@attrs.frozen
class Score:
    """One candidate's ranking, each part in [0, 1]; `total` is the weighted sum."""

    total: float
    fit: float
    reliability: float
    load: float
    rtt: float
    preferred: float


@attrs.frozen
class Weights:
    """How much each ranker counts. Reliability and fit lead; RTT is a tie-breaker-ish
    nudge toward the accepting node (where the inputs usually are)."""

    fit: float = 0.3
    reliability: float = 0.3
    load: float = 0.2
    rtt: float = 0.1
    preferred: float = 0.1


@attrs.frozen
class Placement:
    """The decision and its explanation."""

    task_id: str
    chosen: str | None
    ranked: tuple[str, ...]  # chosen first, then the fallbacks
    removed: Mapping[str, int]  # gate -> candidates it removed
    examples: Mapping[str, tuple[str, ...]]  # gate -> a few node ids it removed
    scores: Mapping[str, Score]
    visited: int
    candidates: int

    def rank_of(self, node: str) -> int:
        """The claim rank for `node`: its score quantized (higher wins a tied epoch)."""
        score = self.scores.get(node)
        return 0 if score is None else int(score.total * 1_000_000)

    def explain(self) -> str:
        """A bounded one-paragraph explanation kept with the claim (and, while nothing
        fits, shown as why the task is pending; led by the plain reason when every
        candidate lacks a GPU)."""
        removed = ", ".join(f"{g}={n}" for g, n in self.removed.items() if n)
        top = "; ".join(
            f"{n} {self.scores[n].total:.3f} (fit {self.scores[n].fit:.2f} rel "
            f"{self.scores[n].reliability:.2f} load {self.scores[n].load:.2f})"
            for n in self.ranked[:3]
        )
        text = (
            f"visited {self.visited}/{self.candidates}; removed: {removed or 'none'}; "
            f"top: {top or 'none'}"
        )
        if self.visited and self.removed.get("no_gpu", 0) == self.visited:
            text = f"no GPU: no candidate has a healthy GPU ({self.visited} checked); {text}"
        return text[:EXPLANATION_CHARS_MAX]


def committed_resources(entries: Collection[TaskEntry]) -> dict[str, list[Requirements]]:
    """Requirements of the live leases (claimed or running) per owner, from the table."""
    out: dict[str, list[Requirements]] = {}
    for e in entries:
        cur = e.current
        if cur is None or e.spec is None or e.cancel is not None:
            continue
        if cur.phase in (Phase.CLAIMED, Phase.RUNNING):
            out.setdefault(cur.owner, []).append(e.spec.requirements)
    return out


def replica_nodes(
    task_id: str,
    spec: TaskSpec,
    entries: Iterable[TaskEntry],
    held: Iterable[tuple[str, TaskSpec, str]] = (),
) -> frozenset[str]:
    """Nodes holding another live replica of `spec`'s deployment (the ``spread`` of
    `place`): owners of a claimed or running sibling in the table, and `held`, the
    (task, spec, owner) of epochs granted or proposed but perhaps not yet claimed."""
    mine = spec.deployment
    if mine is None:
        return frozenset()
    out: set[str] = set()
    for e in entries:
        other, cur = e.spec, e.current
        if e.task_id == task_id or other is None or other.deployment is None:
            continue
        if other.deployment.name != mine.name or e.cancel is not None or cur is None:
            continue
        if cur.phase in (Phase.CLAIMED, Phase.RUNNING):
            out.add(cur.owner)
    for tid, other, owner in held:
        sibling = other.deployment is not None and other.deployment.name == mine.name
        if tid != task_id and sibling and owner:
            out.add(owner)
    return frozenset(out)


def failed_nodes(entry: TaskEntry) -> frozenset[str]:
    """Nodes where this task already failed (not tried there again)."""
    return frozenset(c.owner for c in entry.claims if c.phase is Phase.FAILED)


def _suitable_gpus(c: Candidate, r: Requirements, headroom: float) -> list[Gpu]:
    need = r.vram_per_gpu
    return [
        g
        for g in c.gpus
        if g.healthy
        and g.compute_capability >= r.compute_capability_min
        and g.vram_allocatable * (1.0 - headroom) >= need
    ]


#: Suspect members stay placeable (often only slow, as Lifeguard assumes), but rank after
#: every alive one (`place`): a node the proposer suspects may be cut off, and an epoch
#: granted to it is lost for a whole lease's wait. Views need not agree on this, since
#: one proposer places each epoch (agent.py).
_PLACEABLE = ("alive", "suspect")


def _gate(
    c: Candidate, spec: TaskSpec, held: Sequence[Requirements], headroom: float
) -> str | None:
    """The first gate `c` fails, or None when it is feasible (failed/excluded aside)."""
    r = spec.requirements
    if c.state not in _PLACEABLE:
        return "not_alive"
    if c.draining:
        return "draining"
    if spec.kind in c.degraded_kinds:
        return "degraded"
    if not r.labels_required <= c.labels:
        return "labels"
    if r.gpu_count and not any(g.healthy for g in c.gpus):
        return "no_gpu"  # none at all, or every one unhealthy: not a capability question
    if r.gpu_count and not any(
        g.compute_capability >= r.compute_capability_min for g in c.gpus if g.healthy
    ):
        return "compute_capability"
    keep = 1.0 - headroom
    used_gpus = sum(h.gpu_count for h in held)
    if r.gpu_count and len(_suitable_gpus(c, r, headroom)) - used_gpus < r.gpu_count:
        return "capacity"
    if c.cpu_cores * keep - sum(h.cpu_cores for h in held) < r.cpu_cores:
        return "capacity"
    if c.ram * keep - sum(h.ram for h in held) < r.ram:
        return "capacity"
    return None


def _rendezvous(task_id: str, node: str) -> int:
    data = f"{task_id}\x00{node}".encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _fit_and_load(
    c: Candidate, r: Requirements, held: Sequence[Requirements]
) -> tuple[float, float]:
    """The capability-fit and load parts: a function of the node class and its leases."""
    parts = []
    if r.gpu_count:
        vrams = sorted(g.vram_allocatable for g in c.gpus if g.healthy)
        best = vrams[-r.gpu_count :] if len(vrams) >= r.gpu_count else vrams
        parts.append(r.vram_per_gpu / max(1, min(best, default=1)))
    elif c.gpus:
        parts.append(0.0)  # a CPU task on a GPU node wastes the GPUs: worst fit
    if r.cpu_cores and c.cpu_cores:
        parts.append(r.cpu_cores / c.cpu_cores)
    if r.ram and c.ram:
        parts.append(r.ram / c.ram)
    fit = min(1.0, sum(parts) / len(parts)) if parts else 0.5
    if c.gpus:
        load = 1.0 - min(1.0, sum(h.gpu_count for h in held) / len(c.gpus))
    else:
        load = 1.0 - min(1.0, len(held) / max(1.0, c.cpu_cores))
    return fit, load


def _score(
    c: Candidate, r: Requirements, fit: float, load: float, w: Weights, rel_step: float
) -> Score:
    rtt = 0.5 if c.rtt is None else 1.0 / (1.0 + c.rtt / 0.05)
    pref = r.labels_preferred
    preferred = len(pref & c.labels) / len(pref) if pref else 0.0
    rel = min(1.0, max(0.0, c.reliability))
    if rel_step > 0:
        # Coarse on purpose: an owner sees its own result before anyone else does, so
        # a fine reliability ranks it first in its own view only, and two nodes claim
        # one epoch (the simulator's leases-starved found this).
        rel = math.floor(rel / rel_step + 1e-9) * rel_step
    total = (
        w.fit * fit + w.reliability * rel + w.load * load + w.rtt * rtt + w.preferred * preferred
    )
    return Score(total, fit, rel, load, rtt, preferred)


def place(
    spec: TaskSpec,
    candidates: Sequence[Candidate],
    *,
    config: LeaseConfig,
    rng: random.Random,
    committed: Mapping[str, Sequence[Requirements]] | None = None,
    failed_on: Collection[str] = (),
    exclude: Collection[str] = (),
    spread: Collection[str] = (),
    weights: Weights = Weights(),
) -> Placement:
    """Rank `candidates` for `spec`: filter (`_Filter`), score (`_score_all`), rank
    (`_rank`).

    Args:
        committed: requirements of leases each node already holds (see
            `committed_resources`); they reduce its free capacity.
        failed_on: nodes where the task already failed (see `failed_nodes`).
        exclude: nodes not to consider this time (e.g. the owner whose lease expired).
        spread: nodes holding another replica of this deployment (``anti_affinity``).
        rng: seeds the visit order when there are more candidates than the sample.
    """
    committed = committed or {}
    n = len(candidates)
    limit = config.placement_sample_max
    start, stride = _visit_order(n, limit, rng)
    kept = _Filter(spec, committed, failed_on, exclude, spread, config.headroom_fraction)
    visited = kept.run(candidates, start, stride, limit)
    tid = spec.task_id()
    scores = _score_all(kept.feasible, spec.requirements, committed, weights, config)
    ranked = _rank(tid, kept.feasible, scores)
    return Placement(
        task_id=tid,
        chosen=ranked[0] if ranked else None,
        ranked=tuple(ranked),
        removed=kept.removed,
        examples={g: tuple(v) for g, v in kept.examples.items()},
        scores=scores,
        visited=visited,
        candidates=n,
    )


def _visit_order(n: int, limit: int, rng: random.Random) -> tuple[int, int]:
    """(start, stride) of the visit: every candidate in order when they fit the
    sample, else a seeded walk that visits each at most once (a stride coprime with
    `n`)."""
    start, stride = 0, 1
    if n > limit:
        start = rng.randrange(n)
        stride = rng.randrange(1, n)
        while math.gcd(stride, n) != 1:
            stride += 1
    return start, stride


class _Filter:
    """The feasibility checks over the candidates, in visit order: the feasible ones,
    and what each gate removed (counts and up to 3 examples). Gates are cached per
    node class for nodes that hold no lease."""

    def __init__(
        self,
        spec: TaskSpec,
        committed: Mapping[str, Sequence[Requirements]],
        failed_on: Collection[str],
        exclude: Collection[str],
        spread: Collection[str],
        headroom: float,
    ) -> None:
        self.spec = spec
        self.committed = committed
        self.failed_on = failed_on
        self.exclude = exclude
        self.spread = spread
        self.headroom = headroom
        self.removed = dict.fromkeys(GATES, 0)
        self.examples: dict[str, list[str]] = {}
        self.feasible: list[Candidate] = []

    def run(self, candidates: Sequence[Candidate], start: int, stride: int, limit: int) -> int:
        """Visit until `limit` are feasible or all were seen; returns how many were
        visited."""
        spec, committed, headroom = self.spec, self.committed, self.headroom
        failed_on, exclude, spread = self.failed_on, self.exclude, self.spread
        removed, examples, feasible = self.removed, self.examples, self.feasible
        cache: dict[int, str | None] = {}
        n = len(candidates)
        visited = 0
        for i in range(n):
            if len(feasible) >= limit:
                break
            c = candidates[(start + i * stride) % n]
            visited += 1
            held = committed.get(c.node_id, ())
            if held:
                gate = _gate(c, spec, held, headroom)
            else:
                try:
                    gate = cache[c.node_class]
                except KeyError:
                    gate = cache[c.node_class] = _gate(c, spec, (), headroom)
            if gate is None and c.node_id in failed_on:
                gate = "failed_here"
            if gate is None and (c.node_id in exclude or c.node_id in spread):
                gate = "excluded" if c.node_id in exclude else "anti_affinity"
            if gate is not None:
                removed[gate] += 1
                ex = examples.setdefault(gate, [])
                if len(ex) < 3:
                    ex.append(c.node_id)
                continue
            feasible.append(c)
        return visited


def _score_all(
    feasible: Sequence[Candidate],
    req: Requirements,
    committed: Mapping[str, Sequence[Requirements]],
    weights: Weights,
    config: LeaseConfig,
) -> dict[str, Score]:
    """Each feasible node's score; fit and load cached per node class for nodes that
    hold no lease."""
    parts: dict[int, tuple[float, float]] = {}
    scores: dict[str, Score] = {}
    for c in feasible:
        held = committed.get(c.node_id, ())
        if held:
            fit, load = _fit_and_load(c, req, held)
        else:
            try:
                fit, load = parts[c.node_class]
            except KeyError:
                fit, load = parts[c.node_class] = _fit_and_load(c, req, ())
        scores[c.node_id] = _score(c, req, fit, load, weights, config.reliability_step)
    return scores


def _rank(tid: str, feasible: Sequence[Candidate], scores: Mapping[str, Score]) -> list[str]:
    """The nodes best first: alive before suspect, then by quantized total, ties
    broken by the rendezvous hash of (task, node).

    Totals are compared quantized (SCORE_QUANTUM): every node ranks over its own view,
    and inputs such as reliability (decayed on each replica's own clock) differ by
    float noise between views. Compared raw, a near-tie could order A > B on one
    node and B > A on another, so that neither claims; quantized, it is a tie that
    the rendezvous hash breaks the same way everywhere.
    """
    suspect = {c.node_id for c in feasible if c.state == "suspect"}
    return sorted(
        scores,
        key=lambda node: (
            node not in suspect,  # a suspect only when no alive member fits
            round(scores[node].total / SCORE_QUANTUM),
            _rendezvous(tid, node),
        ),
        reverse=True,
    )
