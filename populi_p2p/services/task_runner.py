"""How the lease service runs a task: the narrow `TaskRunner` interface, and a small
stand-in that runs the command as a plain process group.

The lease service decides *whether* this node runs a task (it holds the lease); a
runner decides *how*. `TaskRunner` is all the lease service asks: `start`, `stop`, and
a stream of `TaskExited`. The executor service (limits, cgroups, namespaces, an
unprivileged user) implements it; `ProcessRunner` here is the stand-in until it lands:
the command in its own process group (a new session), with the task's environment,
``CUDA_VISIBLE_DEVICES`` set to the allocated GPU UUIDs, a working directory under the
state directory, the task's timeout, and SIGTERM then SIGKILL to the whole group on
stop. Full output stays in the working directory; only bounded tails are reported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Final, Protocol

import attrs
import trio

from ..leases import TaskSpec

__all__ = ["STOP_GRACE", "TAIL_BYTES", "ProcessRunner", "TaskExited", "TaskRunner"]

#: Seconds between SIGTERM and SIGKILL of a stopped task's process group.
STOP_GRACE: Final = 2.0
#: Bytes kept of each of stdout and stderr in a result (the rest stays on disk).
TAIL_BYTES: Final = 200


@attrs.frozen
class TaskExited:
    """A task's process ended (by itself, by its timeout, or because it was stopped).

    `exit_code` is the process's, or ``-signal`` when a signal ended it; `reason` is
    ``exited``, ``timeout``, ``start_failed`` or the reason given to `stop`. Times are
    realtime (informational, shown to people; never used for ordering).
    """

    task_id: str
    epoch: int
    exit_code: int
    reason: str
    stdout_tail: bytes
    stderr_tail: bytes
    started_at: float
    ended_at: float


class TaskRunner(Protocol):
    """What the lease service needs from whatever runs processes."""

    def start(self, task_id: str, epoch: int, spec: TaskSpec, gpu_uuids: list[str]) -> None:
        """Start the task now (returns at once); its end comes as a `TaskExited`."""
        ...

    def stop(self, task_id: str, reason: str) -> None:
        """Stop the task's process group (SIGTERM, SIGKILL after a grace); its
        `TaskExited` carries `reason`. Unknown ids are ignored."""
        ...

    def exits(self) -> trio.MemoryReceiveChannel[TaskExited]:
        """The stream of `TaskExited`, one per `start`."""
        ...


def _tail(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            return f.read(TAIL_BYTES)
    except OSError:
        return b""


class ProcessRunner:
    """The stand-in `TaskRunner`. Run `run()` in a nursery before `start`.

    Args:
        work_root: each task runs in ``work_root/<task id>-<epoch>`` (output kept there).
        grace: seconds from SIGTERM to SIGKILL when a task is stopped.
    """

    def __init__(self, work_root: Path, *, grace: float = STOP_GRACE) -> None:
        self._root = work_root
        self._grace = grace
        self._send, self._receive = trio.open_memory_channel[TaskExited](1024)
        self._scopes: dict[str, tuple[trio.CancelScope, list[str]]] = {}
        self._nursery: trio.Nursery | None = None
        self.pids: dict[str, int] = {}  # task id -> process (group) id, while running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def exits(self) -> trio.MemoryReceiveChannel[TaskExited]:
        return self._receive

    def start(self, task_id: str, epoch: int, spec: TaskSpec, gpu_uuids: list[str]) -> None:
        assert self._nursery is not None, "ProcessRunner.run has not started"
        scope = trio.CancelScope()
        reason = ["exited"]
        self._scopes[task_id] = (scope, reason)
        self._nursery.start_soon(self._run_one, task_id, epoch, spec, gpu_uuids, scope, reason)

    def stop(self, task_id: str, reason: str) -> None:
        held = self._scopes.get(task_id)
        if held is not None:
            held[1][0] = reason
            held[0].cancel()

    async def _run_one(
        self,
        task_id: str,
        epoch: int,
        spec: TaskSpec,
        gpu_uuids: list[str],
        scope: trio.CancelScope,
        reason: list[str],
    ) -> None:
        work = self._root / f"{task_id}-{epoch}"
        started = time.time()
        code = -1
        try:
            work.mkdir(parents=True, exist_ok=True, mode=0o700)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work)}
            env.update(spec.env)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_uuids)
            env["POPULI_TASK_ID"] = task_id
            env["POPULI_TASK_EPOCH"] = str(epoch)
            with (
                (work / "stdout").open("wb") as out,
                (work / "stderr").open("wb") as err,
                scope,
            ):
                scope.deadline = trio.current_time() + spec.timeout
                proc = await trio.lowlevel.open_process(
                    list(spec.command), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                    cwd=str(work), env=env, start_new_session=True,
                )  # fmt: skip
                self.pids[task_id] = proc.pid
                try:
                    code = await proc.wait()
                finally:
                    if proc.returncode is None:
                        with trio.CancelScope(shield=True):
                            await self._kill_group(proc)
                    code = proc.returncode if proc.returncode is not None else -9
            if scope.cancelled_caught and reason[0] == "exited":
                reason[0] = "timeout"
        except OSError as exc:
            reason[0] = f"start_failed: {exc.strerror or exc}"
            code = 127
        finally:
            self._scopes.pop(task_id, None)
            self.pids.pop(task_id, None)
        exited = TaskExited(
            task_id, epoch, code, reason[0], _tail(work / "stdout"), _tail(work / "stderr"),
            started, time.time(),
        )  # fmt: skip
        await self._send.send(exited)

    async def _kill_group(self, proc: trio.Process) -> None:
        """SIGTERM to the group; once the leader is gone or the grace is over, SIGKILL
        to whatever is left of the group (children that ignored SIGTERM); then reap."""
        for sig, wait in ((signal.SIGTERM, self._grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            with trio.move_on_after(wait):
                await proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
