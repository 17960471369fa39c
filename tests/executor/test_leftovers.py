"""`Leftovers`: a record per running task, and the reaping of what an earlier daemon
left, with care for pid reuse and reboots. Real process groups: killing them is the
point; every wait is on a process's end or a poll with a deadline."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from populi_p2p.executor import _leftovers
from populi_p2p.executor._leftovers import Leftovers, start_time

from .helpers import PY, alive


def _record(running: Path, task_id: str, epoch: int, pgid: int, **changes: object) -> None:
    Leftovers(running).record(task_id, epoch, pgid, None)
    path = running / f"{task_id}-{epoch}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process in a session of its own, which no reap may touch."""
    process = subprocess.Popen([PY, "-c", "import time; time.sleep(300)"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


def test_start_time_is_the_kernels_and_none_for_no_process() -> None:
    mine = start_time(os.getpid())
    assert isinstance(mine, int) and mine > 0
    later = subprocess.Popen(["sleep", "300"])
    try:
        child = start_time(later.pid)
        assert child is not None and child >= mine
    finally:
        later.kill()
        later.wait()
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert start_time(pid_max + 1) is None


def test_a_record_names_the_group_its_start_and_this_boot(tmp_path: Path) -> None:
    running = tmp_path / ".running"
    Leftovers(running).record("t", 3, os.getpid(), tmp_path / "cg")
    record = json.loads((running / "t-3.json").read_text())
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert record == {
        "task_id": "t", "epoch": 3, "pgid": os.getpid(), "start_time": start_time(os.getpid()),
        "boot_id": boot, "cgroup": str(tmp_path / "cg"),
    }  # fmt: skip
    assert [p.name for p in running.iterdir()] == ["t-3.json"]  # no .tmp left behind
    assert running.stat().st_mode & 0o777 == 0o700
    Leftovers(running).forget("t", 3)
    Leftovers(running).forget("t", 3)  # twice: nothing to do, no error
    assert list(running.iterdir()) == []


def test_a_record_that_cannot_be_written_loses_only_the_backstop(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    Leftovers(blocked / ".running").record("t", 1, os.getpid(), None)  # no raise
    assert blocked.read_text() == "not a directory"


async def test_reaping_nothing(tmp_path: Path) -> None:
    assert await Leftovers(tmp_path / "missing").reap() == []


async def test_junk_records_are_dropped_not_acted_on(tmp_path: Path) -> None:
    running = tmp_path / ".running"
    running.mkdir()
    (running / "junk-1.json").write_text("{not json")
    (running / "nokey-1.json").write_text(json.dumps({"task_id": "x"}))
    (running / "list-1.json").write_text("[1, 2]")
    (running / "other.txt").write_text("not a record")
    assert await Leftovers(running).reap() == []
    assert [p.name for p in running.iterdir()] == ["other.txt"]


async def test_a_live_group_is_killed_child_and_all(tmp_path: Path) -> None:
    """An earlier daemon's task whose wrapper died without killing it: a group with a
    child, in a session of its own."""
    running = tmp_path / ".running"
    left = subprocess.Popen(
        ["sh", "-c", "sleep 300 & echo $!; wait"], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        assert left.stdout is not None
        grandchild = int(left.stdout.readline())
        _record(running, "left", 3, left.pid)
        assert await Leftovers(running).reap() == [("left", 3)]
        assert left.wait(timeout=10) == -9
        assert not alive(grandchild)
        assert list(running.iterdir()) == []
    finally:
        left.kill()
        left.wait()


async def test_pid_reuse_and_another_boot_kill_nothing(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    """A record whose pid now names another process (another start time), and one from
    another boot: the group is long gone, so the record goes and nobody is killed."""
    running = tmp_path / ".running"
    _record(running, "reused", 4, bystander.pid, start_time=1)
    _record(running, "rebooted", 5, bystander.pid, boot_id="another-boot")
    assert sorted(await Leftovers(running).reap()) == [("rebooted", 5), ("reused", 4)]
    assert alive(bystander.pid)
    assert list(running.iterdir()) == []


async def test_a_group_gone_already_is_reported_gone(tmp_path: Path) -> None:
    running = tmp_path / ".running"
    done = subprocess.Popen(["true"], start_new_session=True)
    _record(running, "done", 1, done.pid)
    done.wait()  # reaped: the pid names nothing now
    assert await Leftovers(running).reap() == [("done", 1)]


async def test_a_cgroup_that_will_not_empty_keeps_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cgroup is killed through `cgroup.kill`; while `cgroup.procs` still names a
    process the task is not verified gone, so its lease must not be released."""
    monkeypatch.setattr(_leftovers, "REAP_WAIT", 0.2)
    running, cgroup = tmp_path / ".running", tmp_path / "cg"
    cgroup.mkdir()
    (cgroup / "cgroup.procs").write_text("4242\n")  # a fake kernel that never empties it
    done = subprocess.Popen(["true"], start_new_session=True)
    Leftovers(running).record("stuck", 2, done.pid, cgroup)
    done.wait()
    assert await Leftovers(running).reap() == []
    assert (cgroup / "cgroup.kill").read_text() == "1"
    assert [p.name for p in running.iterdir()] == ["stuck-2.json"]
    (cgroup / "cgroup.procs").write_text("")  # now empty: gone, record dropped
    assert await Leftovers(running).reap() == [("stuck", 2)]
    assert list(running.iterdir()) == []
