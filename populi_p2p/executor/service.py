"""The executor service: HOW a task runs on this node, once the lease service says WHAT.

Events in: `start(task_id, epoch, spec, gpu_uuids, deadline=...)`, `fence(task_id,
epoch, deadline)` and `stop(task_id, reason, grace)` from the lease service. Events
out: one `TaskExited` per `start`, on `exits`; and once, at start-up, the tasks a
previous daemon left behind, killed (`reap_leftovers`).

The parts, one type each: `_checks` (hostile arguments, the task user),
`_isolation` (a uid per task, the isolation level),
`_launch.TaskLauncher` (directories, log files, cgroup or rlimits, the wrapper
process), `_supervisor.TaskSupervisor` (one per running task, in this service's
nursery: timeout, watchdog, stop, reap) and `_record.TaskRecord` (the state they
share), `_leftovers.Leftovers` (a record per running task, for the next start).
See docs/executor.md for the limits and why.

On node shutdown every running task is killed (SIGKILL, no grace) and reported
``shutdown``; if the daemon dies instead, each task's wrapper kills its tree.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import trio

from .._log import event, get_logger
from ..leases import TaskSpec
from ._cgroup import probe
from ._checks import TASK_ID, check_arguments, resolve_task_user
from ._config import ExecutorConfig
from ._isolation import Isolation, UidAllocator, parse_uid_range, seal, seal_leftovers
from ._launch import WRAPPER as _WRAPPER
from ._launch import TaskLauncher
from ._leftovers import Leftovers
from ._record import StartFailed, TaskRecord
from ._supervisor import TaskSupervisor
from ._types import RunningTask, TaskExited, TaskLimits

__all__ = [
    "ExecutorConfig",
    "ExecutorService",
    "RunningTask",
    "Stream",
    "TaskExited",
    "TaskLimits",
    "parse_uid_range",
    "resolve_task_user",
]

Stream = Literal["stdout", "stderr"]

_log = get_logger("executor")


class ExecutorService:
    """Runs commands for the lease service, each under its limits, and reports their end.

    Args:
        config: where and as whom tasks run; the named bounds.

    Raises:
        ValueError: the configured task user does not exist, or is not ours to switch
            to (the daemon is not root).
    """

    def __init__(self, config: ExecutorConfig) -> None:
        self.config = config
        #: A uid per task when root and no task user is named (else None).
        self._uids: UidAllocator | None = None
        self._uid: int | None = None
        self._gid: int | None = None
        if config.task_user is None and os.geteuid() == 0:
            self._uids = UidAllocator(*config.task_uids)
            self.user = "uid {}-{}".format(*config.task_uids)
        else:
            self._uid, self._gid, self.user = resolve_task_user(config.task_user)
        self.isolation: Isolation | None = None  # decided in `run`
        self._launcher = TaskLauncher()
        self._leftovers = Leftovers(config.tasks_dir / ".running")
        self._reaped: list[tuple[str, int]] | None = None
        self._reaping = trio.Lock()
        self._supervisor = TaskSupervisor(config, self._launcher, self._leftovers)
        self.limiter_detail = "rlimits (cgroup v2 disabled by configuration)"
        self._tasks: dict[str, TaskRecord] = {}
        self._nursery: trio.Nursery | None = None
        self._send, self.exits = trio.open_memory_channel[TaskExited](config.exits_buffer)
        self._counts: dict[str, int] = {}

    ############################################################################
    # The interface the lease service uses

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; on cancellation every running task is killed.

        Before it reports started, whatever a previous daemon on this ``tasks_dir``
        left running is killed (`reap_leftovers`).
        """
        if self.config.use_cgroup:
            cgroup, self.limiter_detail = probe(self.config.cgroup_parent)
            self._launcher.cgroup = cgroup
            if cgroup is None:
                self.limiter_detail = f"rlimits and a watchdog ({self.limiter_detail})"
        self.config.tasks_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.config.tasks_dir.chmod(0o711)  # mkdir's mode is masked by the umask
        await self.reap_leftovers()
        await self._decide_isolation()
        event(_log, 20, "executor.ready", limiter=self.limiter_detail, user=self.user)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            # Every supervisor has reported: readers of `exits` see the end of the stream.
            self._send.close()

    def start(
        self,
        task_id: str,
        epoch: int,
        spec: TaskSpec,
        gpu_uuids: list[str],
        *,
        limits: TaskLimits | None = None,
        deadline: float | None = None,
        fence_grace: float | None = None,
    ) -> None:
        """Start running `spec` at `epoch`; its end arrives on `exits`, always exactly once.

        Every argument is treated as hostile: a bad one ends in a ``start_failed``
        event with the reason, never an exception. Must be called after `run` started.
        `deadline` fences the task from its first instant (see `fence`);
        `fence_grace` overrides the configured one for this task.
        """
        if self._nursery is None:
            raise RuntimeError("ExecutorService.start before run() started")  # our bug
        now = time.time()
        limits = limits if limits is not None else TaskLimits()
        memory = limits.memory if limits.memory is not None else (spec.requirements.ram or None)
        cpu_time = limits.cpu_time
        if cpu_time is None:
            cpu_time = spec.timeout * max(1.0, spec.requirements.cpu_cores)
        problem = check_arguments(task_id, epoch, gpu_uuids)
        if problem is None and not _finite(deadline, fence_grace):
            problem = "deadline and fence_grace must be finite numbers (or None)"
        if problem is None and task_id in self._tasks:
            problem = f"task {task_id} is already running here (epoch {self._tasks[task_id].epoch})"
        safe_id = task_id if problem is None else "invalid"
        task = TaskRecord(
            task_id=task_id,
            epoch=epoch,
            spec=spec,
            gpu_uuids=list(gpu_uuids),
            no_network=limits.no_network or spec.no_network,
            memory=memory,
            cpu_time=cpu_time,
            started_at=now,
            epoch_dir=self.config.tasks_dir / safe_id / str(epoch if problem is None else 0),
            deadline=deadline,
            fence_grace=self.config.fence_grace if fence_grace is None else max(0.0, fence_grace),
        )
        try:
            if problem is not None:
                raise StartFailed(problem)
            self._choose_user(task)
            # Synchronous, so `log_path` and `follow_log` work as soon as `start` returns.
            self._launcher.prepare(task)
        except StartFailed as exc:
            ended = task.exited("start_failed", str(exc), self.config.tail_bytes)
            task.reason = "start_failed"
            self._release(task)
            self._nursery.start_soon(self._send.send, ended)
            return
        self._tasks[task_id] = task
        self._nursery.start_soon(self._supervise, task)

    def stop(self, task_id: str, reason: str, grace: float | None = None) -> None:
        """Stop the task's whole group: SIGTERM, then SIGKILL after `grace` seconds
        (None: ``grace_period``; 0: SIGKILL at once).

        Unknown or finished tasks are ignored (the end was or will be reported). The
        `TaskExited` says ``cancelled`` and carries `reason` as its detail.
        """
        task = self._tasks.get(task_id)
        if task is not None:
            task.request("cancelled", reason[:200], None if grace is None else max(0.0, grace))

    def fence(self, task_id: str, epoch: int, deadline: float) -> None:
        """Let the task run until `deadline` (a ``time.monotonic()`` value) unless a
        later call moves it; then it ends ``cancelled``/``fenced``.

        The task's wrapper enforces it, not this event loop: SIGTERM to the group at
        ``deadline - fence_grace``, SIGKILL to its tree at `deadline`, even while the
        daemon is frozen. Unknown ids and other epochs are ignored. Once the SIGTERM
        went out the fence holds: a later deadline no longer saves the task.
        """
        task = self._tasks.get(task_id)
        if task is None or task.epoch != epoch or deadline is None or not _finite(deadline):
            return
        task.move_fence(float(deadline))
        self._launcher.fence(task)

    async def reap_leftovers(self) -> list[tuple[str, int]]:
        """Kill what a previous daemon's tasks left running; once per service.

        `run` does it before it reports started; later calls return the same list.

        Returns:
            (task_id, epoch) of every task recorded as running by an earlier daemon
            whose processes are now verified gone, so its lease may be released.
        """
        async with self._reaping:
            if self._reaped is None:
                self._reaped = await self._leftovers.reap()
                if self._reaped:
                    event(_log, 30, "executor.reaped", tasks=len(self._reaped))
            return list(self._reaped)

    def running(self) -> dict[str, RunningTask]:
        """The tasks started and not yet reported, by id."""
        return {tid: t.view() for tid, t in sorted(self._tasks.items())}

    def log_path(self, task_id: str, stream: Stream = "stdout") -> Path:
        """The file holding the task's full output, for its latest epoch run here.

        Raises:
            ValueError: `task_id` is not a valid id, or `stream` is not a stream.
            FileNotFoundError: this node never ran the task (or its files are gone).
        """
        if not isinstance(task_id, str) or not TASK_ID.fullmatch(task_id):
            raise ValueError("not a task id: use the id `populi-node tasks` shows")
        if stream not in ("stdout", "stderr"):
            raise ValueError("stream must be stdout or stderr")
        task = self._tasks.get(task_id)
        if task is not None:
            return task.epoch_dir / stream
        epochs = []
        with contextlib.suppress(OSError):
            names = [p.name for p in (self.config.tasks_dir / task_id).iterdir()]
            epochs = [int(name) for name in names if name.isdigit()]
        if not epochs:
            raise FileNotFoundError(f"task {task_id} has not run on this node")
        return self.config.tasks_dir / task_id / str(max(epochs)) / stream

    async def follow_log(self, task_id: str, stream: Stream = "stdout") -> AsyncIterator[bytes]:
        """Yield the task's output from the start, then as it is written, until it ends.

        The file is polled every ``poll_interval`` (no inotify in Trio); the iterator
        ends once the task has ended and everything it wrote was yielded.
        """
        path = self.log_path(task_id, stream)
        task = self._tasks.get(task_id)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            while True:
                # Look at "still running" before reading, so the last read after the end
                # sees everything written before it.
                done = task is None or self._tasks.get(task_id) is not task
                chunk = os.read(fd, 65536)
                if chunk:
                    yield chunk
                elif done:
                    return
                else:
                    await trio.sleep(self.config.poll_interval)
        finally:
            os.close(fd)

    def statistics(self) -> dict[str, int]:
        """Counts of ends by reason (``start_failed`` includes hostile arguments)."""
        return dict(sorted(self._counts.items()))

    ############################################################################
    # One supervisor per task, and the bookkeeping of its end

    async def _supervise(self, task: TaskRecord) -> None:
        try:
            ended = await self._supervisor.execute(task)
        except BaseException:
            # The node is shutting down (or we have a bug): the task must not outlive us.
            with trio.CancelScope(shield=True):
                task.request("shutdown", "the node shut down while the task ran")
                await self._supervisor.reap(task, signal.SIGKILL)
                ended = task.exited("shutdown", task.detail, self.config.tail_bytes)
                self._finish(task, ended.reason)
            with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
                self._send.send_nowait(ended)
            raise
        self._finish(task, ended.reason)
        await self._send.send(ended)

    def _finish(self, task: TaskRecord, reason: str) -> None:
        self._tasks.pop(task.task_id, None)
        task.reason = reason
        self._release(task)

    def _release(self, task: TaskRecord) -> None:
        """Count the end, close our files, remove the cgroup and the task's record,
        seal a dynamic uid's dirs and give the uid back."""
        key = task.reason or "exited"
        self._counts[key] = self._counts.get(key, 0) + 1
        task.release()
        if task.process is not None:
            self._leftovers.forget(task.task_id, task.epoch)
        if task.dynamic and task.uid is not None and self._uids is not None:
            seal(task.work_dir, task.tmp_dir)
            self._uids.release(task.uid)

    ############################################################################
    # Who a task runs as, and what keeps tasks apart

    def _choose_user(self, task: TaskRecord) -> None:
        """The task's uid: its own from the range, or the configured user.

        Raises:
            StartFailed: every uid of the range is taken.
        """
        if self._uids is None:
            task.uid, task.gid, task.user = self._uid, self._gid, self.user
            return
        uid = self._uids.allocate()
        if uid is None:
            first, last = self._uids.first, self._uids.last
            raise StartFailed(
                f"no free task uid in {first}-{last} ({len(self._uids.held)} tasks hold one,"
                " the rest are in use on this machine): widen --task-uids"
            )
        task.uid, task.gid, task.user, task.dynamic = uid, uid, f"uid {uid}", True

    async def _decide_isolation(self) -> None:
        """Probe the namespaces once, seal what a dead daemon's tasks left, and say in
        one line what keeps tasks apart (a warning when anything is missing)."""
        root = os.geteuid() == 0
        probe = "not root" if not root else "disabled by configuration"
        if root and self.config.namespaces and self.config.task_user != "root":
            command = [sys.executable, "-I", "-S", _WRAPPER, "probe", str(self.config.tasks_dir)]
            try:
                done = await trio.run_process(command, capture_stdout=True, env={}, check=False)
                probe = done.stdout.decode("utf-8", "replace").strip() or "the probe failed"
            except OSError as exc:
                probe = f"the probe could not run: {exc.strerror}"
        dynamic = None
        if self._uids is not None:
            dynamic = f"{self._uids.first}-{self._uids.last}"
            seal_leftovers(self.config.tasks_dir, self._uids.first, self._uids.last)
        self.isolation = Isolation.decide(root=root, user=self.user, dynamic=dynamic, probe=probe)
        self._launcher.namespaces = self.isolation.namespaces
        level = 20 if self.isolation.level == "full" else 30
        event(_log, level, "executor.isolation", level=self.isolation.level,
              detail=self.isolation.detail)  # fmt: skip


def _finite(*values: object) -> bool:
    """Each value is None or a finite number (a NaN deadline would never pass)."""
    return all(
        v is None or (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v))
        for v in values
    )
