"""`LeaseTable`: the replicated map task id -> `TaskEntry`, with gossip deltas,
lease-expiry observation, compaction and digest-first anti-entropy.

Local operations return a delta (bytes) to gossip; `apply` merges a remote delta. Every
change is handed to the injected `persist` callable before the call returns, so a
driver that writes it to disk (see `store.py`) has made it durable before the delta can
be gossiped or acknowledged.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Collection, Iterator
from typing import Any

import attrs

from ._cancel import OperatorCheck, OperatorProof, may_cancel, no_operators
from ._entry import (
    EXPLANATION_CHARS_MAX,
    HISTORY_EPOCHS_MAX,
    Cancel,
    Checkpoint,
    ClaimRecord,
    Phase,
    TaskEntry,
    TaskResult,
    cancel_bytes,
    checkpoint_refusal,
    claim_bytes,
    merge,
    sign_result,
    verify_entry,
)
from ._events import (
    LeaseEvent,
    LeaseExpired,
    LeaseStatistics,
    StaleResultRejected,
    TableStalled,
    TaskChanged,
    TaskCompacted,
)
from ._spec import Signer, TaskSpec, Verifier
from .config import LeaseConfig
from .grants import EPOCH_MAX as GRANT_EPOCH_MAX
from .reliability import Outcome, outcomes_of
from .wire import (
    DELTA_BYTES_MAX,
    DecodeError,
    MessageType,
    decode_entries,
    decode_message,
    encode_entries,
    encode_entry,
    encode_message,
    entry_to_wire,
)

#: Leaves of the anti-entropy hash tree: buckets are 16-bit task-id prefixes.
LEAF_BITS = 16
_PREFIX = 8  # bytes of task id in a summary
_LIVE = (Phase.CLAIMED, Phase.RUNNING)


#: A shown claim may be at most this many epochs past the one held (see `_bounded`).
TABLE_EPOCH_JUMP_MAX = 1000


class LeaseError(ValueError):
    """A local operation that makes no sense here (our caller's bug): raised."""


@attrs.frozen
class StateMerge:
    """What `merge_state` produced: events, and bytes to send back to the peer."""

    events: list[LeaseEvent]
    reply: bytes | None


def _entry_hash(entry: TaskEntry) -> int:
    return int.from_bytes(hashlib.blake2b(encode_entry(entry), digest_size=8).digest(), "big")


def _leaf(task_id: str) -> int:
    return int(task_id[: LEAF_BITS // 4], 16)


class LeaseTable:
    """One replica of the lease table.

    Args:
        config: the lease knobs.
        me: this node's id (the owner name in claims it makes).
        sign: signs bytes with this node's key.
        verify: `verify(node_id, data, sig)`; every remote part is checked with it.
        persist: called with each changed entry (and `None`-entry removal via
            `forget`) before the operation returns; default does nothing.
        check_operator: checks the operator proof of a cancel record by a node other
            than the task's accepting node (default: none holds).
    """

    def __init__(
        self,
        config: LeaseConfig,
        me: str,
        sign: Signer,
        verify: Verifier,
        persist: Callable[[TaskEntry], None] | None = None,
        forget: Callable[[str], None] | None = None,
        check_operator: OperatorCheck = no_operators,
    ) -> None:
        self.config = config
        self._check_operator = check_operator
        self.me = me
        self._sign = sign
        self._verify = verify
        self._persist = persist
        self._forget = forget
        self._entries: dict[str, TaskEntry] = {}
        # task id -> (epoch, owner, renewals, seen at): renewals observed on OUR clock.
        self._seen: dict[str, tuple[int, str, int, float]] = {}
        self._finished_since: dict[str, float] = {}
        self._changed_at: dict[str, float] = {}
        self._tombstones: dict[str, float] = {}
        # task id -> (hidden until, entry before, its changed-at, entry after): our own
        # lease endings, not yet in our placement view (`placement_view`).
        self._ended: dict[str, tuple[float, TaskEntry, float, TaskEntry]] = {}
        self._last_tick: float | None = None
        self._hash: dict[str, int] = {}
        self._dirty: dict[str, None] = {}
        # Leaf -> xor of its entries' hashes, only the nonzero ones (an empty table holds
        # nothing), and bits -> the 32-bit bucket hashes of that width, kept up to date
        # leaf by leaf once asked for (`_bucket_hashes`).
        self._leaves: dict[int, int] = {}
        self._buckets: dict[int, array[int]] = {}
        self._stats: dict[str, int] = dict.fromkeys(attrs.fields_dict(LeaseStatistics), 0)

    ################################################################################
    # Reading
    ################################################################################

    def get(self, task_id: str) -> TaskEntry | None:
        return self._entries.get(task_id)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[TaskEntry]:
        return iter(self._entries.values())

    def held_by(self, node: str) -> list[TaskEntry]:
        """Entries whose live lease (claimed or running) belongs to `node`."""
        return [
            e
            for tid in self._seen
            if (e := self._entries[tid]).owner == node
            and e.current is not None
            and e.current.phase in _LIVE
            and e.cancel is None
        ]

    def hides(self, now: float) -> bool:
        """True while `placement_view` hides one of our own lease endings."""
        entries = self._entries
        return any(
            until > now and entries.get(tid) is after
            for tid, (until, _, _, after) in self._ended.items()
        )

    def placement_view(self, now: float) -> tuple[list[TaskEntry], list[Outcome]]:
        """The entries and reliability evidence to place with: the table, except that
        our own lease endings of the last `self_view_lag` are not seen yet.

        Every node ranks over its own view, and news in a node's favour (the capacity
        its finished task frees, its success) reaches the node itself first. A node that
        saw itself better than the others see it would rank itself first while they
        rank someone else first, and both would claim one epoch. Held back, a node sees
        itself at most as well as the others do (news against it, a new claim, is
        local and immediate), so two nodes cannot each rank themselves first over the
        same information.
        """
        entries = self._entries
        changed = self._changed_at
        hidden = False
        for tid, (until, before, at, after) in list(self._ended.items()):
            if until <= now or entries.get(tid) is not after:
                del self._ended[tid]
                continue
            if not hidden:
                entries, changed, hidden = dict(entries), dict(changed), True
            entries[tid], changed[tid] = before, at
        outcomes = [o for tid, e in entries.items() for o in outcomes_of(e, changed[tid])]
        return list(entries.values()), outcomes

    def outcomes(self) -> list[Outcome]:
        """Reliability evidence in the table, stamped with when this replica last saw
        each entry change (see `reliability.earned_reliability`)."""
        return [
            o for tid, e in self._entries.items() for o in outcomes_of(e, self._changed_at[tid])
        ]

    def check_invariants(self) -> None:
        """Assert the table's internal consistency (tests and simulation call this after
        each step, TigerBeetle-style); O(n), not for production loops."""
        for tid, (epoch, owner, renewals, _) in self._seen.items():
            cur = self._entries[tid].current
            assert cur is not None and cur.phase in _LIVE, tid
            assert (cur.epoch, cur.owner, cur.renewals) == (epoch, owner, renewals), tid
        for tid in self._finished_since:
            assert self._entries[tid].finished(), tid
        assert not self._entries.keys() & self._tombstones.keys()
        assert self._entries.keys() == self._changed_at.keys()
        for tid, e in self._entries.items():
            assert e.task_id == tid
            epochs = [c.epoch for c in e.claims]
            assert epochs == sorted(set(epochs)) and len(epochs) <= HISTORY_EPOCHS_MAX, tid
        self._flush()
        leaves: dict[int, int] = {}
        for tid, h in self._hash.items():
            leaves[_leaf(tid)] = leaves.get(_leaf(tid), 0) ^ h
        assert self._hash.keys() == self._entries.keys()
        nonzero = {leaf: h for leaf, h in leaves.items() if h}
        assert self._leaves == nonzero, "stale leaves"
        for bits, buckets in self._buckets.items():
            assert buckets == self._bucket_hashes_from_leaves(bits), "stale buckets"

    def statistics(self) -> LeaseStatistics:
        return LeaseStatistics(**self._stats)

    ################################################################################
    # Local operations: each returns the delta to gossip
    ################################################################################

    def submit(self, spec: TaskSpec, now: float) -> tuple[str, bytes]:
        """Accept a task here: sign its spec and return (task id, delta)."""
        if spec.submitted_by != self.me:
            raise LeaseError(f"spec submitted_by {spec.submitted_by!r} is not this node")
        tid = spec.task_id()
        delta = TaskEntry(tid, spec, spec.sign(self._sign))
        self._install(delta, now, [])
        return tid, encode_entries([delta])

    def claim(self, task_id: str, epoch: int, rank: int, explanation: str, now: float) -> bytes:
        """Claim `epoch` of a task for this node (see `election.should_claim`)."""
        entry = self._need(task_id)
        if epoch <= entry.epoch:
            raise LeaseError(f"epoch {epoch} of {task_id} is not above {entry.epoch}")
        explanation = explanation[:EXPLANATION_CHARS_MAX]
        before = entry.failures()
        sig = self._sign(claim_bytes(task_id, epoch, rank, self.me, explanation, before))
        rec = ClaimRecord(epoch, rank, self.me, sig, explanation, failures_before=before)
        rec = self._signed(rec, task_id)
        return self._local(TaskEntry(task_id, claims=(rec,)), now)

    def mark_running(self, task_id: str, now: float) -> bytes:
        return self._advance(task_id, now, phase=Phase.RUNNING)

    def renew(self, task_id: str, now: float) -> bytes:
        cur = self._mine(task_id)
        return self._advance(task_id, now, renewals=cur.renewals + 1)

    def release(self, task_id: str, now: float) -> bytes:
        """Hand the task back (drain, shutdown): the next epoch re-places it."""
        return self._advance(task_id, now, phase=Phase.RELEASED)

    def record_checkpoint(self, task_id: str, ck: Checkpoint, now: float) -> bytes:
        """Record the latest snapshot of our current epoch (`ck`, unsigned, by us),
        signed; the delta carries the claim it belongs to.

        Raises:
            LeaseError: we do not hold the task's live lease of `ck.epoch`, or a record
                as late or later is held.
        """
        cur = self._mine(task_id)
        if ck.owner != self.me or ck.epoch != cur.epoch or cur.phase not in _LIVE:
            raise LeaseError(f"{task_id}: epoch {ck.epoch} is not our live lease")
        held = self._need(task_id).checkpoint
        if held is not None and (held.epoch, held.seq) >= (ck.epoch, ck.seq):
            raise LeaseError(f"{task_id}: checkpoint {held.epoch}.{held.seq} is held already")
        signed = attrs.evolve(ck, signature=self._sign(ck.signed_bytes(task_id)))
        return self._local(TaskEntry(task_id, claims=(cur,), checkpoint=signed), now)

    def post_result(self, task_id: str, result: TaskResult, now: float) -> bytes:
        """Record this owner's result, signed, with SUCCEEDED (exit 0) or FAILED."""
        cur = self._mine(task_id)
        signed = sign_result(result, task_id, cur.epoch, self.me, self._sign)
        phase = Phase.SUCCEEDED if result.exit_code == 0 else Phase.FAILED
        return self._advance(task_id, now, phase=phase, result=signed)

    def cancel(self, task_id: str, now: float, operator: OperatorProof | None = None) -> bytes:
        """Record a cancel the granters agreed (by us: the accepting node, or with an
        operator's proof, which then travels with the record).

        Raises:
            LeaseError: unknown task, or a cancel that every other table would drop.
        """
        spec = self._need(task_id).spec
        why = may_cancel(task_id, spec, self.me, operator, self._check_operator, fresh=False)
        if why is not None:
            raise LeaseError(f"{task_id}: this node may not cancel it ({why})")
        sig = self._sign(cancel_bytes(task_id, self.me))
        return self._local(TaskEntry(task_id, cancel=Cancel(self.me, sig, operator)), now)

    def full_delta(self, task_id: str) -> bytes:
        """The whole entry as a delta (e.g. to re-gossip a spec)."""
        return encode_entries([self._need(task_id)])

    def _need(self, task_id: str) -> TaskEntry:
        entry = self._entries.get(task_id)
        if entry is None:
            raise LeaseError(f"unknown task {task_id}")
        return entry

    def _mine(self, task_id: str) -> ClaimRecord:
        cur = self._need(task_id).current
        if cur is None or cur.owner != self.me:
            raise LeaseError(f"{task_id}: this node does not hold the current lease")
        return cur

    def _advance(self, task_id: str, now: float, **changes: Any) -> bytes:
        cur = self._mine(task_id)
        if "phase" in changes and changes["phase"] < cur.phase:
            raise LeaseError(f"{task_id}: phase {cur.phase.name} cannot go back")
        rec = self._signed(attrs.evolve(cur, **changes), task_id)
        before, at = self._entries[task_id], self._changed_at[task_id]
        delta = self._local(TaskEntry(task_id, claims=(rec,)), now)
        lag = self.config.self_view_lag
        if cur.phase in _LIVE and rec.phase not in _LIVE and lag > 0:
            after = self._entries[task_id]
            self._ended[task_id] = (now + lag, before, at, after)
        return delta

    def _signed(self, rec: ClaimRecord, task_id: str) -> ClaimRecord:
        sig = self._sign(rec.progress_bytes(task_id))
        return attrs.evolve(rec, progress_signature=sig)

    def _local(self, delta: TaskEntry, now: float) -> bytes:
        self._install(delta, now, [])
        data = encode_entries([delta])
        assert len(data) <= DELTA_BYTES_MAX, "local delta over DELTA_BYTES_MAX"
        return data

    ################################################################################
    # Remote deltas
    ################################################################################

    def apply(self, delta: bytes, now: float) -> list[LeaseEvent]:
        """Merge a remote delta; junk and forgeries are counted and dropped."""
        try:
            kind, body = decode_message(delta, DELTA_BYTES_MAX)
            if kind is not MessageType.ENTRIES:
                raise DecodeError("a delta carries entries")
            incoming = decode_entries(body)
        except DecodeError:
            self._stats["decode_errors"] += 1
            return []
        self._stats["deltas_merged"] += 1
        events: list[LeaseEvent] = []
        for entry in incoming:
            self._apply_entry(entry, now, events)
        return events

    def _apply_entry(self, entry: TaskEntry, now: float, events: list[LeaseEvent]) -> None:
        if entry.task_id in self._tombstones:
            self._stats["resurrections_blocked"] += 1
            return
        old = self._entries.get(entry.task_id)
        if old is None and entry.spec is None:
            # A claim or cancel of a task we do not hold: not stored (what one member
            # can make us keep stays bounded); the whole entry comes with its spec.
            self._stats["unknown_dropped"] += 1
            return
        entry = self._bounded(entry, old)
        checked, dropped = verify_entry(entry, self._verify, old)
        self._stats["forged_parts_dropped"] += dropped
        checked = self._checkpoint_allowed(self._cancel_allowed(checked, old), old)
        self._install(checked, now, events)

    def _checkpoint_allowed(self, entry: TaskEntry, old: TaskEntry | None) -> TaskEntry:
        """Drop (and count) a checkpoint record that its epoch's owner did not sign, or
        that is older than the one held (`_entry.checkpoint_refusal`)."""
        ck = entry.checkpoint
        held = None if old is None else old.checkpoint
        if ck is None or ck == held:
            return entry
        claims = entry.claims if old is None else (*old.claims, *entry.claims)
        why = checkpoint_refusal(entry.task_id, ck, claims, held, self._verify)
        if why is None:
            return entry
        self._stats[f"checkpoints_refused_{why}"] += 1
        return attrs.evolve(entry, checkpoint=None)

    def _cancel_allowed(self, entry: TaskEntry, old: TaskEntry | None) -> TaskEntry:
        """Drop a cancel record that the granters would refuse: not by the accepting
        node, and no operator proof that holds (checked as of when it was signed)."""
        cancel = entry.cancel
        if cancel is None or (old is not None and old.cancel == cancel):
            return entry
        spec = entry.spec if entry.spec is not None else None if old is None else old.spec
        why = may_cancel(
            entry.task_id, spec, cancel.by, cancel.operator, self._check_operator, fresh=False
        )
        if why is not None:
            self._stats["cancels_refused"] += 1
            return attrs.evolve(entry, cancel=None)
        return entry

    def _bounded(self, entry: TaskEntry, old: TaskEntry | None) -> TaskEntry:
        """Drop claims that jump more than `TABLE_EPOCH_JUMP_MAX` epochs past what we hold
        (or past the chain of claims before them in the delta), or past the largest
        epoch the granters grant: nobody shows an epoch of 2**62. (Epochs are granted
        one after another, but proposals that found no majority skip some.)"""
        base = 0 if old is None else old.epoch
        kept = []
        for rec in entry.claims:
            if rec.epoch <= min(base + TABLE_EPOCH_JUMP_MAX, GRANT_EPOCH_MAX):
                kept.append(rec)
                base = max(base, rec.epoch)
            else:
                self._stats["claims_out_of_bounds"] += 1
        return entry if len(kept) == len(entry.claims) else attrs.evolve(entry, claims=tuple(kept))

    def _install(self, delta: TaskEntry, now: float, events: list[LeaseEvent]) -> None:
        tid = delta.task_id
        old = self._entries.get(tid)
        new = delta if old is None else merge(old, delta)
        # Fencing: count every result that is not (or no longer) the accepted one.
        top = new.epoch
        for rec in delta.claims:
            if rec.result is not None and rec.epoch < top:
                known = old is not None and any(c == rec for c in old.claims)
                if not known:
                    self._stale(tid, rec, events)
        if old is not None and old.accepted_result is not None and old.epoch < top:
            self._stale(tid, old.claims[-1], events)
        if new == old:
            return
        self._entries[tid] = new
        self._changed_at[tid] = now
        self._dirty[tid] = None
        self._stats["entries_changed"] += 1
        if self._persist is not None:
            self._persist(new)
        cur = new.current
        if cur is not None and cur.phase in _LIVE and new.cancel is None:
            seen = self._seen.get(tid)
            if seen is None or seen[:3] != (cur.epoch, cur.owner, cur.renewals):
                self._seen[tid] = (cur.epoch, cur.owner, cur.renewals, now)
        else:
            self._seen.pop(tid, None)
        if new.finished():
            self._finished_since.setdefault(tid, now)
        else:  # a concurrent claim of a later epoch re-opened it: the clock restarts
            self._finished_since.pop(tid, None)
        events.append(TaskChanged(tid, new.phase, new.epoch, new.owner, new))

    def _stale(self, tid: str, rec: ClaimRecord, events: list[LeaseEvent]) -> None:
        self._stats["stale_results_rejected"] += 1
        events.append(StaleResultRejected(tid, rec.epoch, rec.owner))

    ################################################################################
    # Time: lease expiry and compaction
    ################################################################################

    def expired_owners(self, now: float, gone: Collection[str] = ()) -> list[LeaseExpired]:
        """Live leases whose owner is in `gone` (membership says dead or left) or has not
        renewed for `lease_ttl` on this replica's clock, in task-id order."""
        out = []
        ttl = self.config.lease_ttl
        for tid in sorted(self._seen):
            epoch, owner, _, since = self._seen[tid]
            if owner in gone:
                out.append(LeaseExpired(tid, epoch, owner, "gone"))
            elif now - since >= ttl:
                out.append(LeaseExpired(tid, epoch, owner, "silent"))
        return out

    def tick(self, now: float, gone: Collection[str] = ()) -> list[LeaseEvent]:
        """Report expired leases and compact finished entries past their retention.

        A tick more than `tick_gap_max` after the previous one means this replica was
        starved: renewals may be waiting unread in its socket, and its timers fire
        before it reads them. It then expires no lease for `settle_time` (silence is
        counted from `settle_time - lease_ttl` ago at most), and says so with
        `TableStalled` so its driver holds settling claims as long.
        """
        events: list[LeaseEvent] = []
        last, self._last_tick = self._last_tick, now
        if last is not None and now - last > self.config.tick_gap_max:
            until = now + self.config.settle_time
            floor = until - self.config.lease_ttl
            for tid, (epoch, owner, renewals, since) in list(self._seen.items()):
                if since < floor:
                    self._seen[tid] = (epoch, owner, renewals, floor)
            self._stats["stalls"] += 1
            events.append(TableStalled(now - last, until))
        events += self.expired_owners(now, gone)
        for tid in [t for t, (until, *_) in self._ended.items() if until <= now]:
            del self._ended[tid]  # bounded even when nothing is placed meanwhile
        keep = self.config.finished_retention
        for tid, since in list(self._finished_since.items()):
            if since + keep <= now:  # as `compaction_deadline` computes it
                self._compact(tid, now)
                events.append(TaskCompacted(tid))
        horizon = now - self.config.tombstone_retention
        while self._tombstones and (
            next(iter(self._tombstones.values())) <= horizon
            or len(self._tombstones) > self.config.tombstones_max
        ):
            del self._tombstones[next(iter(self._tombstones))]
        return events

    def next_deadline(self) -> float | None:
        """When `tick` next has something to do (for a discrete-event driver)."""
        times = [s[3] + self.config.lease_ttl for s in self._seen.values()]
        if self._last_tick is not None:  # see `tick`: starvation shows as a gap
            times.append(self._last_tick + self.config.tick_gap_max / 2)
        times += [t + self.config.finished_retention for t in self._finished_since.values()]
        return min(times, default=None)

    def compaction_deadline(self) -> float | None:
        """When `tick` next compacts a finished entry (the `LeaseAgent`'s only use of
        the table's clock: it decides ownership itself)."""
        keep = self.config.finished_retention
        return min((t + keep for t in self._finished_since.values()), default=None)

    def _compact(self, tid: str, now: float) -> None:
        del self._finished_since[tid]
        del self._entries[tid]
        del self._changed_at[tid]
        self._seen.pop(tid, None)
        self._ended.pop(tid, None)
        self._dirty[tid] = None
        self._tombstones[tid] = now
        self._stats["compacted"] += 1
        if self._forget is not None:
            self._forget(tid)

    def load(self, entries: Collection[TaskEntry], now: float) -> None:
        """Reload persisted entries after a restart. They are re-verified (a file is
        hostile input too) and not persisted again; renewal clocks start at `now`."""
        persist, self._persist = self._persist, None
        try:
            events: list[LeaseEvent] = []
            for e in entries:
                self._apply_entry(e, now, events)
        finally:
            self._persist = persist

    ################################################################################
    # Anti-entropy: digest -> summary -> push+want -> entries
    ################################################################################

    def _flush(self) -> None:
        leaves = self._leaves
        buckets = self._buckets.items()
        for tid in self._dirty:
            entry = self._entries.get(tid)
            new = 0 if entry is None else _entry_hash(entry)
            old = self._hash.pop(tid, 0)
            if entry is not None:
                self._hash[tid] = new
            change = old ^ new
            if not change:
                continue
            leaf = _leaf(tid)
            value = leaves.pop(leaf, 0) ^ change
            if value:
                leaves[leaf] = value
            for bits, hashes in buckets:
                hashes[leaf >> (LEAF_BITS - bits)] ^= change & 0xFFFFFFFF
        self._dirty.clear()

    def _bucket_hashes(self, bits: int) -> array[int]:
        """The 32-bit xor of each bucket's entry hashes, 2**bits buckets (do not modify).

        Why kept per width rather than folded from the 65,536 leaves per call: a sync
        asks for them on the receive path (every state exchange a seed answers, twice),
        and the fold cost milliseconds of a starved daemon's loop each time. Kept up to
        date in `_flush`, each change costs one xor per width asked for so far (two or
        three in practice: the swim sync's and the table's own).
        """
        self._flush()
        hashes = self._buckets.get(bits)
        if hashes is None:
            hashes = self._buckets[bits] = self._bucket_hashes_from_leaves(bits)
        return hashes

    def _bucket_hashes_from_leaves(self, bits: int) -> array[int]:
        hashes = array("I", bytes(4 << bits))  # C unsigned int: 32 bits where we run
        shift = LEAF_BITS - bits
        for leaf, value in self._leaves.items():
            hashes[leaf >> shift] ^= value & 0xFFFFFFFF
        return hashes

    def _bits(self) -> int:
        buckets = max(1, len(self._entries) // self.config.anti_entropy_entries_per_bucket)
        return min(LEAF_BITS, max(8, (buckets - 1).bit_length()))

    def digest(self, bits: int | None = None) -> bytes:
        """Step 1: 32-bit hashes of 2**bits task-id-prefix buckets (bits sized to n).

        Args:
            bits: a fixed width instead (0..16), for a channel that bounds the digest's
                size (the swim sync carries at most 256 bytes: ``bits=5``).
        """
        bits = self._bits() if bits is None else min(LEAF_BITS, max(0, bits))
        hashes = self._bucket_hashes(bits)
        return encode_message(
            MessageType.DIGEST, [bits, b"".join(h.to_bytes(4, "big") for h in hashes)]
        )

    def state_for(self, remote_digest: bytes, *, direct: bool = False) -> bytes | None:
        """Step 2: given a peer's digest, what differs, or None when nothing does.

        By default a SUMMARY (8-byte id prefix + 32-bit hash per entry of each differing
        bucket), which the peer answers through `merge_state`'s reply. With
        `direct=True` the entries of the differing buckets themselves (one-way, for a
        channel that cannot carry replies; costs more bytes).
        """
        try:
            kind, body = decode_message(remote_digest)
            if kind is not MessageType.DIGEST or not isinstance(body, list) or len(body) != 2:
                raise DecodeError("not a digest")
            bits, blob = body
            if type(bits) is not int or not 0 <= bits <= LEAF_BITS:
                raise DecodeError("bad digest width")
            if not isinstance(blob, bytes) or len(blob) != 4 << bits:
                raise DecodeError("bad digest size")
        except DecodeError:
            self._stats["decode_errors"] += 1
            return None
        mine = self._bucket_hashes(bits)
        differ = {
            b for b, h in enumerate(mine) if h != int.from_bytes(blob[4 * b : 4 * b + 4], "big")
        }
        if not differ:
            return None
        shift = LEAF_BITS - bits
        groups: dict[int, list[str]] = {b: [] for b in sorted(differ)}
        for tid in self._entries:
            group = groups.get(_leaf(tid) >> shift)
            if group is not None:
                group.append(tid)
        if direct:
            cap = self.config.anti_entropy_entries_max
            chosen = [self._entries[t] for g in groups.values() for t in sorted(g)][:cap]
            self._stats["anti_entropy_entries_sent"] += len(chosen)
            return encode_entries(chosen)
        summary = []
        for b, tids in groups.items():
            tids.sort()
            summary.append(
                [
                    b,
                    b"".join(bytes.fromhex(t[: 2 * _PREFIX]) for t in tids),
                    b"".join((self._hash[t] & 0xFFFFFFFF).to_bytes(4, "big") for t in tids),
                ]
            )
        return encode_message(MessageType.SUMMARY, [bits, summary])

    def merge_state(self, payload: bytes, now: float) -> StateMerge:
        """Steps 3 and 4: merge what a peer sent and say what to send back, if anything."""
        try:
            kind, body = decode_message(payload)
            if kind is MessageType.ENTRIES:
                incoming = decode_entries(body)
                events: list[LeaseEvent] = []
                for e in incoming:
                    self._apply_entry(e, now, events)
                return StateMerge(events, None)
            if kind is MessageType.SUMMARY:
                return StateMerge([], self._answer_summary(body))
            if kind is MessageType.PUSH_WANT:
                return self._answer_push_want(body, now)
            raise DecodeError("unexpected anti-entropy message")
        except DecodeError:
            self._stats["decode_errors"] += 1
            return StateMerge([], None)

    def _answer_summary(self, body: Any) -> bytes | None:
        if not isinstance(body, list) or len(body) != 2:
            raise DecodeError("bad summary")
        bits, buckets = body
        if type(bits) is not int or not 0 <= bits <= LEAF_BITS or not isinstance(buckets, list):
            raise DecodeError("bad summary")
        self._flush()
        shift = LEAF_BITS - bits
        remote: dict[bytes, int] = {}
        wanted_buckets: set[int] = set()
        for item in buckets:
            if not (isinstance(item, list) and len(item) == 3):
                raise DecodeError("bad summary bucket")
            b, prefixes, hashes = item
            if type(b) is not int or not 0 <= b < (1 << bits):
                raise DecodeError("bad bucket index")
            if not (isinstance(prefixes, bytes) and isinstance(hashes, bytes)):
                raise DecodeError("bad summary bucket")
            n = len(hashes) // 4
            if len(prefixes) != _PREFIX * n or len(hashes) != 4 * n:
                raise DecodeError("summary lengths disagree")
            wanted_buckets.add(b)
            for i in range(n):
                remote[prefixes[_PREFIX * i : _PREFIX * (i + 1)]] = int.from_bytes(
                    hashes[4 * i : 4 * i + 4], "big"
                )
        mine: dict[bytes, tuple[int, str]] = {}
        for tid in self._entries:
            if _leaf(tid) >> shift in wanted_buckets:
                mine[bytes.fromhex(tid[: 2 * _PREFIX])] = (self._hash[tid] & 0xFFFFFFFF, tid)
        cap = self.config.anti_entropy_entries_max
        push = [
            self._entries[tid]
            for prefix, (h, tid) in sorted(mine.items())
            if remote.get(prefix) != h
        ][:cap]
        compacted = {bytes.fromhex(t[: 2 * _PREFIX]) for t in self._tombstones}
        want = b"".join(
            [
                p
                for p in sorted(remote)
                if (p not in mine or mine[p][0] != remote[p]) and p not in compacted
            ][:cap]
        )
        if not push and not want:
            return None
        self._stats["anti_entropy_entries_sent"] += len(push)

        return encode_message(MessageType.PUSH_WANT, [[entry_to_wire(e) for e in push], want])

    def _answer_push_want(self, body: Any, now: float) -> StateMerge:
        if not isinstance(body, list) or len(body) != 2 or not isinstance(body[1], bytes):
            raise DecodeError("bad push/want")
        incoming = decode_entries(body[0])
        want = body[1]
        if len(want) % _PREFIX:
            raise DecodeError("bad want list")
        events: list[LeaseEvent] = []
        for e in incoming:
            self._apply_entry(e, now, events)
        wanted = {want[i : i + _PREFIX] for i in range(0, len(want), _PREFIX)}
        back = (
            [
                self._entries[t]
                for t in sorted(self._entries)
                if bytes.fromhex(t[: 2 * _PREFIX]) in wanted
            ]
            if wanted
            else []
        )[: self.config.anti_entropy_entries_max]
        self._stats["anti_entropy_entries_sent"] += len(back)
        return StateMerge(events, encode_entries(back) if back else None)
