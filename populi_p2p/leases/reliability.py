"""Earned reliability: a decayed Beta posterior over what nodes actually did.

Reliability is never self-reported. Every node computes it for every other node from
outcomes in its own lease table replica: a completed task is a success for its owner; a
lease lost (the task was re-placed while the owner still held it claimed or running)
and a failure the owner itself marked as the node's fault are losses. A plain task
failure (non-zero exit), a release (a drain) and a cancel are nobody's fault and count
for nothing. Each outcome weighs ``0.5 ** (age / half_life)`` where age is measured on
the observer's own monotonic clock, so old evidence fades and the estimate returns to
the prior. The prior (successes, losses) = (1, 3) makes a new node start at 0.25, below
any node that has done some work. The inference router uses this same function.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from ._entry import Phase, TaskEntry
from .config import LeaseConfig


@attrs.frozen
class Outcome:
    """One piece of evidence about `node`, observed at `at` (observer's monotonic time)."""

    node: str
    success: bool
    at: float


def outcomes_of(entry: TaskEntry, at: float) -> list[Outcome]:
    """The evidence one entry holds, stamped with when this replica observed it."""
    out = []
    top = entry.epoch
    for rec in entry.claims:
        if rec.phase is Phase.SUCCEEDED and rec.epoch == top:
            out.append(Outcome(rec.owner, True, at))
        elif rec.phase is Phase.FAILED and rec.result is not None and rec.result.node_fault:
            out.append(Outcome(rec.owner, False, at))
        elif rec.phase in (Phase.CLAIMED, Phase.RUNNING) and rec.epoch < top:
            out.append(Outcome(rec.owner, False, at))  # its lease was taken from it
    return out


def earned_reliability(
    outcomes: Iterable[Outcome], now: float, config: LeaseConfig
) -> dict[str, float]:
    """Posterior mean reliability per node seen in `outcomes`, in [0, 1].

    ``(a0 + S) / (a0 + b0 + S + L)`` with S, L the decayed sums of successes and losses
    and (a0, b0) the prior from `config`. Nodes with no outcomes are absent: use
    `prior_reliability(config)` for them.
    """
    half_life = config.reliability_half_life
    sums: dict[str, list[float]] = {}
    for o in outcomes:
        w = 0.5 ** (max(0.0, now - o.at) / half_life)
        s = sums.setdefault(o.node, [0.0, 0.0])
        s[0 if o.success else 1] += w
    a0, b0 = config.reliability_prior_successes, config.reliability_prior_losses
    return {n: (a0 + s) / (a0 + b0 + s + f) for n, (s, f) in sorted(sums.items())}


def prior_reliability(config: LeaseConfig) -> float:
    """Where a node with no history starts (0.25 with the default prior)."""
    a0, b0 = config.reliability_prior_successes, config.reliability_prior_losses
    return a0 / (a0 + b0)
