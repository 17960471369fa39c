"""`TaskLauncher`: a task's directories, log files, cgroup or rlimits, and its process.

The task runs under `_wrapper` (which forks the command; the command joins the
cgroup, makes the network namespace, sets rlimits and drops to the task's user, then
execs) as its own session and process group, in ``tasks_dir/<task_id>/<epoch>/work``,
with its stdout and stderr in files beside that directory. With `namespaces` (probed
by the executor), the wrapper forks an init first, in a PID namespace of the task's
own, whose ``/tmp`` is ``tasks_dir/<task_id>/<epoch>/tmp``. The wrapper stays the
command's parent: it holds the read end of a control pipe whose only writer is this
daemon, so the daemon's death (end of file) and fence deadlines (lines) reach it
without the daemon's event loop.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

import trio

from . import _wrapper
from ._cgroup import CgroupParent
from ._record import StartFailed, TaskRecord

__all__ = ["DEFAULT_PATH", "WRAPPER", "TaskLauncher", "monotonic_to_trio"]

WRAPPER: Final = str(Path(_wrapper.__file__).resolve())
#: The task's PATH unless its spec sets one: systemd's default for services.
DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_STATUS_BYTES_MAX: Final = 2048
_SPEC_BYTES_MAX: Final = 60_000  # below a pipe's buffer: written whole before the spawn


class TaskLauncher:
    """Prepares and spawns tasks as their user (the record's `uid`/`gid`).

    ``cgroup`` is set by the executor once it has probed for cgroup v2 (None: rlimits),
    ``namespaces`` once it has probed for PID and mount namespaces.
    """

    def __init__(self) -> None:
        self.cgroup: CgroupParent | None = None
        self.namespaces = False

    def prepare(self, task: TaskRecord) -> None:
        """Make the epoch's directory, the work dir for the task user, and the log files.

        Raises:
            StartFailed: the epoch already ran here, or a directory, file or cgroup
                could not be made.
        """
        try:
            task.epoch_dir.parent.mkdir(mode=0o711, exist_ok=True)
            task.epoch_dir.mkdir(mode=0o711)
            # Traverse-only for the task user, whatever the daemon's umask.
            task.epoch_dir.parent.chmod(0o711)
            task.epoch_dir.chmod(0o711)
        except FileExistsError as exc:
            where = f"epoch {task.epoch} of task {task.task_id}"
            raise StartFailed(f"{where} already ran here") from exc
        except OSError as exc:
            raise StartFailed(f"cannot make {task.epoch_dir}: {exc.strerror}") from exc
        try:
            # 0700 and the task's own: no other task's uid may enter them.
            for private in (task.work_dir, task.tmp_dir) if self.namespaces else (task.work_dir,):
                private.mkdir(mode=0o700)
                private.chmod(0o700)
                if task.uid is not None and task.gid is not None:
                    os.chown(private, task.uid, task.gid)
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            task.out_fd = os.open(task.epoch_dir / "stdout", flags, 0o600)
            task.err_fd = os.open(task.epoch_dir / "stderr", flags, 0o600)
        except OSError as exc:
            raise StartFailed(f"cannot prepare {task.epoch_dir}: {exc.strerror}") from exc
        if self.cgroup is not None:
            try:
                task.cgroup = self.cgroup.create(f"task-{task.task_id}-{task.epoch}")
                task.cgroup.limit(task.memory, task.spec.requirements.cpu_cores)
            except OSError as exc:
                raise StartFailed(f"cannot make the task's cgroup: {exc.strerror}") from exc
        elif task.memory is not None and not task.gpu_uuids:
            # CUDA reserves far more address space than it touches: no RLIMIT_AS for GPU
            # tasks; the watchdog still bounds their resident memory.
            task.rlimit_as = task.memory

    async def spawn(self, task: TaskRecord) -> None:
        """Start the wrapper with the task's instructions on a pipe.

        Raises:
            StartFailed: the instructions are too large, or the wrapper cannot start.
        """
        work = task.work_dir
        # Not the daemon's PATH: root's may hold directories the task's uid cannot
        # search (/root/.local/bin), and a task should find the same programs on every
        # node. The spec's env may set its own.
        env = {"PATH": DEFAULT_PATH, "HOME": str(work), "LANG": "C.UTF-8"}
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
            "uid": task.uid,
            "gid": task.gid,
            "isolate": {"tmp": str(task.tmp_dir), "work": str(work)} if self.namespaces else None,
            "deadline": task.deadline,
            "fence_grace": task.fence_grace,
        }
        payload = json.dumps(instructions).encode()
        if len(payload) > _SPEC_BYTES_MAX:
            raise StartFailed("the command and environment are too large to start")
        spec_r, spec_w = os.pipe()
        status_r, status_w = os.pipe()
        # Close-on-exec in the daemon (os.pipe's default) and passed only to this
        # wrapper: its end of file means this daemon died, nothing else.
        control_r, control_w = os.pipe()
        os.set_blocking(control_w, False)
        try:
            os.write(spec_w, payload)
            os.close(spec_w)
            task.process = await trio.lowlevel.open_process(
                [sys.executable, "-I", "-S", WRAPPER, str(spec_r), str(status_w), str(control_r)],
                stdin=subprocess.DEVNULL,
                stdout=task.out_fd,
                stderr=task.err_fd,
                start_new_session=True,
                pass_fds=(spec_r, status_w, control_r),
                env={},
                cwd=work,
            )
        except OSError as exc:
            os.close(status_r)
            os.close(control_w)
            raise StartFailed(f"cannot start the task wrapper: {exc.strerror}") from exc
        finally:
            os.close(spec_r)
            os.close(status_w)
            os.close(control_r)
        task.status_stream = trio.lowlevel.FdStream(status_r)
        task.control_fd = control_w
        if task.deadline is not None:  # moved while the wrapper started
            self.fence(task)

    @staticmethod
    def fence(task: TaskRecord) -> None:
        """Tell the wrapper the task's current fence deadline (a no-op before spawn).

        The line is far below ``PIPE_BUF``, so it is written whole or not at all; a
        wrapper too wedged to read (a full pipe) keeps its older, earlier deadline.
        """
        if task.control_fd is None or task.deadline is None:
            return
        # The wrapper counts on CLOCK_BOOTTIME, which runs through a suspend (a laptop's
        # sleep): a lease that ran out while the machine slept is over at wake-up.
        asleep = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
        line = f"fence {task.deadline + asleep!r} {task.fence_grace!r}\n".encode()
        with contextlib.suppress(OSError):
            os.write(task.control_fd, line)

    @staticmethod
    async def read_status(task: TaskRecord) -> bytes:
        """Empty once the command was exec'd (or the wrapper died first); else the
        wrapper's one-line reason (and `task.final` set when the command itself cannot
        run: missing, or not executable for the task's user)."""
        assert task.status_stream is not None
        while b"\n" not in task.status_seen and len(task.status_seen) < _STATUS_BYTES_MAX:
            chunk = await task.status_stream.receive_some(_STATUS_BYTES_MAX)
            if not chunk:
                break
            task.status_seen += chunk
        first = task.status_seen.partition(b"\n")[0]
        if first.startswith(b"ok ") and first[3:].isdigit():
            task.init_pid = int(first[3:])
        word, _, reason = first.partition(b" ")
        if word == _wrapper.UNRUNNABLE.encode():
            task.final = True
            return reason.strip() or b"the command cannot run"
        return reason.strip() if word == b"fail" else b""

    @staticmethod
    async def read_rest(task: TaskRecord, timeout: float) -> bytes:
        """Everything the wrapper wrote, once it has exited (bounded by `timeout`)."""
        if task.status_stream is None:
            return task.status_seen
        with trio.move_on_after(timeout):
            while len(task.status_seen) < _STATUS_BYTES_MAX:
                chunk = await task.status_stream.receive_some(_STATUS_BYTES_MAX)
                if not chunk:
                    break
                task.status_seen += chunk
        return task.status_seen


def monotonic_to_trio(deadline: float) -> float:
    """A ``time.monotonic()`` instant on Trio's clock (which has its own offset)."""
    return trio.current_time() + (deadline - time.monotonic())
