"""`TaskSupervisor`: runs one task to its end, enforcing its limits (a Trio task, no threads).

Keeping the node stable comes first (docs/executor.md):

- the spec's timeout: SIGTERM to the group, SIGKILL after ``grace_period``;
- memory: cgroup ``memory.max`` when the node may use cgroup v2, else ``RLIMIT_AS``
  (per process, tasks without GPUs) plus a watchdog on the group's summed RSS, which
  SIGKILLs at once;
- CPU time: ``RLIMIT_CPU`` per process plus the watchdog on the group's sum;
- no network: a fresh network namespace, or the task does not start;
- isolation: its own uid, PID and mount namespaces (see `_isolation`).

- the fence: the wrapper itself SIGTERMs the group at ``deadline - fence_grace`` and
  kills the tree at ``deadline`` (outside this event loop); `_fence_backstop` kills
  the group from here too should the wrapper not have (``_BACKSTOP_SLACK`` later).

When the command exits, whatever is left of its group is killed (by the wrapper, then
again from here): nothing a task started outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Final

import trio

from .._log import event, get_logger
from ._config import ExecutorConfig
from ._launch import TaskLauncher, monotonic_to_trio
from ._leftovers import Leftovers
from ._proc import SharedScan
from ._record import StartFailed, TaskRecord, memory_detail, tail
from ._types import TaskExited

__all__ = ["TaskSupervisor"]

#: What a program says when an allocation fails under RLIMIT_AS (Python, libc, C++, Go...).
_OOM_MARKERS: Final = (b"MemoryError", b"Cannot allocate memory", b"bad_alloc", b"out of memory")
#: How long past a fence deadline the daemon kills a task the wrapper has not.
_BACKSTOP_SLACK: Final = 0.5

_log = get_logger("executor")


class TaskSupervisor:
    """Spawns a prepared task through `launcher`, watches it, and says why it ended."""

    def __init__(
        self, config: ExecutorConfig, launcher: TaskLauncher, leftovers: Leftovers
    ) -> None:
        self.config = config
        self._launcher = launcher
        self._leftovers = leftovers
        self._scan = SharedScan(config.poll_interval)  # every watchdog's /proc reading

    async def execute(self, task: TaskRecord) -> TaskExited:
        """Run `task` until it ends; its group is gone when this returns."""
        if task.reason is not None:  # stopped before it could start
            return task.exited(task.reason, task.detail, self.config.tail_bytes)
        try:
            await self._launcher.spawn(task)
        except StartFailed as exc:
            return task.exited("start_failed", str(exc), self.config.tail_bytes)
        assert task.process is not None
        pid = task.process.pid
        cgroup = task.cgroup.path if task.cgroup is not None else None
        self._leftovers.record(task.task_id, task.epoch, pid, cgroup)
        event(_log, 20, "executor.started", task=task.task_id, epoch=task.epoch, pid=pid)
        deadline = trio.current_time() + task.spec.timeout
        failure = b""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._timer, task, deadline)
            nursery.start_soon(self._stopper, task)
            nursery.start_soon(self._fence_backstop, task)
            failure = await self._launcher.read_status(task)
            if not failure:
                nursery.start_soon(self._watchdog, task)
            await task.process.wait()
            nursery.cancel_scope.cancel()
        if b"\nfenced\n" in await self._launcher.read_rest(task, self.config.grace_period):
            task.request("cancelled", "fenced")  # the wrapper enforced the fence
        # Decide why it ended now: a stop() arriving while the rest of the group is
        # reaped must not turn a task's own exit into "cancelled".
        if failure:
            outcome = "start_failed", failure.decode("utf-8", "replace").strip()
        else:
            outcome = self._classify(task)
        await self.reap(task, signal.SIGKILL)
        return task.exited(*outcome, self.config.tail_bytes)

    async def reap(self, task: TaskRecord, sig: int) -> None:
        """Signal the group, wait for the leader, kill what is left, wait for it to go."""
        process = task.process
        if process is None:
            return
        if process.returncode is None:
            self._signal(task, sig)
            await process.wait()
        self._signal(task, signal.SIGKILL)
        killed = time.monotonic()  # the scan's clock
        with trio.move_on_after(self.config.grace_period):
            while self._scan.usage(process.pid, skip=[process.pid], not_before=killed).members:
                await trio.sleep(self.config.poll_interval)

    async def _timer(self, task: TaskRecord, deadline: float) -> None:
        await trio.sleep_until(deadline)
        task.request("timeout", f"ran past its timeout of {task.spec.timeout:g} s")

    async def _stopper(self, task: TaskRecord) -> None:
        """On any stop request: SIGTERM the group (SIGKILL for memory), then SIGKILL."""
        await task.stop_requested.wait()
        assert task.process is not None
        if task.reason == "memory":
            self._signal(task, signal.SIGKILL)
            return
        grace = self.config.grace_period if task.stop_grace is None else task.stop_grace
        if grace > 0:
            self._signal(task, signal.SIGTERM)
            with trio.move_on_after(grace):
                await task.process.wait()
        self._signal(task, signal.SIGKILL)

    async def _fence_backstop(self, task: TaskRecord) -> None:
        """Kill the task if its fence passed and it still runs (the wrapper's job,
        unless the wrapper was stopped or killed from outside)."""
        while True:
            moved = task.fence_moved
            if task.deadline is None:
                await moved.wait()
                continue
            with trio.move_on_at(monotonic_to_trio(task.deadline) + _BACKSTOP_SLACK):
                await moved.wait()
                continue
            task.request("cancelled", "fenced", grace=0.0)
            return

    async def _watchdog(self, task: TaskRecord) -> None:
        """Stop the task when its group's memory or CPU time passes the limit."""
        assert task.process is not None
        pgid = task.process.pid  # the wrapper's: not counted against the task
        ours = [pgid, task.init_pid]  # nor is the init of its PID namespace
        while True:
            await trio.sleep(self.config.poll_interval)
            if task.cgroup is not None:
                if task.cgroup.oom_kills() > 0:
                    task.request("memory", memory_detail(task.memory))
                cpu = task.cgroup.cpu_time()
            else:
                usage = self._scan.usage(pgid, skip=ours)
                if task.memory is not None and usage.rss > task.memory:
                    task.request("memory", memory_detail(task.memory))
                cpu = usage.cpu_time
            if cpu > task.cpu_time:
                task.request("cpu", f"used more than {task.cpu_time:g} s of CPU time")

    @staticmethod
    def _signal(task: TaskRecord, sig: int) -> None:
        assert task.process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(task.process.pid, sig)
        if sig == signal.SIGKILL and task.cgroup is not None:
            task.cgroup.kill()

    @staticmethod
    def _classify(task: TaskRecord) -> tuple[str, str]:
        """Why the process ended: our stop request, else what the kernel says."""
        assert task.process is not None
        code = task.process.returncode
        if task.reason is not None:
            return task.reason, task.detail
        if task.cgroup is not None and task.cgroup.oom_kills() > 0:
            return "memory", memory_detail(task.memory)
        if code == -signal.SIGXCPU:
            return "cpu", f"used more than {task.cpu_time:g} s of CPU time"
        failed_under_rlimit = code != 0 and task.rlimit_as is not None
        if failed_under_rlimit and any(m in tail(task.err_fd, 4096) for m in _OOM_MARKERS):
            return "memory", memory_detail(task.memory) + " (an allocation failed)"
        return "exited", f"exited with code {code}"
