"""The uid allocator (a uid per running task, as systemd's DynamicUser), the sealing of
what a task left, and the isolation level the executor announces."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.executor._config import ExecutorConfig
from populi_p2p.executor._isolation import (
    Isolation,
    UidAllocator,
    parse_uid_range,
    seal_leftovers,
)


def _free(first: int, last: int, named: set[int] = set(), busy: set[int] = set()) -> UidAllocator:  # noqa: B006
    return UidAllocator(first, last, named=named.__contains__, busy=lambda: set(busy))


def test_each_running_task_gets_a_uid_no_other_holds() -> None:
    uids = _free(100, 104)
    held = [uids.allocate() for _ in range(5)]
    assert held == [100, 101, 102, 103, 104]
    assert uids.allocate() is None  # all five run: a sixth task cannot start
    uids.release(102)
    assert uids.allocate() == 102
    assert uids.held == frozenset(range(100, 105))


def test_a_released_uid_comes_back_as_late_as_the_range_allows() -> None:
    uids = _free(100, 103)
    first = uids.allocate()
    uids.release(first)  # type: ignore[arg-type]
    assert [uids.allocate() for _ in range(3)] == [101, 102, 103]
    assert uids.allocate() == 100  # only after the others, round-robin


def test_uids_of_users_groups_and_live_processes_are_skipped() -> None:
    uids = _free(100, 105, named={100, 102}, busy={101, 104})
    assert [uids.allocate() for _ in range(3)] == [103, 105, None]


def test_the_machines_own_users_are_never_handed_out() -> None:
    nobody = pwd.getpwnam("nobody").pw_uid  # real lookups: /etc/passwd names it
    assert UidAllocator(nobody, nobody).allocate() is None
    assert _free(65535, 65535).allocate() is None  # (uid_t) -1 in 16 bits: "unchanged"


@settings(max_examples=60)
@given(
    size=st.integers(1, 12),
    taken=st.sets(st.integers(0, 11)),
    steps=st.lists(st.booleans(), max_size=40),
)
def test_no_uid_is_ever_held_twice_or_taken(size: int, taken: set[int], steps: list[bool]) -> None:
    named = {1000 + t for t in taken}
    uids = _free(1000, 1000 + size - 1, named=named)
    held: list[int] = []
    for allocate in steps:
        if allocate or not held:
            uid = uids.allocate()
            free = size - len(named & set(range(1000, 1000 + size))) - len(held)
            assert (uid is None) == (free == 0)
            if uid is not None:
                assert uid not in held and uid not in named and 1000 <= uid < 1000 + size
                held.append(uid)
        else:
            uids.release(held.pop(0))
        assert uids.held == frozenset(held)


@pytest.mark.parametrize(
    ("text", "problem"),
    [("61184", "FIRST-LAST"), ("a-b", "FIRST-LAST"), ("0-10", "1 <= FIRST"), ("20-10", "<= LAST")],
)
def test_bad_uid_ranges_are_one_line(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as caught:
        parse_uid_range(text)
    assert "\n" not in str(caught.value)


def test_the_executor_config_checks_its_range(tmp_path: Path) -> None:
    assert parse_uid_range(" 61184-65519 ") == (61184, 65519)
    assert ExecutorConfig(tasks_dir=tmp_path, task_uids=[5, 9]).task_uids == (5, 9)
    with pytest.raises(ValueError, match="task uids"):
        ExecutorConfig(tasks_dir=tmp_path, task_uids=(9, 5))


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to root needs root")
def test_a_dead_daemons_task_dirs_are_sealed_at_start(tmp_path: Path) -> None:
    for name, uid in (("a", 61190), ("b", 1234)):
        for part in ("work", "tmp"):
            path = tmp_path / name / "1" / part
            path.mkdir(parents=True)
            os.chown(path, uid, uid)
    (tmp_path / ".running").mkdir()
    assert seal_leftovers(tmp_path, 61184, 65519) == 2
    for part in ("work", "tmp"):
        assert (tmp_path / "a" / "1" / part).stat().st_uid == 0
        assert (tmp_path / "b" / "1" / part).stat().st_uid == 1234  # not ours to seal


@pytest.mark.parametrize(
    ("root", "user", "dynamic", "probe", "level", "namespaces"),
    [
        (True, "uid 1-9", "1-9", "ok", "full", True),
        (True, "uid 1-9", "1-9", "no PID namespace: Operation not permitted", "uids", False),
        (True, "nobody", None, "ok", "namespaces", True),
        (True, "nobody", None, "no PID namespace: x", "none", False),
        (True, "root", None, "disabled by configuration", "none", False),
        (False, "alice", None, "not root", "none", False),
    ],
)
def test_each_level_is_one_line_that_says_what_holds(
    root: bool, user: str, dynamic: str | None, probe: str, level: str, namespaces: bool
) -> None:
    isolation = Isolation.decide(root=root, user=user, dynamic=dynamic, probe=probe)
    assert (isolation.level, isolation.namespaces) == (level, namespaces)
    assert "\n" not in isolation.detail
    if probe not in ("ok", "not root", "disabled by configuration"):
        assert probe in isolation.detail  # the kernel's refusal is named
