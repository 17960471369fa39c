"""`TaskSupervisor`: why a task ended (its own exit, a limit, a stop, a fence, a failed
start), decided once, and enforced. The launcher is a stand-in that spawns a plain
process in a group of its own (the wrapper's part is tests/executor/test_wrapper.py);
the clock-driven parts run on Trio's autojump clock."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing

from populi_p2p.executor import _supervisor
from populi_p2p.executor._config import ExecutorConfig
from populi_p2p.executor._leftovers import Leftovers
from populi_p2p.executor._proc import GroupUsage
from populi_p2p.executor._record import StartFailed, TaskRecord
from populi_p2p.executor._supervisor import TaskSupervisor

from .helpers import alive, record, spec


class _Launcher:
    """Spawns `argv` in a new session; says what a wrapper would have said."""

    def __init__(self, argv: list[str], status: bytes = b"", rest: bytes = b"") -> None:
        self.argv, self.status, self.rest = argv, status, rest
        self.spawned = 0

    async def spawn(self, task: TaskRecord) -> None:
        self.spawned += 1
        if not self.argv:
            raise StartFailed("no such program")
        task.process = await trio.lowlevel.open_process(self.argv, start_new_session=True)

    async def read_status(self, task: TaskRecord) -> bytes:
        return self.status

    async def read_rest(self, task: TaskRecord, timeout: float) -> bytes:
        return self.rest


def _supervisor_for(tmp_path: Path, launcher: _Launcher) -> TaskSupervisor:
    config = ExecutorConfig(tasks_dir=tmp_path, grace_period=1.0, poll_interval=0.05)
    return TaskSupervisor(config, cast(Any, launcher), Leftovers(tmp_path / ".running"))


async def _execute(tmp_path: Path, launcher: _Launcher, **task: Any) -> Any:
    with trio.fail_after(60):
        return await _supervisor_for(tmp_path, launcher).execute(record(tmp_path, **task))


async def test_the_commands_own_exit(tmp_path: Path) -> None:
    ended = await _execute(tmp_path, _Launcher(["sh", "-c", "echo hi; exit 3"]))
    assert (ended.reason, ended.detail, ended.exit_code) == ("exited", "exited with code 3", 3)
    # Recorded for a restarted daemon while it ran (the service forgets it after).
    assert [p.name for p in (tmp_path / ".running").iterdir()] == ["t-2.json"]


async def test_a_stop_before_the_spawn_runs_nothing(tmp_path: Path) -> None:
    launcher = _Launcher(["true"])
    task = record(tmp_path)
    task.request("cancelled", "changed my mind")
    ended = await _supervisor_for(tmp_path, launcher).execute(task)
    assert launcher.spawned == 0
    assert (ended.reason, ended.detail, ended.exit_code) == ("cancelled", "changed my mind", None)


async def test_a_failed_spawn_and_a_failed_exec_are_start_failed(tmp_path: Path) -> None:
    ended = await _execute(tmp_path, _Launcher([]))
    assert (ended.reason, ended.detail) == ("start_failed", "no such program")
    assert ended.exit_code is None
    said = b"fail cannot switch to uid 5 gid 5: Operation not permitted\n"
    ended = await _execute(tmp_path, _Launcher(["sh", "-c", "exit 127"], status=said))
    assert ended.reason == "start_failed" and ended.detail == said.decode().strip()


async def test_the_wrappers_fenced_line_makes_it_a_fenced_cancel(tmp_path: Path) -> None:
    launcher = _Launcher(["sh", "-c", "kill -KILL $$"], rest=b"ok\nfenced\n")
    ended = await _execute(tmp_path, launcher)
    assert (ended.reason, ended.detail, ended.exit_code) == ("cancelled", "fenced", -9)


async def test_the_timeout_stops_the_group(tmp_path: Path) -> None:
    task = {"spec": spec("sleep", "300", timeout=0.2)}
    ended = await _execute(tmp_path, _Launcher(["sleep", "300"]), **task)
    assert (ended.reason, ended.detail) == ("timeout", "ran past its timeout of 0.2 s")
    assert ended.exit_code == -signal.SIGTERM


async def test_reap_kills_what_the_leader_left_in_its_group(tmp_path: Path) -> None:
    task = record(tmp_path)
    leader = await trio.lowlevel.open_process(
        ["sh", "-c", "sleep 300 & echo $! > child; exit 0"], start_new_session=True,
        cwd=tmp_path,
    )  # fmt: skip
    await leader.wait()
    child = int((tmp_path / "child").read_text())
    assert alive(child)
    task.process = leader
    await _supervisor_for(tmp_path, _Launcher([])).reap(task, signal.SIGKILL)
    assert not alive(child)


########################################################################################
# Why it ended, from the record alone


def _ended(tmp_path: Path, code: int, **changes: Any) -> TaskRecord:
    task = record(tmp_path, **changes)
    task.process = cast(Any, SimpleNamespace(returncode=code, pid=1))
    return task


def _stderr(tmp_path: Path, text: bytes) -> int:
    (tmp_path / "err").write_bytes(text)
    return os.open(tmp_path / "err", os.O_RDONLY)


def test_classify_our_reason_first_then_the_kernels(tmp_path: Path) -> None:
    classify = TaskSupervisor._classify
    oom = cast(Any, SimpleNamespace(oom_kills=lambda: 1))
    stopped = _ended(tmp_path, -9, cgroup=oom)
    stopped.request("cancelled", "handoff")
    assert classify(stopped) == ("cancelled", "handoff")
    assert classify(_ended(tmp_path, -9, cgroup=oom, memory=64))[0] == "memory"
    assert classify(_ended(tmp_path, -signal.SIGXCPU, cpu_time=2.0)) == (
        "cpu", "used more than 2 s of CPU time",
    )  # fmt: skip
    assert classify(_ended(tmp_path, 1)) == ("exited", "exited with code 1")
    assert classify(_ended(tmp_path, 0)) == ("exited", "exited with code 0")


@pytest.mark.parametrize("marker", [b"MemoryError", b"std::bad_alloc", b"out of memory"])
def test_classify_a_failed_allocation_under_rlimit_as_memory(tmp_path: Path, marker: bytes) -> None:
    err = _stderr(tmp_path, b"Traceback...\n" + marker + b"\n")
    try:
        under = _ended(tmp_path, 1, rlimit_as=1 << 20, memory=1 << 20, err_fd=err)
        assert TaskSupervisor._classify(under) == (
            "memory", f"used more than its memory limit of {1 << 20} bytes (an allocation failed)",
        )  # fmt: skip
        # Without the rlimit, or with a clean exit, the words are only the task's output.
        assert TaskSupervisor._classify(_ended(tmp_path, 1, err_fd=err))[0] == "exited"
        clean = _ended(tmp_path, 0, rlimit_as=1 << 20, err_fd=err)
        assert TaskSupervisor._classify(clean)[0] == "exited"
    finally:
        os.close(err)


########################################################################################
# The clock-driven parts


async def test_the_timer_asks_for_a_timeout_at_the_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    task = record(tmp_path, spec=spec("true", timeout=30.0))
    supervisor = _supervisor_for(tmp_path, _Launcher([]))
    start = trio.current_time()
    await supervisor._timer(task, start + 30.0)
    assert trio.current_time() - start == 30.0
    assert (task.reason, task.detail) == ("timeout", "ran past its timeout of 30 s")


async def test_the_fence_backstop_follows_the_moving_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Unfenced it waits; a fence moved before it passes re-arms it; past the deadline
    and the slack it stops the task at once (no grace)."""
    task = record(tmp_path)
    supervisor = _supervisor_for(tmp_path, _Launcher([]))
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor._fence_backstop, task)
        await trio.sleep(1000)
        assert task.reason is None  # no fence: nothing to enforce
        task.move_fence(time.monotonic() + 10)
        await trio.sleep(5)
        task.move_fence(time.monotonic() + 100)  # renewed before it lapsed
        await trio.sleep(50)
        assert task.reason is None
        await task.stop_requested.wait()
        waited = trio.current_time() - start
    assert (task.reason, task.detail, task.stop_grace) == ("cancelled", "fenced", 0.0)
    # The renewed deadline plus the slack (less the real time the conversions between
    # time.monotonic and Trio's clock took), not the first deadline.
    assert 1005 + 100 - 1 <= waited <= 1005 + 100 + _supervisor._BACKSTOP_SLACK, waited


async def test_the_watchdog_stops_a_group_over_its_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    """Without a cgroup it reads the group's sum, the wrapper and init left out."""
    seen: list[list[int | None]] = []

    def usage(pgid: int, skip: list[int | None]) -> GroupUsage:
        seen.append(skip)
        return GroupUsage(3, rss=200, cpu_time=1.0)

    supervisor = _supervisor_for(tmp_path, _Launcher([]))
    monkeypatch.setattr(supervisor._scan, "usage", usage)  # the shared /proc scan
    task = record(tmp_path, memory=100, cpu_time=5.0, init_pid=8)
    task.process = cast(Any, SimpleNamespace(pid=7))
    with trio.move_on_after(1):
        await supervisor._watchdog(task)
    assert (task.reason, task.detail) == ("memory", "used more than its memory limit of 100 bytes")
    assert seen[0] == [7, 8]
    task = record(tmp_path, memory=1000, cpu_time=0.5)
    task.process = cast(Any, SimpleNamespace(pid=7))
    with trio.move_on_after(1):
        await supervisor._watchdog(task)
    assert (task.reason, task.detail) == ("cpu", "used more than 0.5 s of CPU time")


async def test_the_watchdog_reads_the_cgroup_when_there_is_one(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    supervisor = _supervisor_for(tmp_path, _Launcher([]))
    cgroup = SimpleNamespace(oom_kills=lambda: 0, cpu_time=lambda: 0.1)
    task = record(tmp_path, memory=1, cpu_time=1.0, cgroup=cgroup)
    task.process = cast(Any, SimpleNamespace(pid=os.getpid()))  # its RSS is not the task's
    with trio.move_on_after(10):
        await supervisor._watchdog(task)
    assert task.reason is None
    cgroup.oom_kills = lambda: 1
    with trio.move_on_after(10):
        await supervisor._watchdog(task)
    assert task.reason == "memory"


async def test_the_stopper_terms_then_kills_and_kills_at_once_for_memory(tmp_path: Path) -> None:
    """A command that ignores SIGTERM: killed after the stop's own grace; a memory stop
    sends no SIGTERM at all."""
    supervisor = _supervisor_for(tmp_path, _Launcher([]))
    for reason, grace in (("cancelled", 0.1), ("memory", None)):
        task = record(tmp_path)
        task.process = await trio.lowlevel.open_process(
            ["sh", "-c", "trap 'echo term' TERM; echo up; while :; do sleep 0.05; done"],
            start_new_session=True, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert task.process.stdout is not None
        assert await task.process.stdout.receive_some(3) == b"up\n"
        task.request(reason, "", grace=grace)
        with trio.fail_after(30):
            await supervisor._stopper(task)
            await task.process.wait()
        assert task.process.returncode == -signal.SIGKILL
        said = await task.process.stdout.receive_some(100)
        assert (b"term" in said) == (reason == "cancelled"), (reason, said)
