"""`TaskRecord`, the state the executor's parts share for one task: the first stop
reason wins, a fence move wakes its waiters, the end and the view read it right, and
`release` gives back every file and the cgroup."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import trio

from populi_p2p.executor._cgroup import TaskCgroup
from populi_p2p.executor._record import memory_detail, tail

from .helpers import record


def _file(tmp_path: Path, name: str, data: bytes) -> int:
    path = tmp_path / name
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def test_the_first_stop_reason_wins(tmp_path: Path) -> None:
    task = record(tmp_path)
    assert not task.stop_requested.is_set()
    task.request("timeout", "ran past its timeout", grace=0.5)
    task.request("memory", "later")
    assert (task.reason, task.detail, task.stop_grace) == ("timeout", "ran past its timeout", 0.5)
    assert task.stop_requested.is_set()


def test_a_fence_move_wakes_those_waiting_and_arms_a_new_event(tmp_path: Path) -> None:
    task = record(tmp_path)
    waiting = task.fence_moved
    task.move_fence(123.0)
    assert waiting.is_set() and task.deadline == 123.0
    assert task.fence_moved is not waiting and not task.fence_moved.is_set()


def test_tail_reads_the_last_bytes_of_an_open_file(tmp_path: Path) -> None:
    fd = _file(tmp_path, "out", b"0123456789")
    try:
        assert tail(fd, 4) == b"6789"
        assert tail(fd, 100) == b"0123456789"
        assert tail(fd, 0) == b""
        os.lseek(fd, 0, os.SEEK_SET)  # reads at an offset: the file position is not used
        assert tail(fd, 3) == b"789"
    finally:
        os.close(fd)
    assert tail(fd, 4) == b""  # closed: nothing, never raises
    assert tail(None, 4) == b""


def test_the_end_carries_the_tails_and_final_only_for_a_failed_start(tmp_path: Path) -> None:
    out, err = _file(tmp_path, "o", b"out" * 10), _file(tmp_path, "e", b"err")
    task = record(tmp_path, out_fd=out, err_fd=err, final=True)
    ended = task.exited("start_failed", "not found", tail_bytes=4)
    assert (ended.task_id, ended.epoch, ended.exit_code) == ("t", 2, None)
    assert (ended.stdout_tail, ended.stderr_tail) == (b"tout", b"err")
    assert ended.final and ended.detail == "not found"
    assert ended.started_at == 100.0 and ended.ended_at > 100.0
    assert not task.exited("timeout", "", tail_bytes=4).final
    task.process = cast(Any, SimpleNamespace(returncode=-9, pid=4242))
    assert task.exited("memory", "", tail_bytes=4).exit_code == -9
    task.release()


def test_release_closes_every_file_once_and_removes_the_cgroup(tmp_path: Path) -> None:
    calls: list[str] = []
    fds = [_file(tmp_path, name, b"x") for name in ("o", "e", "c")]
    task = record(tmp_path, out_fd=fds[0], err_fd=fds[1], control_fd=fds[2])
    task.cgroup = cast(Any, SimpleNamespace(kill=lambda: calls.append("kill"),
                                            remove=lambda: calls.append("remove")))  # fmt: skip
    task.release()
    assert (task.out_fd, task.err_fd, task.control_fd) == (None, None, None)
    for fd in fds:
        try:
            os.fstat(fd)
        except OSError:
            continue
        raise AssertionError(f"fd {fd} is still open")
    assert calls == ["kill", "remove"]  # every process gone before the rmdir
    task.cgroup = None
    task.release()  # twice is harmless: nothing left to close


async def test_release_closes_the_status_stream(tmp_path: Path) -> None:
    read, write = os.pipe()
    task = record(tmp_path, status_stream=trio.lowlevel.FdStream(read))
    task.release()
    assert task.status_stream is None
    os.close(write)
    try:
        os.fstat(read)
    except OSError:
        return
    raise AssertionError("the status stream's fd is still open")


def test_the_view_shows_the_limits_and_where_it_runs(tmp_path: Path) -> None:
    task = record(tmp_path, memory=1 << 20, no_network=True, user="task-1")
    view = task.view()
    assert view.pid is None and view.limiter == "rlimit"
    assert view.workdir == str(tmp_path / "t" / "2" / "work") == str(task.work_dir)
    assert task.tmp_dir == tmp_path / "t" / "2" / "tmp"
    assert (view.memory_limit, view.cpu_time_limit, view.no_network, view.user) == (
        1 << 20, 60.0, True, "task-1",
    )  # fmt: skip
    task.process = cast(Any, SimpleNamespace(pid=4242))
    task.cgroup = TaskCgroup(tmp_path, cpu=False)
    assert task.view().pid == 4242 and task.view().limiter == "cgroup"


def test_memory_detail_names_the_limit() -> None:
    assert memory_detail(1024) == "used more than its memory limit of 1024 bytes"
