"""Checkpoint records in the lease table: the spec's fifteenth element, the entry's
sixth, the owner's local record, and the replica's checks before it merges one
(`_entry.checkpoint_refusal`): signed by the owner of its epoch, not older than the
record held."""

from __future__ import annotations

import attrs
import pytest

from populi_p2p.leases import Checkpoint, LeaseError, Requirements, TaskKind, TaskSpec
from populi_p2p.leases.wire import DecodeError, decode_entries, decode_message, encode_entries

from .helpers import fake_sign, spec, table

SHA = "ab" * 32


def _running(owner: str = "b", epoch: int = 1):
    """Tables a (accepting) and `owner`, the task claimed by `owner` at `epoch`."""
    a, o = table("a"), table(owner)
    tid, delta = a.submit(spec(0, by="a"), now=0.0)
    o.apply(delta, 0.0)
    a.apply(o.claim(tid, epoch, 0, "", 1.0), 1.0)
    a.apply(o.mark_running(tid, 1.0), 1.0)
    return a, o, tid


def _ck(owner: str = "b", epoch: int = 1, seq: int = 1, taken_in: int | None = None):
    taken = epoch if taken_in is None else taken_in
    return Checkpoint(epoch, seq, owner, SHA, 10, (owner, "c"), taken)


def test_spec_round_trips_checkpoint_every_and_it_changes_the_id() -> None:
    base = TaskSpec(TaskKind.BATCH, Requirements(), ["x"], submitted_by="n0")
    for every in (0.0, 30.0):
        s = attrs.evolve(base, checkpoint_every=every)
        wire = s.to_wire()
        assert len(wire) == 15 and wire[13] == [] and wire[14] == every
        assert TaskSpec.from_wire(wire) == s and s.task_id() != base.task_id()
    assert len(base.to_wire()) == 9  # off: the old bytes
    wire = attrs.evolve(base, checkpoint_every=5.0).to_wire()
    wire[14] = 5  # one spec, one encoding: a float
    with pytest.raises(ValueError, match="float"):
        TaskSpec.from_wire(wire)
    with pytest.raises(ValueError, match="checkpoint_every"):
        attrs.evolve(base, checkpoint_every=-1.0)


def test_the_owner_records_and_every_replica_merges_the_latest() -> None:
    a, b, tid = _running()
    a.apply(b.record_checkpoint(tid, Checkpoint(1, 0, "b"), 2.0), 2.0)  # the start record
    first = b.record_checkpoint(tid, _ck(seq=1), 2.0)
    second = b.record_checkpoint(tid, _ck(seq=2), 3.0)
    a.apply(second, 3.0)
    a.apply(first, 3.0)  # late and older in the same epoch: merged away, not refused
    held = a.get(tid).checkpoint
    assert held is not None and held.seq == 2 and a.get(tid) == b.get(tid)
    assert a.statistics().checkpoints_refused_stale == 0
    with pytest.raises(LeaseError):
        b.record_checkpoint(tid, _ck(seq=2), 4.0)  # not after the one held
    with pytest.raises(LeaseError):
        a.record_checkpoint(tid, _ck(owner="a"), 4.0)  # a does not own the task


def test_entry_wire_carries_the_checkpoint_as_a_sixth_element() -> None:
    _, b, tid = _running()
    b.record_checkpoint(tid, _ck(), 2.0)
    entry = b.get(tid)
    raw = decode_message(encode_entries([entry]))[1]
    assert len(raw[0]) == 6 and decode_entries(raw) == [entry]
    raw[0][5][5] = ["h"] * 9  # too many holders
    with pytest.raises(DecodeError):
        decode_entries(raw)


def test_a_record_signed_by_a_node_that_did_not_own_the_epoch_is_refused() -> None:
    a, b, tid = _running()
    entry = b.get(tid)
    forged = _ck(owner="c")  # c signs a record of epoch 1, which b owns
    forged = attrs.evolve(forged, signature=fake_sign("c")(forged.signed_bytes(tid)))
    a.apply(encode_entries([attrs.evolve(entry, checkpoint=forged)]), 2.0)
    assert a.get(tid).checkpoint is None
    assert a.statistics().checkpoints_refused_not_owner == 1
    bad_sig = attrs.evolve(_ck(), signature=b"x" * 16)
    a.apply(encode_entries([attrs.evolve(entry, checkpoint=bad_sig)]), 2.0)
    assert a.get(tid).checkpoint is None and a.statistics().checkpoints_refused_forged == 1


def test_a_late_snapshot_of_a_superseded_epoch_is_refused_everywhere() -> None:
    a, b, tid = _running()
    a.apply(b.record_checkpoint(tid, _ck(seq=1), 2.0), 2.0)
    late = b.record_checkpoint(tid, _ck(seq=2), 3.0)  # made, not yet delivered
    c = table("c")
    c.apply(a.full_delta(tid), 3.0)
    a.apply(c.claim(tid, 2, 0, "", 4.0), 4.0)
    restored = Checkpoint(2, 0, "c", SHA, 10, ("c", "b"), 1)  # c's start record
    a.apply(c.record_checkpoint(tid, restored, 4.0), 4.0)
    a.apply(late, 5.0)
    assert a.get(tid).checkpoint.epoch == 2
    assert a.statistics().checkpoints_refused_stale == 1


def test_bad_checkpoint_values_are_refused() -> None:
    with pytest.raises(ValueError):
        Checkpoint(1, 1, "b", "AB" * 32, 1, ("b",), 1)  # upper-case hex
    with pytest.raises(ValueError):
        Checkpoint(1, 1, "b", SHA, 1, (), 1)  # a snapshot names its holders
    with pytest.raises(ValueError):
        Checkpoint(1, 1, "b", SHA, 1, ("b",), 2)  # taken in a later epoch than its own
    with pytest.raises(ValueError):
        Checkpoint(1, 0, "b", "", 5)  # nothing restored has no size
