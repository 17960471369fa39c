"""The owner election's claiming side: place a task over our view, claim the next
epoch when we rank for it, and hold the claim while it settles (split from the lease
service).

Every node runs the same placement (`leases.placement`) over its own view. The
first-ranked node claims at once; views can differ (records, reliability decay), so if
a task is still unclaimed later, the node ranked k-th claims after k fallback steps:
progress without agreement, safety from the table's `merge`. A claim that still
stands after ``settle_time`` is handed to the service to start.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Final

from swim import Member

from .._log import event, get_logger
from ..leases import LeaseConfig, LeaseTable, TaskEntry
from ..leases.election import claim_stands, claim_wait, start_time
from ..leases.placement import Placement, committed_resources, failed_nodes, place
from ..leases.reliability import earned_reliability, prior_reliability
from ..record import NodeRecord
from .lease_view import build_candidates

__all__ = ["FALLBACK_STEP_MIN", "LeaseClaims"]

#: Shortest wait of a node ranked k-th per rank before it claims an unclaimed task.
FALLBACK_STEP_MIN: Final = 1.0

_log = get_logger("leases")


class LeaseClaims:
    """Args:
    config, table, me, rng: the lease service's.
    members, record_of: the membership view and the signed records.
    draining: whether we take new work (a draining node claims nothing).
    gossip, local: the service's persist-then-broadcast and lapsed-operation guard.
    recheck_at: asks the service to place again no later than the given time.
    """

    def __init__(
        self,
        config: LeaseConfig,
        table: LeaseTable,
        me: str,
        rng: random.Random,
        *,
        members: Callable[[], list[Member]],
        record_of: Callable[[str], NodeRecord | None],
        draining: Callable[[], bool],
        gossip: Callable[[str, bytes], Awaitable[None]],
        local: Callable[..., bytes | None],
        recheck_at: Callable[[float], None],
    ) -> None:
        self.config, self.table, self.me, self._rng = config, table, me, rng
        self._members, self._record_of, self._draining = members, record_of, draining
        self._gossip, self._local, self._recheck_at = gossip, local, recheck_at
        self.settling: dict[str, tuple[int, float]] = {}  # our claims: epoch, claimed at
        self.why: dict[str, str] = {}  # pending task -> last placement explanation
        self._unclaimed: dict[tuple[str, int], float] = {}  # (task, epoch) -> first seen
        # At least `lease_ttl`: a fallback claim is for views that disagree so that
        # nobody claims, and a shorter step fired while the first claim was still on
        # its way to us (2 s under load at 20 daemons): one more start of the epoch.
        self._fallback_step = max(FALLBACK_STEP_MIN, 4 * config.settle_time, config.lease_ttl)

    def placement(
        self, entry: TaskEntry, now: float, exclude: set[str], *, fresh: bool = False
    ) -> Placement:
        """Where `entry` should run over our view, preferring nodes it has not failed on.
        The view hides our own recent lease endings (`LeaseTable.placement_view`) unless
        `fresh`."""
        assert entry.spec is not None
        if fresh:
            view, outcomes = list(self.table), self.table.outcomes()
        else:
            view, outcomes = self.table.placement_view(now)
        rel = earned_reliability(outcomes, now, self.config)
        candidates = build_candidates(
            self._members(), self._record_of, rel, prior_reliability(self.config),
            me=self.me, draining=self._draining(), accepting=entry.spec.submitted_by,
        )  # fmt: skip
        committed = committed_resources(view)
        failed = failed_nodes(entry)
        p = place(entry.spec, candidates, config=self.config, rng=self._rng,
                  committed=committed, failed_on=failed, exclude=exclude)  # fmt: skip
        if p.chosen is None and failed:  # prefer other nodes, but retry here if none
            p = place(entry.spec, candidates, config=self.config, rng=self._rng,
                      committed=committed, exclude=exclude)  # fmt: skip
        return p

    async def try_claim(
        self, entry: TaskEntry, epoch: int, now: float, exclude: set[str] | None = None
    ) -> None:
        """Claim `epoch` of `entry` if we rank for it and our fallback wait is over."""
        if entry.spec is None:
            return  # a lease delta came before the spec: anti-entropy brings it
        p = self.placement(entry, now, exclude or set())
        tid = entry.task_id
        self.why[tid] = p.explain() if p.chosen is None else f"placed: {p.explain()}"
        fresh = None
        if p.chosen != self.me and self.table.hides(now):
            fresh = self.placement(entry, now, exclude or set(), fresh=True)
        wait = claim_wait(self.me, p, fresh, self.config, self._fallback_step)
        if wait is None or self._draining() or epoch <= entry.epoch:
            return
        ambiguous = fresh is not None and fresh.chosen == self.me
        if ambiguous:
            assert fresh is not None
            p = fresh
        since = self._unclaimed.setdefault((tid, epoch), now)
        if now - since < wait:
            self._recheck_at(since + wait)
            return
        self._unclaimed.pop((tid, epoch), None)
        delta = self._local(self.table.claim, tid, epoch, p.rank_of(self.me), p.explain(), now)
        if delta is None:
            return
        # `settled` starts it at `at + settle_time`: a delayed claim settles longer,
        # unless its wait (`self_view_lag`, first only on our fresh view) was itself the
        # wait for a competing claim.
        delayed = now > since and not ambiguous
        self.settling[tid] = (
            epoch,
            start_time(now, self.config, waited=delayed) - self.config.settle_time,
        )
        event(_log, 20, "lease.claimed", task=tid, epoch=epoch, waited=round(now - since, 3))
        await self._gossip(f"l/{tid}/{epoch}", delta)

    def hold(self, until: float) -> None:
        """Our table was starved (`TableStalled`): start no settling claim before
        `until`, so the deltas that waited unread meanwhile are merged first."""
        back = until - self.config.settle_time
        self.settling = {t: (e, max(at, back)) for t, (e, at) in self.settling.items()}

    def settled(self, now: float) -> list[tuple[TaskEntry, int]]:
        """Our claims that stood for ``settle_time`` (to start now); lapsed ones dropped."""
        ready = []
        for tid, (epoch, at) in list(self.settling.items()):
            entry = self.table.get(tid)
            if entry is None or not claim_stands(entry, self.me, epoch):
                del self.settling[tid]
            elif now >= at + self.config.settle_time:
                del self.settling[tid]
                ready.append((entry, epoch))
        return ready

    async def place_pending(self, now: float) -> None:
        """Try to claim every task that needs an owner and is not already ours."""
        get = self.table.get
        self._unclaimed = {
            k: t for k, t in self._unclaimed.items() if (e := get(k[0])) and e.epoch < k[1]
        }
        for entry in list(self.table):
            if entry.needs_owner() and entry.task_id not in self.settling:
                await self.try_claim(entry, entry.epoch + 1, now)
