"""The lattice laws of `merge`, and convergence over random delivery orders."""

from __future__ import annotations

import functools

from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.leases import ClaimRecord, Phase, TaskEntry, TaskPhase, TaskResult, merge
from populi_p2p.leases.wire import decode_entries, decode_message, encode_entries

from .helpers import SPEC, TID, entries

LAWS = settings(derandomize=True, max_examples=200, deadline=None)


@LAWS
@given(entries(), entries())
def test_commutative(a: TaskEntry, b: TaskEntry) -> None:
    assert merge(a, b) == merge(b, a)


@LAWS
@given(entries(), entries(), entries())
def test_associative(a: TaskEntry, b: TaskEntry, c: TaskEntry) -> None:
    assert merge(merge(a, b), c) == merge(a, merge(b, c))


@LAWS
@given(entries())
def test_idempotent(a: TaskEntry) -> None:
    assert merge(a, a) == a


@LAWS
@given(entries(), entries())
def test_merge_is_an_upper_bound(a: TaskEntry, b: TaskEntry) -> None:
    m = merge(a, b)
    assert merge(m, a) == m and merge(m, b) == m
    assert m.epoch == max(a.epoch, b.epoch)


@LAWS
@given(entries())
def test_wire_round_trip(a: TaskEntry) -> None:
    data = encode_entries([a])
    _, body = decode_message(data)
    assert decode_entries(body) == [a]


@LAWS
@given(st.lists(entries(), min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_same_updates_any_order_same_state(updates: list[TaskEntry], rnd) -> None:
    """Every delivery order, with duplicates, gives the same entry."""
    base = functools.reduce(merge, updates)
    shuffled = updates + rnd.sample(updates, k=len(updates) // 2)  # duplicates
    rnd.shuffle(shuffled)
    assert functools.reduce(merge, shuffled) == base


def _claim(
    epoch: int,
    owner: str,
    phase: Phase = Phase.CLAIMED,
    rank: int = 0,
    result: TaskResult | None = None,
) -> ClaimRecord:
    return ClaimRecord(epoch, rank, owner, b"sig-" + owner.encode(), "", phase, 0, result)


def test_stale_result_is_never_accepted_in_any_order() -> None:
    ok = TaskResult(0, b"done", 1.0, False, b"r")
    stale = TaskEntry(TID, SPEC, b"x", (_claim(1, "a", Phase.SUCCEEDED, result=ok),))
    newer = TaskEntry(TID, None, b"", (_claim(2, "b"),))
    for m in (merge(stale, newer), merge(newer, stale)):
        assert m.owner == "b" and m.phase is TaskPhase.CLAIMED
        assert m.accepted_result is None
        assert m.claims[0].result == ok  # kept in history, not accepted


def test_same_epoch_claims_pick_one_winner() -> None:
    a = TaskEntry(TID, claims=(_claim(1, "a", Phase.RUNNING, rank=5),))
    b = TaskEntry(TID, claims=(_claim(1, "b", rank=5),))
    c = TaskEntry(TID, claims=(_claim(1, "c", rank=4),))
    for order in ((a, b, c), (c, b, a), (b, c, a)):
        m = functools.reduce(merge, order)
        assert m.owner == "b" and m.phase is TaskPhase.CLAIMED  # a's progress is dropped


def test_cancel_beats_success() -> None:
    from populi_p2p.leases import Cancel

    done = TaskEntry(
        TID, SPEC, b"x", (_claim(1, "a", Phase.SUCCEEDED, result=TaskResult(0, signature=b"r")),)
    )
    cancel = TaskEntry(TID, cancel=Cancel("n0", b"c"))
    assert merge(done, cancel).phase is TaskPhase.CANCELLED


def test_success_beats_failure_in_one_epoch() -> None:
    s = TaskEntry(TID, claims=(_claim(1, "a", Phase.SUCCEEDED, result=TaskResult(0)),))
    f = TaskEntry(TID, claims=(_claim(1, "a", Phase.FAILED, result=TaskResult(1)),))
    assert merge(s, f).phase is merge(f, s).phase is TaskPhase.SUCCEEDED
