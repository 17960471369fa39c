"""The executor service: HOW a task runs on this node, once the lease service says WHAT.

Events in: `start(task_id, epoch, spec, gpu_uuids)` and `stop(task_id, reason)` from
the lease service. Events out: one `TaskExited` per `start`, on `exits`.

Each task runs as its own session and process group, through `_task_wrapper` (which
joins a cgroup, makes a network namespace, sets rlimits and drops to the task user,
then execs the command), in ``tasks_dir/<task_id>/<epoch>/work`` with its stdout and
stderr in files beside it. A supervisor per task (a Trio task in this service's
nursery, no threads) waits for the exit and enforces the limits, keeping the node
stable first (docs/executor.md):

- the spec's timeout: SIGTERM to the group, SIGKILL after ``grace_period``;
- memory: cgroup ``memory.max`` when the node may use cgroup v2, else ``RLIMIT_AS``
  (per process, tasks without GPUs) plus a watchdog on the group's summed RSS, which
  SIGKILLs at once;
- CPU time: ``RLIMIT_CPU`` per process plus the watchdog on the group's sum;
- no network: a fresh network namespace, or the task does not start.

When the leader exits, whatever is left of its group is killed: nothing a task
started outlives it. On node shutdown every running task is killed (SIGKILL, no
grace) and reported ``shutdown``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pwd
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final, Literal

import attrs
import trio

from .._log import event, get_logger
from ..leases import TaskSpec
from . import _task_wrapper
from ._cgroup import CgroupParent, TaskCgroup, probe
from ._executor_config import ExecutorConfig
from ._proc import group_usage
from ._task_types import RunningTask, TaskExited, TaskLimits

__all__ = [
    "ExecutorConfig",
    "ExecutorService",
    "RunningTask",
    "Stream",
    "TaskExited",
    "TaskLimits",
    "resolve_task_user",
]

Stream = Literal["stdout", "stderr"]

#: A task id is a path component: letters, digits, ``_`` and ``-`` only (lease ids are hex).
_TASK_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
#: A GPU UUID goes into a comma-separated variable: no commas, no spaces.
_GPU_UUID: Final = re.compile(r"[A-Za-z0-9_:.-]{1,96}")
_EPOCH_MAX: Final = 1 << 62
_DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What a program says when an allocation fails under RLIMIT_AS (Python, libc, C++, Go...).
_OOM_MARKERS: Final = (b"MemoryError", b"Cannot allocate memory", b"bad_alloc", b"out of memory")
_WRAPPER: Final = str(Path(_task_wrapper.__file__).resolve())
_STATUS_BYTES_MAX: Final = 2048
_SPEC_BYTES_MAX: Final = 60_000  # below a pipe's buffer: written whole before the spawn

_log = get_logger("executor")


class _StartFailed(Exception):
    """The task cannot start; the message is the one line the result carries."""


@attrs.define
class _Task:
    """The supervisor's mutable record of one task (never handed out)."""

    task_id: str
    epoch: int
    spec: TaskSpec
    gpu_uuids: list[str]
    no_network: bool
    memory: int | None
    cpu_time: float
    started_at: float
    epoch_dir: Path
    process: trio.Process | None = None
    cgroup: TaskCgroup | None = None
    out_fd: int | None = None
    err_fd: int | None = None
    status_fd: int | None = None
    reason: str | None = None
    detail: str = ""
    rlimit_as: int | None = None
    stop_requested: trio.Event = attrs.field(factory=trio.Event)

    def request(self, reason: str, detail: str) -> None:
        """The first reason to stop wins; later ones are ignored."""
        if self.reason is None:
            self.reason, self.detail = reason, detail
            self.stop_requested.set()


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
        self._uid, self._gid, self.user = resolve_task_user(config.task_user)
        self._cgroup: CgroupParent | None = None
        self.limiter_detail = "rlimits (cgroup v2 disabled by configuration)"
        self._tasks: dict[str, _Task] = {}
        self._nursery: trio.Nursery | None = None
        self._send, self.exits = trio.open_memory_channel[TaskExited](config.exits_buffer)
        self._counts: dict[str, int] = {}

    ############################################################################
    # The interface the lease service uses

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; on cancellation every running task is killed."""
        if self.config.use_cgroup:
            self._cgroup, self.limiter_detail = probe(self.config.cgroup_parent)
            if self._cgroup is None:
                self.limiter_detail = f"rlimits and a watchdog ({self.limiter_detail})"
        self.config.tasks_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.config.tasks_dir.chmod(0o711)  # mkdir's mode is masked by the umask
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
    ) -> None:
        """Start running `spec` at `epoch`; its end arrives on `exits`, always exactly once.

        Every argument is treated as hostile: a bad one ends in a ``start_failed``
        event with the reason, never an exception. Must be called after `run` started.
        """
        if self._nursery is None:
            raise RuntimeError("ExecutorService.start before run() started")  # our bug
        now = time.time()
        limits = limits if limits is not None else TaskLimits()
        memory = limits.memory if limits.memory is not None else (spec.requirements.ram or None)
        cpu_time = limits.cpu_time
        if cpu_time is None:
            cpu_time = spec.timeout * max(1.0, spec.requirements.cpu_cores)
        problem = _check_arguments(task_id, epoch, gpu_uuids)
        if problem is None and task_id in self._tasks:
            problem = f"task {task_id} is already running here (epoch {self._tasks[task_id].epoch})"
        safe_id = task_id if problem is None else "invalid"
        task = _Task(
            task_id=task_id,
            epoch=epoch,
            spec=spec,
            gpu_uuids=list(gpu_uuids),
            no_network=limits.no_network or spec.no_network,
            memory=memory,
            cpu_time=cpu_time,
            started_at=now,
            epoch_dir=self.config.tasks_dir / safe_id / str(epoch if problem is None else 0),
        )
        try:
            if problem is not None:
                raise _StartFailed(problem)
            # Synchronous, so `log_path` and `follow_log` work as soon as `start` returns.
            self._prepare(task)
        except _StartFailed as exc:
            ended = self._exited(task, "start_failed", str(exc))
            task.reason = "start_failed"
            self._release(task)
            self._nursery.start_soon(self._send.send, ended)
            return
        self._tasks[task_id] = task
        self._nursery.start_soon(self._supervise, task)

    def stop(self, task_id: str, reason: str) -> None:
        """Stop the task's whole group: SIGTERM, then SIGKILL after ``grace_period``.

        Unknown or finished tasks are ignored (the end was or will be reported). The
        `TaskExited` says ``cancelled`` and carries `reason` as its detail.
        """
        task = self._tasks.get(task_id)
        if task is not None:
            task.request("cancelled", reason[:200])

    def running(self) -> dict[str, RunningTask]:
        """The tasks started and not yet reported, by id."""
        return {tid: self._view(t) for tid, t in sorted(self._tasks.items())}

    def log_path(self, task_id: str, stream: Stream = "stdout") -> Path:
        """The file holding the task's full output, for its latest epoch run here.

        Raises:
            ValueError: `task_id` is not a valid id, or `stream` is not a stream.
            FileNotFoundError: this node never ran the task (or its files are gone).
        """
        if not isinstance(task_id, str) or not _TASK_ID.fullmatch(task_id):
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
    # One supervisor per task

    async def _supervise(self, task: _Task) -> None:
        try:
            ended = await self._execute(task)
        except BaseException:
            # The node is shutting down (or we have a bug): the task must not outlive us.
            with trio.CancelScope(shield=True):
                task.request("shutdown", "the node shut down while the task ran")
                await self._reap(task, signal.SIGKILL)
                ended = self._exited(task, "shutdown", task.detail)
                self._finish(task, ended.reason)
            with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
                self._send.send_nowait(ended)
            raise
        self._finish(task, ended.reason)
        await self._send.send(ended)

    async def _execute(self, task: _Task) -> TaskExited:
        if task.reason is not None:  # stopped before it could start
            return self._exited(task, task.reason, task.detail)
        try:
            await self._spawn(task)
        except _StartFailed as exc:
            return self._exited(task, "start_failed", str(exc))
        assert task.process is not None
        pid = task.process.pid
        event(_log, 20, "executor.started", task=task.task_id, epoch=task.epoch, pid=pid)
        deadline = trio.current_time() + task.spec.timeout
        failure = b""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._timer, task, deadline)
            nursery.start_soon(self._stopper, task)
            failure = await self._read_status(task)
            if not failure:
                nursery.start_soon(self._watchdog, task)
            await task.process.wait()
            nursery.cancel_scope.cancel()
        # Decide why it ended now: a stop() arriving while the rest of the group is
        # reaped must not turn a task's own exit into "cancelled".
        if failure:
            outcome = "start_failed", failure.decode("utf-8", "replace").strip()
        else:
            outcome = self._classify(task)
        await self._reap(task, signal.SIGKILL)
        return self._exited(task, *outcome)

    def _prepare(self, task: _Task) -> None:
        """Make the epoch's directory, the work dir for the task user, and the log files."""
        try:
            task.epoch_dir.parent.mkdir(mode=0o711, exist_ok=True)
            task.epoch_dir.mkdir(mode=0o711)
            # Traverse-only for the task user, whatever the daemon's umask.
            task.epoch_dir.parent.chmod(0o711)
            task.epoch_dir.chmod(0o711)
        except FileExistsError as exc:
            where = f"epoch {task.epoch} of task {task.task_id}"
            raise _StartFailed(f"{where} already ran here") from exc
        except OSError as exc:
            raise _StartFailed(f"cannot make {task.epoch_dir}: {exc.strerror}") from exc
        try:
            work = task.epoch_dir / "work"
            work.mkdir(mode=0o700)
            work.chmod(0o700)
            if self._uid is not None and self._gid is not None:
                os.chown(work, self._uid, self._gid)
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            task.out_fd = os.open(task.epoch_dir / "stdout", flags, 0o600)
            task.err_fd = os.open(task.epoch_dir / "stderr", flags, 0o600)
        except OSError as exc:
            raise _StartFailed(f"cannot prepare {task.epoch_dir}: {exc.strerror}") from exc
        if self._cgroup is not None:
            try:
                task.cgroup = self._cgroup.create(f"task-{task.task_id}-{task.epoch}")
                task.cgroup.limit(task.memory, task.spec.requirements.cpu_cores)
            except OSError as exc:
                raise _StartFailed(f"cannot make the task's cgroup: {exc.strerror}") from exc
        elif task.memory is not None and not task.gpu_uuids:
            # CUDA reserves far more address space than it touches: no RLIMIT_AS for GPU
            # tasks; the watchdog still bounds their resident memory.
            task.rlimit_as = task.memory

    async def _spawn(self, task: _Task) -> None:
        work = task.epoch_dir / "work"
        env = {"PATH": os.environ.get("PATH", _DEFAULT_PATH), "HOME": str(work), "LANG": "C.UTF-8"}
        env.update(task.spec.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(task.gpu_uuids)
        env["POPULI_TASK_ID"] = task.task_id
        env["POPULI_TASK_EPOCH"] = str(task.epoch)
        instructions = {
            "argv": list(task.spec.command),
            "env": env,
            "cgroup": str(task.cgroup.path) if task.cgroup is not None else None,
            "no_network": task.no_network,
            "rlimit_as": task.rlimit_as,
            "rlimit_cpu": math.ceil(task.cpu_time),
            "uid": self._uid,
            "gid": self._gid,
        }
        payload = json.dumps(instructions).encode()
        if len(payload) > _SPEC_BYTES_MAX:
            raise _StartFailed("the command and environment are too large to start")
        spec_r, spec_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            os.write(spec_w, payload)
            os.close(spec_w)
            task.process = await trio.lowlevel.open_process(
                [sys.executable, "-I", "-S", _WRAPPER, str(spec_r), str(status_w)],
                stdin=subprocess.DEVNULL,
                stdout=task.out_fd,
                stderr=task.err_fd,
                start_new_session=True,
                pass_fds=(spec_r, status_w),
                env={},
                cwd=work,
            )
        except OSError as exc:
            os.close(status_r)
            raise _StartFailed(f"cannot start the task wrapper: {exc.strerror}") from exc
        finally:
            os.close(spec_r)
            os.close(status_w)
        task.status_fd = status_r

    async def _read_status(self, task: _Task) -> bytes:
        """Empty once the command was exec'd; else the wrapper's one-line reason."""
        message = b""
        assert task.status_fd is not None
        fd, task.status_fd = task.status_fd, None  # the stream owns (and closes) it now
        async with trio.lowlevel.FdStream(fd) as stream:
            while len(message) < _STATUS_BYTES_MAX:
                chunk = await stream.receive_some(_STATUS_BYTES_MAX)
                if not chunk:
                    break
                message += chunk
        return message[:_STATUS_BYTES_MAX]

    async def _timer(self, task: _Task, deadline: float) -> None:
        await trio.sleep_until(deadline)
        task.request("timeout", f"ran past its timeout of {task.spec.timeout:g} s")

    async def _stopper(self, task: _Task) -> None:
        """On any stop request: SIGTERM the group (SIGKILL for memory), then SIGKILL."""
        await task.stop_requested.wait()
        assert task.process is not None
        if task.reason == "memory":
            self._signal(task, signal.SIGKILL)
            return
        self._signal(task, signal.SIGTERM)
        with trio.move_on_after(self.config.grace_period):
            await task.process.wait()
        self._signal(task, signal.SIGKILL)

    async def _watchdog(self, task: _Task) -> None:
        """Stop the task when its group's memory or CPU time passes the limit."""
        assert task.process is not None
        pgid = task.process.pid
        while True:
            await trio.sleep(self.config.poll_interval)
            if task.cgroup is not None:
                if task.cgroup.oom_kills() > 0:
                    task.request("memory", _memory_detail(task.memory))
                cpu = task.cgroup.cpu_time()
            else:
                usage = group_usage(pgid)
                if task.memory is not None and usage.rss > task.memory:
                    task.request("memory", _memory_detail(task.memory))
                cpu = usage.cpu_time
            if cpu > task.cpu_time:
                task.request("cpu", f"used more than {task.cpu_time:g} s of CPU time")

    async def _reap(self, task: _Task, sig: int) -> None:
        """Signal the group, wait for the leader, kill what is left, wait for it to go."""
        process = task.process
        if process is None:
            return
        if process.returncode is None:
            self._signal(task, sig)
            await process.wait()
        self._signal(task, signal.SIGKILL)
        with trio.move_on_after(self.config.grace_period):
            while group_usage(process.pid).members:
                await trio.sleep(self.config.poll_interval)

    def _signal(self, task: _Task, sig: int) -> None:
        assert task.process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(task.process.pid, sig)
        if sig == signal.SIGKILL and task.cgroup is not None:
            task.cgroup.kill()

    def _classify(self, task: _Task) -> tuple[str, str]:
        """Why the process ended: our stop request, else what the kernel says."""
        assert task.process is not None
        code = task.process.returncode
        if task.reason is not None:
            return task.reason, task.detail
        if task.cgroup is not None and task.cgroup.oom_kills() > 0:
            return "memory", _memory_detail(task.memory)
        if code == -signal.SIGXCPU:
            return "cpu", f"used more than {task.cpu_time:g} s of CPU time"
        failed_under_rlimit = code != 0 and task.rlimit_as is not None
        if failed_under_rlimit and any(m in _tail(task.err_fd, 4096) for m in _OOM_MARKERS):
            return "memory", _memory_detail(task.memory) + " (an allocation failed)"
        return "exited", f"exited with code {code}"

    ############################################################################
    # Results and bookkeeping

    def _exited(self, task: _Task, reason: str, detail: str) -> TaskExited:
        code = task.process.returncode if task.process is not None else None
        n = self.config.tail_bytes
        return TaskExited(
            task_id=task.task_id,
            epoch=task.epoch,
            exit_code=code,
            reason=reason,
            stdout_tail=_tail(task.out_fd, n),
            stderr_tail=_tail(task.err_fd, n),
            started_at=task.started_at,
            ended_at=time.time(),
            detail=detail,
        )

    def _finish(self, task: _Task, reason: str) -> None:
        self._tasks.pop(task.task_id, None)
        task.reason = reason
        self._release(task)

    def _release(self, task: _Task) -> None:
        """Count the end, close our files, remove the cgroup."""
        self._count(task.reason or "exited")
        for fd in (task.out_fd, task.err_fd, task.status_fd):
            if fd is not None:
                os.close(fd)
        task.out_fd = task.err_fd = task.status_fd = None
        if task.cgroup is not None:
            task.cgroup.kill()
            task.cgroup.remove()

    def _count(self, key: str) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1

    def _view(self, task: _Task) -> RunningTask:
        return RunningTask(
            task_id=task.task_id,
            epoch=task.epoch,
            pid=task.process.pid if task.process is not None else None,
            started_at=task.started_at,
            workdir=str(task.epoch_dir / "work"),
            memory_limit=task.memory,
            cpu_time_limit=task.cpu_time,
            no_network=task.no_network,
            user=self.user,
            limiter="cgroup" if task.cgroup is not None else "rlimit",
        )


def _check_arguments(task_id: object, epoch: object, gpu_uuids: object) -> str | None:
    """One line saying what is wrong with the arguments, or None."""
    if not isinstance(task_id, str) or not _TASK_ID.fullmatch(task_id):
        return "task id must be 1..128 letters, digits, '_' or '-'"
    if type(epoch) is not int or not 0 <= epoch < _EPOCH_MAX:
        return f"epoch must be an integer in 0..{_EPOCH_MAX - 1}"
    if not isinstance(gpu_uuids, list) or not all(
        isinstance(u, str) and _GPU_UUID.fullmatch(u) for u in gpu_uuids
    ):
        return "gpu uuids must be a list of GPU UUID strings (letters, digits, ':', '.', '_', '-')"
    return None


def resolve_task_user(name: str | None) -> tuple[int | None, int | None, str]:
    """(uid, gid, name) to switch to, or (None, None, name) to stay who we are.

    Raises:
        ValueError: one line: no such user, or the daemon is not root and names another.
    """
    me = pwd.getpwuid(os.geteuid()).pw_name if os.geteuid() >= 0 else "?"
    if os.geteuid() != 0:
        if name not in (None, me):
            raise ValueError(
                f"--task-user {name}: only a daemon running as root can switch users; omit it"
            )
        return None, None, me
    name = name or "nobody"
    if name == "root":
        return None, None, "root"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"--task-user {name}: no such user on this machine (try nobody)") from None
    if entry.pw_uid == 0:
        return None, None, name
    return entry.pw_uid, entry.pw_gid, name


def _tail(fd: int | None, n: int) -> bytes:
    """The last `n` bytes of an open file, read at an offset (our own fd: no path races)."""
    if fd is None or n == 0:
        return b""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, n, max(0, size - n))
    except OSError:
        return b""


def _memory_detail(memory: int | None) -> str:
    return f"used more than its memory limit of {memory} bytes"
