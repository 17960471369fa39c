"""What the lease table reports: small frozen attrs events, returned, never called back."""

from __future__ import annotations

import attrs

from ._entry import TaskEntry, TaskPhase


@attrs.frozen
class TaskChanged:
    """The entry of `task_id` changed here (locally or by a merged delta)."""

    task_id: str
    phase: TaskPhase
    epoch: int
    owner: str | None
    entry: TaskEntry


@attrs.frozen
class StaleResultRejected:
    """A result of an epoch older than the current one arrived or was superseded: it is
    kept in history but never accepted (fencing)."""

    task_id: str
    epoch: int
    owner: str


@attrs.frozen
class LeaseExpired:
    """The current owner is gone (`reason` "dead"/"left") or silent for `lease_ttl` on
    this replica's clock ("silent"): the task should be re-placed at `epoch + 1`."""

    task_id: str
    epoch: int
    owner: str
    reason: str


@attrs.frozen
class TaskCompacted:
    """A finished entry passed its retention and was dropped (its id is tombstoned)."""

    task_id: str


@attrs.frozen
class TableStalled:
    """This replica's ticks were `gap` seconds apart, more than `tick_gap_max`: its
    process was starved, and deltas may still wait unread. Until `until` (its own clock)
    no lease expires here, and a driver starts none of its settling claims."""

    gap: float
    until: float


LeaseEvent = TaskChanged | StaleResultRejected | LeaseExpired | TaskCompacted | TableStalled


@attrs.frozen
class LeaseStatistics:
    """Counters since the table was created (operating errors, not bugs)."""

    deltas_merged: int = 0
    entries_changed: int = 0
    decode_errors: int = 0
    forged_parts_dropped: int = 0
    stale_results_rejected: int = 0
    resurrections_blocked: int = 0
    compacted: int = 0
    anti_entropy_entries_sent: int = 0
    #: Ticks that found the table starved (`TableStalled`).
    stalls: int = 0
    #: Claims or cancels of tasks this table does not hold, not stored.
    unknown_dropped: int = 0
    #: Claims far past the epoch held, or past the largest one (`_table._bounded`).
    claims_out_of_bounds: int = 0
    #: Cancel records by a node other than the accepting one, with no operator proof
    #: that holds (`_cancel.may_cancel`): dropped, as the granters refuse them.
    cancels_refused: int = 0
    #: Checkpoint records refused (`_entry.checkpoint_refusal`): of an epoch older than
    #: the record held, not signed by the owner of their epoch, or with a bad signature.
    checkpoints_refused_stale: int = 0
    checkpoints_refused_not_owner: int = 0
    checkpoints_refused_forged: int = 0
