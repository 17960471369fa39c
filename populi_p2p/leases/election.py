"""Owner election: pure decisions for claim, settle, start, stop and re-placement.

The protocol, driven by the node (or the simulator) with these functions:

1. Every node runs `placement.place` over its own view (`LeaseTable.placement_view`:
   its own recent lease endings hidden, see `claim_wait`). A node that finds itself
   ranked first and sees the task needing an owner (`should_claim`) claims the next
   epoch with its score as the rank (`LeaseTable.claim`) and gossips the delta.
2. It waits `config.settle_time` (about one gossip round, `start_time`), then starts
   only if `claim_stands`: no higher epoch and no better claim for the same epoch has
   arrived. Concurrent claimants of one epoch resolve by (rank, owner) in `merge`, the
   same way on every replica.
3. A node that already started and sees its claim superseded (`must_stop`) stops at
   once; its result, if it posts one, is fenced out by the epoch.
4. Re-placement: when `LeaseTable.tick` reports `LeaseExpired` (owner dead/left per
   SWIM, or no renewal seen for `lease_ttl` on this node's clock), `replacement_epoch`
   gives the epoch to claim, if the lease is still the expired one; placement then
   runs with the old owner excluded.
"""

from __future__ import annotations

from ._entry import Phase, TaskEntry, TaskPhase
from ._events import LeaseExpired
from .config import LeaseConfig
from .placement import Placement


def should_claim(entry: TaskEntry, me: str, placement: Placement) -> int | None:
    """The epoch `me` should claim now, or None (not needed, or not ranked first)."""
    if not entry.needs_owner() or placement.chosen != me:
        return None
    return entry.epoch + 1


def claim_wait(
    me: str,
    held: Placement,
    fresh: Placement | None,
    config: LeaseConfig,
    fallback_step: float | None = None,
) -> float | None:
    """How long after first seeing an epoch unclaimed `me` waits before claiming it, or
    None: never (someone else should).

    `held` is placed over `LeaseTable.placement_view` (our own lease endings of the last
    `self_view_lag` hidden: others may not know them yet), `fresh` over the whole table
    (None when nothing is hidden). Ranked first on the held view: claim now. First only
    on the fresh view: the others may rank us first (they know our news) or someone
    else (not yet), so wait `self_view_lag` (the news has spread by then) for a
    competing claim before claiming: nobody else may be going to claim it.
    Otherwise, with a `fallback_step`, a node ranked k-th claims after k steps (progress
    when views disagree so that nobody claims).
    """
    if held.chosen == me:
        return 0.0
    if fresh is not None and fresh.chosen == me:
        return config.self_view_lag
    if fallback_step is not None and me in held.ranked:
        return held.ranked.index(me) * fallback_step
    return None


def replacement_epoch(entry: TaskEntry, expired: LeaseExpired) -> int | None:
    """The epoch to claim after `expired`, or None if the lease has moved on since."""
    cur = entry.current
    if cur is None or entry.finished() or entry.cancel is not None:
        return None
    if cur.epoch != expired.epoch or cur.owner != expired.owner:
        return None
    if cur.phase not in (Phase.CLAIMED, Phase.RUNNING):
        return None
    return cur.epoch + 1


def start_time(claimed_at: float, config: LeaseConfig, *, waited: bool = False) -> float:
    """When a claimant may start (its own monotonic clock).

    A claim made after a wait (`claim_wait` > 0: views disagreed, or the first claim was
    slow to come) settles `self_view_lag` longer: another node is likely claiming the
    same epoch at about the same time (the task benchmark at 20 daemons: two or three
    delayed claims of one epoch within 1.5 s, each unseen by the others after
    `settle_time`)."""
    return claimed_at + config.settle_time + (config.self_view_lag if waited else 0.0)


def claim_stands(entry: TaskEntry, me: str, epoch: int) -> bool:
    """True while `me` holds exactly `epoch` and the task is not cancelled or done."""
    return (
        entry.epoch == epoch
        and entry.owner == me
        and entry.phase in (TaskPhase.CLAIMED, TaskPhase.RUNNING)
    )


def must_stop(entry: TaskEntry, me: str, epoch: int) -> bool:
    """True when a node running `epoch` must stop: superseded, lost the tie, or
    cancelled."""
    return not claim_stands(entry, me, epoch)
