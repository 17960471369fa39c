"""`StoreService` and `open_store`: what the node remembers across restarts, batched,
and a store that cannot be used costing only the memory."""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from populi_p2p.services.memory import FLUSH_INTERVAL, StoreService, open_store
from populi_p2p.store import KnownMember, MemberStore, StoreError
from swim import Event, IncarnationExhausted, SelfRefuted


@attrs.define
class Membership:
    incarnation: int = 5


def known(node_id: str) -> KnownMember:
    return KnownMember(node_id, f"name-{node_id}", "10.0.0.7", 7946, time.time())


def test_open_store_starts_above_the_last_incarnation(tmp_path: Path) -> None:
    path = tmp_path / "members.sqlite3"
    store, first = open_store(path)
    assert store is not None
    store.close()
    store, second = open_store(path)
    assert store is not None and second == first + 1
    store.close()


def test_an_unusable_store_starts_without_memory_above_any_old_incarnation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "dir-not-file").mkdir()
    store, incarnation = open_store(tmp_path / "dir-not-file", clock=lambda: 1_700_000_000.5)
    assert store is None and incarnation == 1_700_000_000
    assert [r.getMessage() for r in caplog.records] == ["store.unusable"]


def test_members_and_the_incarnation_are_written_at_a_flush(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path / "members.sqlite3")
    assert store is not None
    membership = Membership(incarnation=9)
    service = StoreService(store, membership)
    service.remember(known("a"))
    service.remember(known("b"))
    assert service.known_members() == []  # batched until the flush
    service.flush()
    assert sorted(m.node_id for m in service.known_members()) == ["a", "b"]
    assert store.last_incarnation() == 9
    service.forget("a")
    service.remember(known("c"))
    service.forget("c")  # the last word wins
    service.remember(known("b"))
    service.flush()
    assert [m.node_id for m in service.known_members()] == ["b"]
    membership.incarnation = 12
    service.close()
    with MemberStore(tmp_path / "members.sqlite3") as reopened:
        assert reopened.last_incarnation() == 12  # close flushes


def test_remember_after_forget_keeps_the_member(tmp_path: Path) -> None:
    store, _ = open_store(tmp_path / "members.sqlite3")
    service = StoreService(store, Membership())
    service.remember(known("a"))
    service.flush()
    service.forget("a")
    service.remember(known("a"))
    service.flush()
    assert [m.node_id for m in service.known_members()] == ["a"]
    service.close()


def test_without_a_store_nothing_is_remembered_and_nothing_fails() -> None:
    service = StoreService(None, Membership())
    service.remember(known("a"))
    service.flush()
    service.close()
    assert service.known_members() == []


class FailingStore:
    """A store whose writes fail (a full disk)."""

    def remember(self, members: object) -> None:
        raise StoreError("database or disk is full")

    def save_incarnation(self, incarnation: int) -> None:
        raise StoreError("database or disk is full")


def test_a_failed_write_is_logged_and_the_batch_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = StoreService(FailingStore(), Membership())  # type: ignore[arg-type]
    service.remember(known("a"))
    service.flush()
    assert [r.getMessage() for r in caplog.records] == ["store.write_failed"]
    assert service._dirty == {}  # not retried forever


async def test_a_refute_is_saved_at_once_and_members_at_each_flush(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    store, _ = open_store(tmp_path / "members.sqlite3")
    assert store is not None
    membership = Membership(incarnation=7)
    service = StoreService(store, membership)
    send, receive = trio.open_memory_channel[Event](10)
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(service.run, receive))
        await send.send(SelfRefuted(40))
        await trio.testing.wait_all_tasks_blocked()
        assert store.last_incarnation() == 40  # a flush saves 7: this is the refute's
        service.remember(known("a"))
        await trio.sleep(FLUSH_INTERVAL * 1.5)
        assert [m.node_id for m in store.known_members()] == ["a"]
        membership.incarnation = 0  # the core starts a new session at 0
        await send.send(IncarnationExhausted(0))  # set exactly, not raised
        await trio.testing.wait_all_tasks_blocked()
        assert store.last_incarnation() == 0
        nursery.cancel_scope.cancel()
    assert caplog.records == []
    store.close()
