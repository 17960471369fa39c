"""`GranterBook`: records persisted as they change, bounded per submitter, cancels that
wait on a lease settled on time, final records compacted behind a tombstone."""

from __future__ import annotations

import attrs
import pytest

from populi_p2p.leases import Requirements, TaskKind, TaskSpec
from populi_p2p.leases import granter_book as book_module
from populi_p2p.leases.granter_book import GranterBook
from populi_p2p.leases.grants import Ended, GrantRecord, on_finish, on_grant, on_renew

WAIT = 5.0


def spec(n: int, by: str = "a") -> TaskSpec:
    return TaskSpec(TaskKind.BATCH, Requirements(), ("x", str(n)), submitted_by=by,
                    replicas=("a", "b", "c"))  # fmt: skip


def book() -> tuple[GranterBook, list[GrantRecord], list[str]]:
    persisted: list[GrantRecord] = []
    forgotten: list[str] = []
    return (
        GranterBook(WAIT, persist=lambda r: persisted.append(attrs.evolve(r)),
                    forget=forgotten.append),
        persisted, forgotten,
    )  # fmt: skip


def test_a_new_record_is_persisted_and_counted_against_its_submitter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(book_module, "OPEN_OFFERS_PER_MEMBER_MAX", 2)
    b, persisted, _ = book()
    first = b.keep(spec(1), b"s", 0.0)
    assert isinstance(first, GrantRecord) and persisted == [first]
    assert b.keep(spec(1), b"s", 1.0) is first and len(persisted) == 1  # kept, not new
    assert isinstance(b.keep(spec(2), b"s", 0.0), GrantRecord)
    assert b.keep(spec(3), b"s", 0.0) == "offers_over_bound"
    assert isinstance(b.keep(spec(4, by="z"), b"s", 0.0), GrantRecord)  # another submitter
    first.ended = Ended.SUCCEEDED  # a final record no longer counts as open
    b.changed(first)
    assert isinstance(b.keep(spec(3), b"s", 0.0), GrantRecord)
    assert len(b) == 4


def _cancelling(b: GranterBook) -> GrantRecord:
    rec = b.keep(spec(1), b"s", 0.0)
    assert isinstance(rec, GrantRecord)
    assert on_grant(rec, "a", 1, "o", 0.0, WAIT) is None
    assert on_renew(rec, 1, "o", 1.0) is None
    assert on_finish(rec, 1, "a", Ended.CANCELLED, now=2.0, wait=WAIT) is None
    b.changed(rec)
    return rec


def test_a_cancel_waiting_on_a_lease_settles_when_it_lapses() -> None:
    b, persisted, _ = book()
    rec = _cancelling(b)
    assert rec.ended is Ended.CANCELLING and b.next_deadline() == 1.0 + WAIT
    assert b.settle(1.0 + WAIT - 0.1) == [] and rec.ended is Ended.CANCELLING
    assert b.settle(1.0 + WAIT) == [rec]
    assert rec.final and persisted[-1].ended is Ended.CANCELLED
    assert b.next_deadline() is None and b.settle(99.0) == []


def test_a_restart_waits_a_whole_lease_again_before_a_cancel_settles() -> None:
    b, persisted, _ = book()
    _cancelling(b)
    again, _, _ = book()
    again.load([attrs.evolve(persisted[-1])], 50.0)
    assert again.next_deadline() == 50.0 + WAIT
    assert again.settle(50.0 + WAIT - 0.1) == []
    assert [r.ended for r in again.settle(50.0 + WAIT)] == [Ended.CANCELLED]


def test_final_records_are_dropped_after_retention_and_their_ids_kept_a_while() -> None:
    b, _, forgotten = book()
    rec = b.keep(spec(1), b"s", 0.0)
    assert isinstance(rec, GrantRecord)
    rec.ended = Ended.CANCELLED
    b.changed(rec)
    b.compact(10.0, keep=5.0, tombstones=100.0)  # final since 10
    assert len(b) == 1
    b.compact(15.0, keep=5.0, tombstones=100.0)
    assert len(b) == 0 and forgotten == [rec.task_id] and b.compacted(rec.task_id)
    assert b.keep(spec(1), b"s", 16.0) == "offers_compacted"  # a late offer stays out
    b.compact(115.0, keep=5.0, tombstones=100.0)
    assert not b.compacted(rec.task_id)
