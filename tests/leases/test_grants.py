"""The granter's rules (`populi_p2p.leases.grants`), exhaustively and as a state
machine: one owner per epoch, epochs that only grow, no grant while a lease is live,
nothing after the end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.leases import Requirements, TaskKind, TaskSpec
from populi_p2p.leases.grants import (
    EPOCH_MAX,
    EPOCH_STEP_MAX,
    Ended,
    GrantRecord,
    Refusal,
    on_finish,
    on_grant,
    on_renew,
    settle_cancel,
    settles_at,
)

WAIT = 5.0
REPLICAS = ("a", "b", "c")


def finish(
    rec: GrantRecord, epoch: int, sender: str, ended: Ended, failures: int = 0,
    *, operator: bool = False,
) -> Refusal | None:  # fmt: skip
    """`on_finish` where no lease waits (`wait` 0): a cancel is final at once."""
    return on_finish(rec, epoch, sender, ended, failures, operator=operator, now=0.0, wait=0.0)


def record(retries: int = 2) -> GrantRecord:
    spec = TaskSpec(TaskKind.BATCH, Requirements(), ("x",), retry_limit=retries,
                    submitted_by="a", replicas=REPLICAS)  # fmt: skip
    return GrantRecord(spec.task_id(), spec, b"s" * 64, heard_at=0.0)


def test_an_epoch_is_granted_once_and_never_below() -> None:
    rec = record()
    assert on_grant(rec, "a", 1, "x", 0.0, WAIT) is None
    assert on_grant(rec, "a", 1, "x", 0.1, WAIT) is None  # a repeat of our own grant
    assert on_grant(rec, "a", 1, "y", 0.2, WAIT) is Refusal.STALE  # never to another
    rec.ended = Ended.RELEASED
    assert on_grant(rec, "a", 1, "y", 0.3, WAIT) is Refusal.STALE  # nor at or below
    assert on_grant(rec, "a", 2, "y", 0.3, WAIT) is None
    assert (rec.epoch, rec.owner, rec.ended) == (2, "y", Ended.NO)


def test_a_grant_not_renewed_yet_holds_for_the_take_up_only() -> None:
    """Time for the `Own` and the owner's first round; then a grant nobody took up
    stops blocking the next epoch (not a whole lease's wait)."""
    rec = record()
    assert on_grant(rec, "a", 1, "x", 0.0, WAIT, take_up=1.0) is None
    assert rec.live(0.99, WAIT, take_up=1.0) > 0
    assert on_grant(rec, "a", 2, "y", 0.99, WAIT, take_up=1.0) is Refusal.LEASE_LIVE
    assert on_grant(rec, "a", 1, "x", 0.99, WAIT, take_up=1.0) is None  # the same grant
    assert rec.live(1.0, WAIT, take_up=1.0) == 0
    assert on_grant(rec, "a", 2, "y", 1.0, WAIT, take_up=1.0) is None
    assert on_renew(rec, 2, "y", 1.5) is None
    assert rec.live(1.5 + WAIT - 0.01, WAIT, take_up=1.0) > 0  # renewed: the whole wait


def test_a_live_lease_is_not_granted_away_until_the_wait() -> None:
    rec = record()
    assert on_grant(rec, "a", 1, "x", 0.0, WAIT) is None
    assert on_renew(rec, 1, "x", 3.0) is None
    assert rec.live(3.0 + WAIT - 0.01, WAIT) > 0
    assert on_grant(rec, "a", 2, "y", 3.0 + WAIT - 0.01, WAIT) is Refusal.LEASE_LIVE
    assert on_grant(rec, "a", 2, "y", 3.0 + WAIT, WAIT) is None
    # After the grant the old owner's renewals are refused: it fences itself.
    assert on_renew(rec, 1, "x", 9.0) is Refusal.SUPERSEDED


def test_jumps_and_the_largest_epoch_are_refused() -> None:
    rec = record()
    assert on_grant(rec, "a", 2**62, "evil", 0.0, WAIT) is Refusal.EPOCH_JUMP
    assert on_grant(rec, "a", EPOCH_STEP_MAX + 1, "evil", 0.0, WAIT) is Refusal.EPOCH_JUMP
    assert on_renew(rec, 2**62, "evil", 0.0) is Refusal.NOT_OWNER  # renews only its grant
    rec.epoch = EPOCH_MAX
    rec.ended = Ended.RELEASED
    assert on_grant(rec, "a", EPOCH_MAX + 1, "evil", 0.0, WAIT) is Refusal.EPOCH_JUMP
    assert on_grant(record(), "d", 1, "x", 0.0, WAIT) is Refusal.NOT_REPLICA


@pytest.mark.parametrize("ended", [Ended.SUCCEEDED, Ended.CANCELLED])
def test_a_finished_task_grants_nothing_again(ended: Ended) -> None:
    rec = record()
    by = "x" if ended is Ended.SUCCEEDED else "a"  # the owner ends; "a" accepted the task
    assert on_grant(rec, "a", 1, "x", 0.0, WAIT) is None
    assert finish(rec, 1, by, ended) is None
    assert rec.final
    assert on_grant(rec, "a", 2, "y", 100.0, WAIT) is Refusal.FINISHED
    assert on_renew(rec, 1, "x", 100.0) is Refusal.FINISHED
    assert finish(rec, 1, by, ended) is None  # a repeat is answered alike
    if ended is Ended.SUCCEEDED:  # a cancel of a success is refused
        assert finish(rec, 0, "a", Ended.CANCELLED) is Refusal.FINISHED
        assert finish(rec, 0, "z", Ended.CANCELLED, operator=True) is Refusal.FINISHED


def test_only_the_accepting_node_or_an_operator_cancels() -> None:
    """ "a" accepted the task (`submitted_by`): the owner, another replica or any member
    is refused before anything else is looked at, unless its cancel carries an operator
    proof the caller checked; a refused cancel changes nothing."""
    rec = record()
    assert on_grant(rec, "a", 1, "x", 0.0, WAIT) is None
    for sender in ("x", "b", "z"):
        assert finish(rec, 1, sender, Ended.CANCELLED) is Refusal.NOT_CANCELLER
        assert (rec.ended, rec.final) == (Ended.NO, False)
    rec.ended = Ended.SUCCEEDED  # even a finished task says only "not yours to cancel"
    assert finish(rec, 1, "z", Ended.CANCELLED) is Refusal.NOT_CANCELLER
    for sender, operator in (("a", False), ("z", True), ("x", True)):
        rec = record()
        assert finish(rec, 0, sender, Ended.CANCELLED, operator=operator) is None
        assert rec.final and rec.ended is Ended.CANCELLED


def test_only_the_owner_ends_its_epoch_and_old_epochs_are_fenced_out() -> None:
    rec = record()
    assert on_grant(rec, "a", 1, "x", 0.0, WAIT) is None
    assert finish(rec, 1, "evil", Ended.SUCCEEDED) is Refusal.NOT_OWNER
    assert finish(rec, 2, "evil", Ended.SUCCEEDED) is Refusal.NOT_OWNER  # no new epoch
    assert finish(rec, 1, "x", Ended.RELEASED) is None
    assert on_grant(rec, "a", 2, "y", 0.1, WAIT) is None  # released: granted at once
    assert finish(rec, 1, "x", Ended.SUCCEEDED) is Refusal.SUPERSEDED
    assert not rec.final


def test_failures_count_up_to_the_retry_limit_and_carry_the_owners_count() -> None:
    rec = record(retries=1)
    assert on_grant(rec, "a", 1, "x", 0.0, WAIT) is None
    assert finish(rec, 1, "x", Ended.FAILED, failures=1) is None
    assert rec.failures == 1 and not rec.final
    assert on_grant(rec, "a", 2, "y", 0.0, WAIT) is None  # a failure: retried at once
    # The owner of epoch 2 counts 2 failures (it learnt of the first from others).
    assert finish(rec, 2, "y", Ended.FAILED, failures=2) is None
    assert rec.failures == 2 and rec.final
    assert on_grant(rec, "a", 3, "z", 0.0, WAIT) is Refusal.FINISHED


OPS = st.lists(
    st.tuples(
        st.sampled_from(["grant", "renew", "finish"]),
        st.integers(min_value=0, max_value=12),
        st.sampled_from(["x", "y", "z", "a"]),  # "a" accepted the task: it may cancel
        st.sampled_from(list(Ended)[1:]),
        st.floats(min_value=0.0, max_value=3.0),
    ),
    max_size=40,
)


@settings(max_examples=500, deadline=None)
@given(OPS)
def test_any_sequence_grants_each_epoch_to_one_owner_and_never_goes_back(ops: list) -> None:  # type: ignore[type-arg]
    rec = record()
    now = 0.0
    granted: dict[int, str] = {}
    final = False
    for op, epoch, node, ended, dt in ops:
        now += dt
        before = rec.epoch
        if op == "grant":
            live = rec.live(now, WAIT) > 0
            if on_grant(rec, "a", epoch, node, now, WAIT) is None:
                assert granted.setdefault(epoch, node) == node, "an epoch granted twice"
                assert not final, "a grant after the end"
                assert epoch == before or not live, "a grant while the lease was live"
        elif op == "renew" and rec.epoch:  # only an epoch's winner renews it
            on_renew(rec, rec.epoch, rec.owner, now)
        else:
            was = rec.ended
            refusal = finish(rec, epoch, node, ended)
            if ended is Ended.CANCELLED and node != "a":
                assert refusal is Refusal.NOT_CANCELLER and rec.ended is was
        assert rec.epoch >= before
        final = final or rec.final
        assert rec.final or not final or rec.ended is Ended.CANCELLED


def _renewed_lease() -> GrantRecord:
    rec = record()
    assert on_grant(rec, "a", 1, "x", 0.0, WAIT) is None
    assert on_renew(rec, 1, "x", 1.0) is None  # the owner may start on this answer
    return rec


def test_a_cancel_that_meets_a_renewed_lease_is_final_only_when_the_lease_lapses() -> None:
    rec = _renewed_lease()
    assert on_finish(rec, 1, "a", Ended.CANCELLED, now=2.0, wait=WAIT) is None
    assert rec.ended is Ended.CANCELLING and not rec.final and rec.closed
    # Nothing more is granted or renewed meanwhile: the owner stops.
    assert on_renew(rec, 1, "x", 2.5) is Refusal.FINISHED
    assert on_grant(rec, "a", 2, "y", 9.0, WAIT) is Refusal.FINISHED
    assert on_finish(rec, 1, "a", Ended.CANCELLED, now=3.0, wait=WAIT) is None  # a repeat
    assert rec.ended is Ended.CANCELLING
    assert settles_at(rec, WAIT) == 1.0 + WAIT  # the last renewal here, plus the wait
    assert not settle_cancel(rec, 1.0 + WAIT - 0.01, WAIT) and not rec.final
    assert settle_cancel(rec, 1.0 + WAIT, WAIT)
    assert rec.final and rec.ended is Ended.CANCELLED
    assert not settle_cancel(rec, 9.0, WAIT)  # once


def test_the_owner_ending_its_epoch_settles_a_cancel_at_once() -> None:
    rec = _renewed_lease()
    assert on_finish(rec, 1, "a", Ended.CANCELLED, now=2.0, wait=WAIT) is None
    assert on_finish(rec, 1, "evil", Ended.RELEASED, now=2.1, wait=WAIT) is Refusal.NOT_OWNER
    assert on_finish(rec, 0, "x", Ended.RELEASED, now=2.1, wait=WAIT) is Refusal.SUPERSEDED
    assert rec.ended is Ended.CANCELLING
    assert on_finish(rec, 1, "x", Ended.RELEASED, now=2.2, wait=WAIT) is None
    assert rec.final and rec.ended is Ended.CANCELLED  # a cancel stays a cancel


@pytest.mark.parametrize("case", ["never renewed", "lapsed", "released"])
def test_a_cancel_that_no_start_can_follow_is_final_at_once(case: str) -> None:
    rec = record()
    assert on_grant(rec, "a", 1, "x", 0.0, WAIT) is None
    now = 1.0
    if case == "lapsed":
        assert on_renew(rec, 1, "x", 1.0) is None
        now = 1.0 + WAIT
    elif case == "released":
        assert on_renew(rec, 1, "x", 1.0) is None
        assert finish(rec, 1, "x", Ended.RELEASED) is None
    assert on_finish(rec, 1, "a", Ended.CANCELLED, now=now, wait=WAIT) is None
    assert rec.final and rec.ended is Ended.CANCELLED
