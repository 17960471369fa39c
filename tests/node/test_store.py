"""MemberStore: known members and incarnations survive a restart."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from populi_p2p.store import FORGET_AFTER, KnownMember, MemberStore, StoreError


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
