"""The granter's side of ownership: one durable record per task, and the rules by which a
replica grants an epoch, renews a lease, and records how an epoch ended.

Why: a CRDT replicates who owns a task, but it cannot make two nodes agree that only
one of them runs it. So each task names a few replicas (`TaskSpec.replicas`), and an
epoch belongs to an owner only when a majority of them granted it. A granter grants
each epoch at most once, never an epoch at or below one it holds, never while the
current owner's lease is live on its own clock, and never again once the task
succeeded, was cancelled or ran out of retries: single-decree agreement per epoch, as
CASPaxos does it, with the lease rule of Chubby on top (docs/leases.md, "Ownership").

Pure functions over `GrantRecord`s: the caller persists a changed record before it
answers, and passes `now` (its own monotonic clock).
"""

from __future__ import annotations

import enum
from typing import Final

import attrs

from ._spec import TaskSpec

__all__ = [
    "EPOCH_MAX",
    "EPOCH_STEP_MAX",
    "Ended",
    "GrantRecord",
    "Refusal",
    "on_finish",
    "on_grant",
    "on_renew",
    "settle_cancel",
    "settles_at",
]

#: The largest epoch any part of the lease code accepts (the wire's bound).
EPOCH_MAX: Final = (1 << 62) - 1
#: A grant or renewal may move a granter at most this many epochs past what it holds:
#: a granter that was down catches up; nobody jumps to 2**62.
EPOCH_STEP_MAX: Final = 64


class Ended(enum.IntEnum):
    """How the current epoch ended, as its owner (or a canceller) told the granter."""

    NO = 0  # still granted (or epoch 0: never granted)
    RELEASED = 1  # handed back (drain, shutdown): the next epoch may be granted at once
    FAILED = 2  # failed; the next epoch may be granted at once while retries are left
    SUCCEEDED = 3
    CANCELLED = 4
    #: A cancel recorded while the epoch's owner, renewed here, may still start its
    #: task on that renewal: not final until the lease lapses here or the owner says it
    #: is done with the epoch (`settle_cancel`). Refuses grants and renewals already.
    CANCELLING = 5


class Refusal(enum.IntEnum):
    """Why a granter said no. ONLY APPEND: values are on the wire."""

    UNKNOWN = 1  # no spec here (the caller fetches it)
    NOT_REPLICA = 2  # this node is not in the task's replica set
    FINISHED = 3  # succeeded, cancelled or out of retries: nothing runs again
    STALE = 4  # an epoch at or below one this granter holds
    EPOCH_JUMP = 5  # more than EPOCH_STEP_MAX past what this granter holds
    LEASE_LIVE = 6  # the current owner renewed within lease_ttl * clock_margin
    NOT_OWNER = 7  # an end posted by someone who does not hold the epoch
    SUPERSEDED = 8  # a renewal or end of an epoch below the granter's
    NOT_CANCELLER = 9  # a cancel neither by the accepting node nor with an operator key


@attrs.define
class GrantRecord:
    """One granter's knowledge of one task. Everything but `heard_at` is persisted.

    `heard_at` is when, on this granter's clock, it last granted or renewed the current
    epoch; after a restart it is the load time, since the granter cannot know when it
    last renewed (so it waits a whole `lease_ttl * clock_margin` again: safe).
    """

    task_id: str
    spec: TaskSpec
    spec_signature: bytes
    epoch: int = 0
    owner: str = ""
    ended: Ended = Ended.NO
    failures: int = 0
    heard_at: float = 0.0
    #: Whether the owner renewed the current epoch here since it was granted. A grant
    #: its owner never renewed protects nothing: the owner starts only once a majority
    #: renewed, so a proposal that lost its vote does not hold the task for a lease.
    #: Not persisted: True after a restart (a whole wait again, to be safe).
    renewed: bool = True
    #: Who asked for the cancel this record holds, if this granter heard it since it
    #: started: told once the cancel is final. Not persisted.
    cancelled_by: str = attrs.field(default="", eq=False)

    @property
    def final(self) -> bool:
        """Nothing runs again: succeeded, cancelled, or failed past the retry limit."""
        if self.ended in (Ended.SUCCEEDED, Ended.CANCELLED):
            return True
        return self.ended is Ended.FAILED and self.failures > self.spec.retry_limit

    @property
    def closed(self) -> bool:
        """No epoch is granted or renewed again: final, or a cancel settling."""
        return self.final or self.ended is Ended.CANCELLING

    def live(self, now: float, wait: float, take_up: float = 0.0) -> float:
        """Seconds the current lease stays live here (0: grantable). A grant its owner
        has not renewed yet holds for `take_up` only: long enough for the proposer's
        `Own` and the owner's first renewal, short enough that a grant nobody took up
        costs little."""
        if self.epoch == 0 or self.ended is not Ended.NO:
            return 0.0
        return max(0.0, self.heard_at + (wait if self.renewed else take_up) - now)


def on_grant(
    rec: GrantRecord, me: str, epoch: int, owner: str, now: float, wait: float,
    take_up: float = 0.0,
) -> Refusal | None:  # fmt: skip
    """Grant `epoch` to `owner` (mutating `rec`), or say why not. `wait` is
    ``lease_ttl * clock_margin``, `take_up` how long a grant not yet renewed holds
    (`GrantRecord.live`). A repeat of the grant this granter gave is granted again (the
    proposer lost our answer)."""
    if me not in rec.spec.replicas:
        return Refusal.NOT_REPLICA
    if rec.closed:
        return Refusal.FINISHED
    if epoch == rec.epoch and owner == rec.owner and rec.ended is Ended.NO:
        return None
    if epoch <= rec.epoch:
        return Refusal.STALE
    if epoch > rec.epoch + EPOCH_STEP_MAX or epoch > EPOCH_MAX:
        return Refusal.EPOCH_JUMP
    if rec.live(now, wait, take_up) > 0:
        return Refusal.LEASE_LIVE
    rec.epoch, rec.owner, rec.ended, rec.heard_at = epoch, owner, Ended.NO, now
    rec.renewed = False
    return None


def on_renew(rec: GrantRecord, epoch: int, owner: str, now: float) -> Refusal | None:
    """Renew `owner`'s lease of `epoch`, or say why not.

    Only the node this granter granted the epoch to renews here: a granter that voted
    for another node in that epoch, or missed it, refuses (the owner holds a majority
    of grants, so a majority renews it), and no member can take over a lease by
    renewing it in its own name."""
    if rec.closed:
        return Refusal.FINISHED
    if epoch < rec.epoch or (epoch == rec.epoch and rec.ended is not Ended.NO):
        return Refusal.SUPERSEDED
    if epoch > rec.epoch or owner != rec.owner:
        return Refusal.NOT_OWNER
    rec.heard_at, rec.renewed = now, True
    return None


def on_finish(
    rec: GrantRecord, epoch: int, sender: str, ended: Ended, failures: int = 0,
    *, operator: bool = False, now: float, wait: float,
) -> Refusal | None:  # fmt: skip
    """Record how `epoch` ended, or say why not. `wait` is ``lease_ttl * clock_margin``.

    A cancel comes from the task's accepting node (`TaskSpec.submitted_by`), or carries
    an operator proof that the caller checked (`operator`: `_cancel.may_cancel`); any
    other is refused before anything else is looked at. It ends the task whatever its
    epoch, unless it is already final. If this granter renewed the current owner's
    lease, the owner may still start on that renewal, so the cancel is `CANCELLING`
    until the lease lapses here or the owner ends the epoch: a cancel is final only
    when nothing can start after it (I2, docs/leases.md).

    Every other end comes from the epoch's owner, who renewed with a majority before it
    started: an end of an older epoch is superseded (its result is fenced out), and one
    of an epoch this granter never heard of is refused (a member cannot end a task by
    naming a newer epoch). A failure carries the owner's count of failed epochs, itself
    included: the most any granter of its epoch knew, plus one, so a granter that
    missed an earlier failure still counts it."""
    if ended is Ended.CANCELLED:
        return _on_cancel(rec, sender, operator, now, wait)
    if rec.ended is Ended.CANCELLING:
        if epoch == rec.epoch and sender == rec.owner:
            rec.ended = Ended.CANCELLED  # the owner is done with the epoch: settled
            return None
        return Refusal.SUPERSEDED if epoch < rec.epoch else Refusal.NOT_OWNER
    if rec.final:
        # The same outcome again, from this epoch or another: a task that succeeded
        # twice (a result whose answers were lost, then a re-run) succeeded; say so.
        return None if rec.ended is ended else Refusal.FINISHED
    if epoch < rec.epoch:
        return Refusal.SUPERSEDED
    if epoch > rec.epoch or sender != rec.owner:
        return Refusal.NOT_OWNER
    if rec.ended is not Ended.NO:
        return None if rec.ended is ended else Refusal.SUPERSEDED
    rec.ended = ended
    if ended is Ended.FAILED:
        rec.failures = max(rec.failures + 1, min(failures, rec.spec.retry_limit + 1))
    return None


def _on_cancel(
    rec: GrantRecord, sender: str, operator: bool, now: float, wait: float
) -> Refusal | None:
    if sender != rec.spec.submitted_by and not operator:
        return Refusal.NOT_CANCELLER
    if rec.final and rec.ended is not Ended.CANCELLED:
        return Refusal.FINISHED
    if rec.ended is Ended.NO and rec.epoch and rec.renewed and now < rec.heard_at + wait:
        rec.ended = Ended.CANCELLING
    elif rec.ended is not Ended.CANCELLING:
        rec.ended = Ended.CANCELLED
    return None


def settle_cancel(rec: GrantRecord, now: float, wait: float) -> bool:
    """A `CANCELLING` record whose owner's lease has lapsed here becomes final (the
    owner stopped renewing here when the cancel came, so its task stopped by now).
    Whether it changed; `settles_at` says when it will."""
    if rec.ended is not Ended.CANCELLING or now < settles_at(rec, wait):
        return False
    rec.ended = Ended.CANCELLED
    return True


def settles_at(rec: GrantRecord, wait: float) -> float:
    """When a `CANCELLING` record becomes final on its own (this granter's clock)."""
    return rec.heard_at + wait
