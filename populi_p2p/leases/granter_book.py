"""`GranterBook`: this node's granter records, as `LeaseAgent` keeps them.

Why apart from the agent: the records have their own housekeeping, none of it a rule of
agreement (those are in `grants.py`): each change is persisted before the agent answers;
the unfinished offers each submitter holds here are counted, so one member cannot make
this node store without bound; a cancel that waits on a live lease (`CANCELLING`) is
settled when the lease lapses; and final records are dropped after
`finished_retention`, their ids kept for `tombstone_retention` so a late offer cannot
bring one back open. Sans-IO like the agent: `now` comes in, persistence goes out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Final

from ._spec import TaskSpec
from .grants import Ended, GrantRecord, settle_cancel, settles_at

__all__ = ["OPEN_OFFERS_PER_MEMBER_MAX", "GranterBook"]

#: Unfinished tasks one submitter may have this node hold as a granter.
OPEN_OFFERS_PER_MEMBER_MAX: Final = 20_000


class GranterBook:
    """The granter records by task id, with what keeps them bounded and settled.

    `wait` is ``lease_ttl * clock_margin``. `records` is the live dict (read it; change
    records through `keep`, `changed` and `settle`)."""

    def __init__(
        self,
        wait: float,
        *,
        persist: Callable[[GrantRecord], None],
        forget: Callable[[str], None],
    ) -> None:
        self.records: dict[str, GrantRecord] = {}
        self._wait = wait
        self._persist, self._forget = persist, forget
        self._open_by: dict[str, int] = {}  # submitter -> unfinished records held here
        self._cancelling: dict[str, float] = {}  # CANCELLING records: when each settles
        self._final_since: dict[str, float] = {}  # final records: since when
        self._compacted: dict[str, float] = {}  # dropped final records: when

    def __iter__(self) -> Iterator[GrantRecord]:
        return iter(self.records.values())

    def __len__(self) -> int:
        return len(self.records)

    def compacted(self, task_id: str) -> bool:
        """Whether this task's final record was dropped (within `tombstone_retention`)."""
        return task_id in self._compacted

    def next_deadline(self) -> float | None:
        """When a `CANCELLING` record settles on its own (None: none waits)."""
        return min(self._cancelling.values(), default=None)

    def load(self, records: Collection[GrantRecord], now: float) -> None:
        """After a restart: each lease counted live again for a whole wait, since we
        cannot know when we last renewed it (so a settling cancel waits it again)."""
        for rec in records:
            rec.heard_at, rec.renewed = now, True
            self.records[rec.task_id] = rec
            if rec.ended is Ended.CANCELLING:
                self._cancelling[rec.task_id] = settles_at(rec, self._wait)
            if not rec.final:
                by = rec.spec.submitted_by
                self._open_by[by] = self._open_by.get(by, 0) + 1

    def keep(self, spec: TaskSpec, signature: bytes, now: float) -> GrantRecord | str:
        """The record of `spec`'s task, new (and persisted) if need be; or why not: a
        counter's name."""
        tid = spec.task_id()
        rec = self.records.get(tid)
        if rec is not None:
            return rec
        if tid in self._compacted:
            return "offers_compacted"
        by = spec.submitted_by
        if self._open_by.get(by, 0) >= OPEN_OFFERS_PER_MEMBER_MAX:
            return "offers_over_bound"
        self._open_by[by] = self._open_by.get(by, 0) + 1
        rec = self.records[tid] = GrantRecord(tid, spec, signature, heard_at=now)
        self._persist(rec)
        return rec

    def changed(self, rec: GrantRecord) -> None:
        """Persist a record that changed, and keep what follows from its state."""
        self._persist(rec)
        tid = rec.task_id
        if rec.ended is Ended.CANCELLING:
            self._cancelling[tid] = settles_at(rec, self._wait)
        else:
            self._cancelling.pop(tid, None)
        if rec.final:
            by = rec.spec.submitted_by
            self._open_by[by] = max(0, self._open_by.get(by, 0) - 1)

    def settle(self, now: float) -> list[GrantRecord]:
        """`CANCELLING` records whose owner's lease lapsed here become final (and are
        persisted): those."""
        settled = []
        for tid, at in list(self._cancelling.items()):
            rec = self.records.get(tid)
            if rec is None or rec.ended is not Ended.CANCELLING:
                del self._cancelling[tid]
            elif now >= at and settle_cancel(rec, now, self._wait):
                self.changed(rec)
                settled.append(rec)
        return settled

    def compact(self, now: float, keep: float, tombstones: float) -> None:
        """Drop final records after `keep` seconds; forget their ids after `tombstones`."""
        for tid, rec in list(self.records.items()):
            if not rec.final:
                continue
            since = self._final_since.setdefault(tid, now)
            if since + keep <= now:
                del self.records[tid], self._final_since[tid]
                self._forget(tid)
                self._compacted[tid] = now
        horizon = now - tombstones
        for tid in [t for t, at in self._compacted.items() if at <= horizon]:
            del self._compacted[tid]
