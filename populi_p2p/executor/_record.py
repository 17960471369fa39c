"""`TaskRecord`: the executor's mutable record of one task, and what is read from it.

The supervisor, the launcher and the service share this record; nothing outside the
executor sees it (`RunningTask` and `TaskExited` are the frozen views handed out).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import attrs
import trio

from ..leases import TaskSpec
from ._cgroup import TaskCgroup
from ._types import RunningTask, TaskExited

__all__ = ["StartFailed", "TaskRecord", "memory_detail", "tail"]


class StartFailed(Exception):
    """The task cannot start; the message is the one line the result carries."""


@attrs.define
class TaskRecord:
    """One task from `start` until its end is reported (never handed out)."""

    task_id: str
    epoch: int
    spec: TaskSpec
    gpu_uuids: list[str]
    no_network: bool
    memory: int | None
    cpu_time: float
    started_at: float
    epoch_dir: Path
    #: Who the command runs as: a uid and gid to switch to (None: stay the daemon's),
    #: and the name `running()` shows. ``dynamic``: the uid is this task's alone.
    uid: int | None = None
    gid: int | None = None
    user: str = ""
    dynamic: bool = False
    process: trio.Process | None = None
    #: The task's init (pid 1 of its PID namespace) as this daemon sees it; None: none.
    init_pid: int | None = None
    cgroup: TaskCgroup | None = None
    out_fd: int | None = None
    err_fd: int | None = None
    #: The wrapper's status lines (``ok``/``fail ...``, then maybe ``fenced``).
    status_stream: trio.lowlevel.FdStream | None = None
    status_seen: bytes = b""
    #: Our end of the wrapper's control pipe (fence lines; its closing is our death).
    control_fd: int | None = None
    reason: str | None = None
    detail: str = ""
    #: The command cannot run as given (not found, not executable): see `TaskExited`.
    final: bool = False
    #: Seconds between SIGTERM and SIGKILL for this stop; None: the configured grace.
    stop_grace: float | None = None
    rlimit_as: int | None = None
    #: The fence: a ``time.monotonic()`` deadline (None: unfenced) and its TERM lead.
    deadline: float | None = None
    fence_grace: float = 1.0
    #: Set (and replaced) whenever the deadline moves.
    fence_moved: trio.Event = attrs.field(factory=trio.Event)
    stop_requested: trio.Event = attrs.field(factory=trio.Event)

    def request(self, reason: str, detail: str, grace: float | None = None) -> None:
        """The first reason to stop wins; later ones are ignored."""
        if self.reason is None:
            self.reason, self.detail, self.stop_grace = reason, detail, grace
            self.stop_requested.set()

    def move_fence(self, deadline: float) -> None:
        self.deadline = deadline
        self.fence_moved.set()
        self.fence_moved = trio.Event()

    def exited(self, reason: str, detail: str, tail_bytes: int) -> TaskExited:
        """The task's end as reported, with the last `tail_bytes` of each stream."""
        code = self.process.returncode if self.process is not None else None
        return TaskExited(
            task_id=self.task_id,
            epoch=self.epoch,
            exit_code=code,
            reason=reason,
            stdout_tail=tail(self.out_fd, tail_bytes),
            stderr_tail=tail(self.err_fd, tail_bytes),
            started_at=self.started_at,
            ended_at=time.time(),
            detail=detail,
            final=self.final and reason == "start_failed",
        )

    def release(self) -> None:
        """Close our files and remove the cgroup (once the end is decided)."""
        for fd in (self.out_fd, self.err_fd, self.control_fd):
            if fd is not None:
                os.close(fd)
        self.out_fd = self.err_fd = self.control_fd = None
        if self.status_stream is not None:
            self.status_stream.close()
            self.status_stream = None
        if self.cgroup is not None:
            self.cgroup.kill()
            self.cgroup.remove()

    @property
    def work_dir(self) -> Path:
        return self.epoch_dir / "work"

    @property
    def tmp_dir(self) -> Path:
        """Bound on the task's ``/tmp`` and ``/var/tmp`` when it has a mount namespace."""
        return self.epoch_dir / "tmp"

    def view(self) -> RunningTask:
        """What `ExecutorService.running()` shows for this task."""
        return RunningTask(
            task_id=self.task_id,
            epoch=self.epoch,
            pid=self.process.pid if self.process is not None else None,
            started_at=self.started_at,
            workdir=str(self.work_dir),
            memory_limit=self.memory,
            cpu_time_limit=self.cpu_time,
            no_network=self.no_network,
            user=self.user,
            limiter="cgroup" if self.cgroup is not None else "rlimit",
        )


def tail(fd: int | None, n: int) -> bytes:
    """The last `n` bytes of an open file, read at an offset (our own fd: no path races)."""
    if fd is None or n == 0:
        return b""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, n, max(0, size - n))
    except OSError:
        return b""


def memory_detail(memory: int | None) -> str:
    return f"used more than its memory limit of {memory} bytes"
