"""MemberStore: known members and incarnations survive a restart."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from populi_p2p.store import (
    FORGET_AFTER,
    MAX_STORED_INCARNATION,
    KnownMember,
    MemberStore,
    StoreError,
)


def test_members_and_incarnation_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "members.sqlite3"
    with MemberStore(path) as store:
        assert store.known_members() == []
        assert store.start_incarnation() == 1
        store.remember([KnownMember("a" * 16, "a", "127.0.0.1", 1, 1000.0)])
        store.remember([KnownMember("a" * 16, "a2", "127.0.0.1", 2, 900.0)])  # older sighting
        store.remember([KnownMember("b" * 16, "b", "::1", 3, 1001.0)])
        store.save_incarnation(7)
        store.save_incarnation(3)  # never lowers
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    with MemberStore(path) as store:
        members = store.known_members(now=1002.0)
        assert [m.node_id for m in members] == ["b" * 16, "a" * 16]
        assert members[1] == KnownMember("a" * 16, "a2", "127.0.0.1", 2, 1000.0)
        assert store.start_incarnation() == 8
        assert store.last_incarnation() == 8
        store.forget(["b" * 16])
        assert [m.node_id for m in store.known_members(now=1002.0)] == ["a" * 16]
        # Old members are not offered for rejoin.
        assert store.known_members(now=1000.0 + FORGET_AFTER + 1) == []


def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "members.sqlite3"
    path.write_bytes(b"garbage" * 1000)
    with pytest.raises(StoreError) as info:
        MemberStore(path)
    assert "\n" not in str(info.value)


def test_rows_are_plain_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "members.sqlite3"
    with MemberStore(path) as store:
        store.remember([KnownMember("c" * 16, "c", "10.0.0.1", 7950, 5.0)])
    rows = sqlite3.connect(path).execute("SELECT node_id, port FROM members").fetchall()
    assert rows == [("c" * 16, 7950)]


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory):
    """One store for all hypothesis examples (opening SQLite per example is slow)."""
    with MemberStore(tmp_path_factory.mktemp("store") / "members.sqlite3") as store:
        yield store


@settings(max_examples=300)
@example(2**63)
@example(2**64 - 2)
@example(2**64 - 1)
@example(2**64)
@example(-1)
@example(2**63 - 1)
@given(st.integers(min_value=-(2**70), max_value=2**70) | st.integers(0, 2**65))
def test_save_incarnation_raises_only_store_error(shared_store: MemberStore, n: int) -> None:
    """Issue 7 §2: any int is either stored or refused with a StoreError, never OverflowError."""
    before = shared_store.last_incarnation()
    try:
        shared_store.save_incarnation(n)
    except StoreError as exc:
        assert not 0 <= n <= MAX_STORED_INCARNATION
        assert "\n" not in str(exc)
        assert shared_store.last_incarnation() == before  # a refused value changes nothing
    else:
        assert 0 <= n <= MAX_STORED_INCARNATION
        assert shared_store.last_incarnation() == max(before, n)


def test_start_incarnation_past_the_wire_limit_starts_a_new_session(tmp_path: Path) -> None:
    """Peers may hold us at swim's INCARNATION_MAX: the next run starts over at 0."""
    from swim import INCARNATION_MAX

    for stored in (INCARNATION_MAX, MAX_STORED_INCARNATION):
        with MemberStore(tmp_path / f"m{stored}.sqlite3") as store:
            store.save_incarnation(stored)
            assert store.start_incarnation() == 0
            assert store.last_incarnation() == 0
    with MemberStore(tmp_path / "below.sqlite3") as store:
        store.save_incarnation(INCARNATION_MAX - 1)
        assert store.start_incarnation() == INCARNATION_MAX


def test_member_row_that_overflows_is_a_store_error(tmp_path: Path) -> None:
    with MemberStore(tmp_path / "members.sqlite3") as store, pytest.raises(StoreError):
        store.remember([KnownMember("d" * 16, "d", "10.0.0.1", 2**64, 5.0)])


def test_wal_and_shm_files_are_owner_only(tmp_path: Path) -> None:
    """The docs promise 0600 for every state file; SQLite copies the db's mode to -wal/-shm."""
    path = tmp_path / "members.sqlite3"
    with MemberStore(path) as store:
        store.save_incarnation(1)
        files = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]
        for f in files:
            assert f.exists(), f
            assert oct(f.stat().st_mode & 0o777) == oct(0o600), f


def test_existing_loose_wal_files_are_tightened(tmp_path: Path) -> None:
    path = tmp_path / "members.sqlite3"
    with MemberStore(path) as store:
        store.save_incarnation(1)
        wal = path.with_name(path.name + "-wal")
        path.chmod(0o644)
        wal.chmod(0o644)
        with MemberStore(path) as again:
            assert again.last_incarnation() == 1
        assert oct(wal.stat().st_mode & 0o777) == oct(0o600)
        assert oct(path.stat().st_mode & 0o777) == oct(0o600)
