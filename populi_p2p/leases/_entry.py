"""`TaskEntry` and `merge`: the lease table's join-semilattice, in one place.

Theory of operation
===================
A replica's view of one task is a `TaskEntry`; replicas exchange entries (or parts of
them, "deltas", which are entries too) and combine them with `merge`, the least upper
bound of a join-semilattice. `merge` is commutative, associative and idempotent, so any
two replicas that have seen the same set of deltas, in any order, with any duplication,
hold equal entries. Each part of an entry is a small semilattice, and the entry is their
product:

``spec`` (``None`` < a spec)
    The task id is the hash of the spec's canonical bytes and the decoder checks it, so
    two present specs for one id are equal. A delta may omit the spec (a renewal does);
    the entry then knows the lease but cannot be placed until the spec arrives. Two
    signatures over the same spec (a signer with random nonces) join to the greater
    byte string.

``claims`` (a map epoch -> `ClaimRecord`, keeping the highest `HISTORY_EPOCHS_MAX`)
    The epoch is the fencing token: the current lease is the record of the greatest
    epoch, and every re-placement takes the next epoch. Records of the same epoch join
    as a *lexicographic sum*: the claim with the greater identity ``(rank, owner,
    claim signature, explanation)`` wins outright (the loser's progress is dropped: a
    loser that started must stop), and two copies of the *same* claim keep the one with
    the greater progress ``(phase, result, renewals, progress signature)``, phases in
    the order ``claimed < running < released < failed < succeeded`` and results of one
    phase ordered by their canonical bytes. Progress is one unit because the owner signs
    it as one (phase, renewal counter and result together), so a merged record always
    carries a signature that matches it; a result is posted after the last renewal, so
    ordering phase before renewals loses nothing. (Two results in one epoch only come
    from a faulty owner; success beats failure so a retry is never wasted on a task that
    did complete.)
    Keeping the top K keys of a union is itself associative, so the bound costs no law.

``checkpoint`` (``None`` < a `Checkpoint`, records ordered by `Checkpoint.key`)
    Only the latest snapshot of the task's checkpoint dir is kept: the record of the
    greatest (epoch, sequence) wins, so one entry holds one record whatever the number
    of snapshots. Each is signed by the owner of its epoch; the table checks that
    signer against its claim of that epoch, and refuses a record of an epoch older than
    the one it holds, before merging (`checkpoint_refusal`). Every owner records one at
    its start (what it restored, or nothing), so a late snapshot of an earlier epoch
    loses to it everywhere, whatever the delivery order.

``cancel`` (``None`` < a cancel record, records ordered by (by, signature, proof))
    Cancelled stands above every phase: once any replica has seen a cancel, the task's
    phase is `CANCELLED` everywhere, whatever else arrives later. A cancel record is
    merged only when it is signed by the task's accepting node or carries an operator
    proof (`_cancel.py`; checked by the table before merging, as results are).

The result of epoch *e* is *accepted* only while *e* is the current epoch and the record
carries the owner's signature over ``(task, epoch, owner, result)`` (checked by the
table before merging, so merge only ever sees verified results). A result of an older
epoch stays in the bounded history for reliability and `explain`, but it is never the
accepted result, whatever the delivery order: that is the fencing guarantee.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import attrs
import msgpack

from ._cancel import OperatorProof
from ._spec import OUTPUTS_MAX, Signer, TaskSpec, Verifier, check_output_path

#: Epochs of history kept per task (each a claim with its outcome); older ones drop.
HISTORY_EPOCHS_MAX = 16
#: Bytes of program output kept in a result: a tail for `explain`, not a log store.
OUTPUT_TAIL_MAX = 4096
#: Characters of the placement explanation kept with a claim.
EXPLANATION_CHARS_MAX = 512
SIGNATURE_BYTES_MAX = 128
RENEWALS_MAX = 1 << 62
EPOCH_MAX = 1 << 62
RANK_MAX = 1 << 62

CLAIM_CONTEXT = b"populi-lease-claim\x00"
RESULT_CONTEXT = b"populi-lease-result\x00"
CANCEL_CONTEXT = b"populi-lease-cancel\x00"
PROGRESS_CONTEXT = b"populi-lease-progress\x00"
CHECKPOINT_CONTEXT = b"populi-lease-checkpoint\x00"


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


class Phase(enum.IntEnum):
    """Progress of one claim. ONLY APPEND; values are part of the protocol and the order
    is the join order within an epoch."""

    CLAIMED = 1
    RUNNING = 2
    RELEASED = 3  # the owner handed the task back; the next epoch re-places it
    FAILED = 4
    SUCCEEDED = 5


class TaskPhase(enum.Enum):
    """The phase of a task as a whole, as callers see it."""

    PENDING = "pending"
    CLAIMED = "claimed"
    RUNNING = "running"
    RELEASED = "released"
    FAILED = "failed"
    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"


def _outputs(value: Iterable[TaskOutput]) -> tuple[TaskOutput, ...]:
    return tuple(value)


def _holders(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


#: Nodes a result names as holders of its outputs at most (the owner and k others).
OUTPUT_HOLDERS_MAX = 8


@attrs.frozen
class TaskOutput:
    """One output a task left (`submit --output PATH`), stored as a blob: its path in
    the work dir, the blob's sha256 and size, and whether it is a tar of a directory."""

    path: str
    sha256: str  # 64 lower-case hex characters
    size: int
    unpack: bool = False

    def __attrs_post_init__(self) -> None:
        check_output_path(self.path)
        if (
            not isinstance(self.sha256, str)
            or len(self.sha256) != 64
            or any(c not in "0123456789abcdef" for c in self.sha256)
        ):
            raise ValueError(f"output {self.path}: sha256 must be 64 lower-case hex characters")
        if type(self.size) is not int or not 0 <= self.size <= 1 << 50:
            raise ValueError(f"output {self.path}: bad size")
        if not isinstance(self.unpack, bool):
            raise ValueError(f"output {self.path}: unpack must be true or false")

    def to_wire(self) -> list[Any]:
        return [self.path, self.sha256, self.size, self.unpack]


@attrs.frozen
class TaskResult:
    """What the owner reports when the task ends. `node_fault` marks a failure caused by
    the node (GPU error, OOM kill), which counts against its earned reliability; a plain
    non-zero exit is the task's fault. `final` marks a failure no retry can mend (the
    command is not found or not executable): the task then fails for good, whatever
    retries it has left. It is encoded (and signed) as a sixth element only when true,
    so other results keep their bytes."""

    exit_code: int
    output_tail: bytes = b""
    duration: float = 0.0
    node_fault: bool = False
    signature: bytes = b""
    final: bool = False
    #: The outputs stored as blobs (docs/artifacts.md), and the nodes that held all of
    #: them when the result was posted (the owner first). Encoded, and signed, as a
    #: seventh element only when there are outputs (`final` is then always present).
    outputs: tuple[TaskOutput, ...] = attrs.field(default=(), converter=_outputs)
    holders: tuple[str, ...] = attrs.field(default=(), converter=_holders)

    def __attrs_post_init__(self) -> None:
        if len(self.outputs) > OUTPUTS_MAX or len(self.holders) > OUTPUT_HOLDERS_MAX:
            raise ValueError("too many outputs or holders in a result")
        if bool(self.outputs) != bool(self.holders):
            raise ValueError("a result names holders exactly when it names outputs")

    def _extra(self) -> list[Any]:
        if self.outputs:
            outputs = [o.to_wire() for o in self.outputs]
            return [self.final, [outputs, list(self.holders)]]
        return [True] if self.final else []

    def to_wire(self) -> list[Any]:
        return [
            self.exit_code,
            self.output_tail,
            float(self.duration),
            self.node_fault,
            self.signature,
            *self._extra(),
        ]

    def signed_bytes(self, task_id: str, epoch: int, owner: str) -> bytes:
        body = [
            task_id,
            epoch,
            owner,
            self.exit_code,
            self.output_tail,
            float(self.duration),
            self.node_fault,
            *self._extra(),
        ]
        return RESULT_CONTEXT + _pack(body)

    def sort_key(self) -> bytes:
        return _pack(self.to_wire())


@attrs.frozen
class ClaimRecord:
    """One claim of one epoch, with its progress. The identity (rank, owner, signature,
    explanation) is fixed and signed when the claim is made; the progress (phase,
    renewals, result) grows, each step signed by the owner as `progress_signature`."""

    epoch: int
    rank: int
    owner: str
    signature: bytes
    explanation: str = ""
    phase: Phase = Phase.CLAIMED
    renewals: int = 0
    result: TaskResult | None = None
    progress_signature: bytes = b""
    #: Failed attempts the claimant counted when it claimed (signed with the claim), so
    #: the count travels with every record: a replica that hears epoch e's failure but
    #: missed epoch e-1's still knows how many came before (`TaskEntry.failures`).
    failures_before: int = 0

    def identity(self) -> tuple[int, str, bytes, str, int]:
        return (self.rank, self.owner, self.signature, self.explanation, self.failures_before)

    def progress_key(self) -> tuple[int, bytes, int, bytes]:
        result = b"" if self.result is None else self.result.sort_key()
        return (int(self.phase), result, self.renewals, self.progress_signature)

    def progress_bytes(self, task_id: str) -> bytes:
        """What the owner signs at each step: the claim, phase, renewals and result."""
        result = None if self.result is None else self.result.to_wire()
        body = [
            task_id,
            self.epoch,
            self.owner,
            self.signature,
            int(self.phase),
            self.renewals,
            result,
        ]
        return PROGRESS_CONTEXT + _pack(body)

    def signed_bytes(self, task_id: str) -> bytes:
        return claim_bytes(
            task_id, self.epoch, self.rank, self.owner, self.explanation, self.failures_before
        )

    def to_wire(self) -> list[Any]:
        return [
            self.epoch,
            self.rank,
            self.owner,
            self.signature,
            self.explanation,
            int(self.phase),
            self.renewals,
            None if self.result is None else self.result.to_wire(),
            self.progress_signature,
            self.failures_before,
        ]


def claim_bytes(
    task_id: str, epoch: int, rank: int, owner: str, explanation: str, failures_before: int = 0
) -> bytes:
    """What a claimant signs: the claim's identity, bound to the task and epoch. A zero
    `failures_before` is left out, so claims signed before the field existed verify."""
    body: list[Any] = [task_id, epoch, rank, owner, explanation]
    if failures_before:
        body.append(failures_before)
    return CLAIM_CONTEXT + _pack(body)


@attrs.frozen
class Cancel:
    """A cancel agreed by the task's granters, asked by node `by` and signed by it:
    the accepting node, or any member given an operator's `operator` proof."""

    by: str
    signature: bytes
    operator: OperatorProof | None = None

    def key(self) -> tuple[str, bytes, bytes]:
        return (self.by, self.signature, b"" if self.operator is None else self.operator.sort_key())


def cancel_bytes(task_id: str, by: str) -> bytes:
    return CANCEL_CONTEXT + _pack([task_id, by])


_HEX = frozenset("0123456789abcdef")


@attrs.frozen
class Checkpoint:
    """The latest snapshot of a task's checkpoint dir (docs/artifacts.md), recorded by
    the owner of `epoch` (signed by it): the tar's sha256 and size, the nodes that held
    it when it was recorded (the owner first), and `taken_in`, the epoch whose run
    wrote it (earlier than `epoch` for the record an owner makes at its start of the
    snapshot it restored). `sha256` empty: the epoch started with nothing to restore.
    `seq` orders one epoch's records (0 at the start, then one per snapshot)."""

    epoch: int
    seq: int
    owner: str
    sha256: str = ""
    size: int = 0
    holders: tuple[str, ...] = attrs.field(default=(), converter=_holders)
    taken_in: int = 0
    signature: bytes = b""

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.sha256, str) or (
            self.sha256 and (len(self.sha256) != 64 or not _HEX.issuperset(self.sha256))
        ):
            raise ValueError("checkpoint sha256 must be empty or 64 lower-case hex characters")
        if len(self.holders) > OUTPUT_HOLDERS_MAX:
            raise ValueError(f"a checkpoint names at most {OUTPUT_HOLDERS_MAX} holders")
        if not self.sha256 and (self.size or self.holders or self.taken_in):
            raise ValueError("a checkpoint with no snapshot has no size, holders or epoch")
        if self.sha256 and not (self.holders and 0 < self.taken_in <= self.epoch):
            raise ValueError("a snapshot names its holders and an epoch up to its own")

    def key(self) -> tuple[int, int, str, int, tuple[str, ...], int, str, bytes]:
        """The join order: the greatest (epoch, seq) is the latest; the rest only makes
        the order total (two records of one (epoch, seq) come from a faulty owner)."""
        return (self.epoch, self.seq, self.sha256, self.size, self.holders, self.taken_in,
                self.owner, self.signature)  # fmt: skip

    def signed_bytes(self, task_id: str) -> bytes:
        body = [task_id, self.epoch, self.seq, self.owner, self.sha256, self.size,
                list(self.holders), self.taken_in]  # fmt: skip
        return CHECKPOINT_CONTEXT + _pack(body)

    def to_wire(self) -> list[Any]:
        return [self.epoch, self.seq, self.owner, self.sha256, self.size, list(self.holders),
                self.taken_in, self.signature]  # fmt: skip


def checkpoint_refusal(
    task_id: str, ck: Checkpoint, claims: Iterable[ClaimRecord], held: Checkpoint | None,
    verify: Verifier,
) -> str | None:  # fmt: skip
    """Why a replica refuses a checkpoint record that arrived (None: it may merge it):

    - ``stale``: its epoch is older than the epoch of the record held (a late snapshot
      of an owner that was superseded: the next owner's start record is newer);
    - ``not_owner``: no claim of its epoch by its signer in the entry (claims known
      and arriving with it);
    - ``forged``: its signature is not its signer's.
    """
    if held is not None and ck.epoch < held.epoch:
        return "stale"
    if not any(c.epoch == ck.epoch and c.owner == ck.owner for c in claims):
        return "not_owner"
    if not verify(ck.owner, ck.signed_bytes(task_id), ck.signature):
        return "forged"
    return None


#: Why a checkpoint record is refused (`checkpoint_refusal`), as counted.
CHECKPOINT_REFUSALS = ("stale", "not_owner", "forged")


@attrs.frozen
class TaskEntry:
    """One replica's knowledge of one task: an element of the lattice described above."""

    task_id: str
    spec: TaskSpec | None = None
    spec_signature: bytes = b""
    claims: tuple[ClaimRecord, ...] = ()  # ascending epochs, unique, <= HISTORY_EPOCHS_MAX
    cancel: Cancel | None = None
    checkpoint: Checkpoint | None = None  # the latest snapshot (checked by the table)

    @property
    def current(self) -> ClaimRecord | None:
        """The lease: the claim of the greatest epoch, or None while pending."""
        return self.claims[-1] if self.claims else None

    @property
    def epoch(self) -> int:
        return self.claims[-1].epoch if self.claims else 0

    @property
    def owner(self) -> str | None:
        return self.claims[-1].owner if self.claims else None

    @property
    def phase(self) -> TaskPhase:
        if self.cancel is not None:
            return TaskPhase.CANCELLED
        if not self.claims:
            return TaskPhase.PENDING
        return TaskPhase[self.claims[-1].phase.name]

    @property
    def accepted_result(self) -> TaskResult | None:
        """The result of the current epoch: the only one that counts (fencing)."""
        cur = self.current
        return None if cur is None else cur.result

    def failures(self) -> int:
        """Failed attempts: the most that any claim vouches for (its `failures_before`,
        plus one if it failed), and never fewer than the failed epochs retained. A replica
        that missed an earlier epoch's failure still counts it, and so does one whose
        history has dropped old epochs."""
        chained = max(
            (c.failures_before + (c.phase is Phase.FAILED) for c in self.claims), default=0
        )
        return max(chained, sum(1 for c in self.claims if c.phase is Phase.FAILED))

    def finished(self) -> bool:
        """True when nothing more will happen: cancelled, succeeded, or out of retries."""
        phase = self.phase
        if phase in (TaskPhase.CANCELLED, TaskPhase.SUCCEEDED):
            return True
        if phase is TaskPhase.FAILED and self.spec is not None:
            return self.failures() > self.spec.retry_limit or self.failed_for_good()
        return False

    def failed_for_good(self) -> bool:
        """The current epoch failed in a way no retry can mend (`TaskResult.final`)."""
        result = self.accepted_result
        return self.phase is TaskPhase.FAILED and result is not None and result.final

    def failures_to_report(self) -> int:
        """The failure count an owner sends its granters: a final failure counts as
        the last one the retry limit allows, so they grant nothing again."""
        failures = self.failures()
        if self.failed_for_good() and self.spec is not None:
            failures = max(failures, self.spec.retry_limit + 1)
        return failures

    def needs_owner(self) -> bool:
        """True when the task should be (re-)placed at the next epoch."""
        if self.spec is None or self.finished():
            return False
        return self.phase in (TaskPhase.PENDING, TaskPhase.RELEASED, TaskPhase.FAILED)


def verify_entry(
    entry: TaskEntry, verify: Verifier, known: TaskEntry | None = None
) -> tuple[TaskEntry, int]:
    """Drop every part of `entry` whose signature does not check; return the rest and how
    many parts were dropped. Results must be signed by their claim's owner.

    Parts equal to parts of `known` (this replica's verified entry) are not checked
    again: a renewal repeats its claim, whose signature was verified when it arrived.
    """
    dropped = 0
    tid = entry.task_id
    spec, spec_sig = entry.spec, entry.spec_signature
    if (
        spec is not None
        and not (known is not None and known.spec is not None and known.spec_signature == spec_sig)
        and not spec.verify(spec_sig, verify)
    ):
        spec, spec_sig, dropped = None, b"", dropped + 1
    have = {} if known is None else {c.epoch: c for c in known.claims}
    claims = []
    for c in entry.claims:
        old = have.get(c.epoch)
        if old is not None and old == c:
            claims.append(c)
            continue
        same_claim = old is not None and old.identity() == c.identity()
        if not same_claim and not verify(c.owner, c.signed_bytes(tid), c.signature):
            dropped += 1
            continue
        if not verify(c.owner, c.progress_bytes(tid), c.progress_signature):
            dropped += 1
            continue
        if c.result is not None and not verify(
            c.owner, c.result.signed_bytes(tid, c.epoch, c.owner), c.result.signature
        ):
            dropped += 1
            continue
        claims.append(c)
    cancel = entry.cancel
    if (
        cancel is not None
        and not (known is not None and known.cancel == cancel)
        and not verify(cancel.by, cancel_bytes(tid, cancel.by), cancel.signature)
    ):
        cancel, dropped = None, dropped + 1
    if dropped == 0:
        return entry, 0
    return TaskEntry(tid, spec, spec_sig, tuple(claims), cancel, entry.checkpoint), dropped


def sign_result(
    result: TaskResult, task_id: str, epoch: int, owner: str, sign: Signer
) -> TaskResult:
    return attrs.evolve(result, signature=sign(result.signed_bytes(task_id, epoch, owner)))


####################################################################################
# The join
####################################################################################


def merge_claim(a: ClaimRecord, b: ClaimRecord) -> ClaimRecord:
    """Join two records of the same epoch (lexicographic sum, see the module doc)."""
    if a is b or a == b:
        return a
    ia, ib = a.identity(), b.identity()
    if ia != ib:
        return a if ia > ib else b
    return a if a.progress_key() >= b.progress_key() else b


def merge_claims(a: tuple[ClaimRecord, ...], b: tuple[ClaimRecord, ...]) -> tuple[ClaimRecord, ...]:
    if not b or a == b:
        return a
    if not a:
        return b
    by_epoch = {c.epoch: c for c in a}
    for c in b:
        old = by_epoch.get(c.epoch)
        by_epoch[c.epoch] = c if old is None else merge_claim(old, c)
    epochs = sorted(by_epoch)[-HISTORY_EPOCHS_MAX:]
    return tuple(by_epoch[e] for e in epochs)


def merge(a: TaskEntry, b: TaskEntry) -> TaskEntry:
    """The least upper bound of two entries of the same task.

    Raises:
        ValueError: the entries are of different tasks (a caller bug).
    """
    if a.task_id != b.task_id:
        raise ValueError(f"cannot merge entries of {a.task_id} and {b.task_id}")
    if a is b:
        return a
    if a.spec is None:
        spec, sig = b.spec, b.spec_signature
    elif b.spec is None:
        spec, sig = a.spec, a.spec_signature
    else:
        spec, sig = a.spec, max(a.spec_signature, b.spec_signature)
    claims = merge_claims(a.claims, b.claims)
    if a.cancel is None:
        cancel = b.cancel
    elif b.cancel is None:
        cancel = a.cancel
    else:
        cancel = a.cancel if a.cancel.key() >= b.cancel.key() else b.cancel
    ck = a.checkpoint
    if ck is None or (b.checkpoint is not None and b.checkpoint.key() > ck.key()):
        ck = b.checkpoint
    if (
        spec is a.spec
        and sig == a.spec_signature
        and claims is a.claims
        and cancel is a.cancel
        and ck is a.checkpoint
    ):
        return a
    return TaskEntry(a.task_id, spec, sig, claims, cancel, ck)


def cancel_refusal(entry: TaskEntry) -> str | None:
    """Why cancelling `entry` is refused (one line), or None when a cancel may go ahead.

    A finished task (succeeded, failed for good, or already cancelled) has nothing left
    to cancel, and a cancel would rewrite its outcome as cancelled everywhere. The API
    answers such a cancel with 409 and this line (raise `api.ConflictError` with it).
    A task still pending, claimed, running, released, or failed with retries left may
    be cancelled.
    """
    tid, epoch = entry.task_id, entry.epoch
    if entry.cancel is not None:
        return f"task {tid} is already cancelled; nothing to cancel"
    if entry.phase is TaskPhase.SUCCEEDED:
        return f"task {tid} already succeeded at epoch {epoch}; nothing to cancel"
    if entry.phase is TaskPhase.FAILED and entry.finished():
        return (
            f"task {tid} already failed for good at epoch {epoch} "
            f"({entry.failures()} failed attempts); nothing to cancel"
        )
    return None
