"""The first thing a task process runs: set its limits, then become the command.

The executor spawns ``python -I -S _task_wrapper.py SPEC_FD STATUS_FD`` in a new
session, with a clean environment (the task's environment is hostile: an
``LD_PRELOAD`` or ``PYTHONPATH`` in it must not reach a process that still runs as
root). This script, stdlib only and run by path:

1. reads its JSON instructions from ``SPEC_FD`` (a pipe; nothing shows in ``ps``);
2. joins the task's cgroup, when the executor made one;
3. makes a new network namespace when asked (``unshare(CLONE_NEWNET)`` through libc;
   ``os.unshare`` is Python 3.12+), so the task sees no interface but a down ``lo``;
4. sets rlimits (``RLIMIT_AS``, ``RLIMIT_CPU``, no core files), umask 077;
5. drops to the task user (supplementary groups cleared, gid, then uid);
6. ``execvpe``\\ s the command with the task's environment.

``STATUS_FD`` is close-on-exec: a successful exec closes it with nothing written, so
the executor reads EOF and knows the command runs. Any failure is written there as one
line and the wrapper exits 127, so the executor reports ``start_failed`` with that line
instead of guessing from an exit code.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
from typing import Any

#: From <sched.h>; stable Linux ABI.
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
#: Exit code when the command could not be started (the executor reads the status line).
START_FAILED_EXIT = 127


def _fail(status_fd: int, message: str) -> None:
    try:
        os.write(status_fd, message.encode("utf-8", "replace")[:1024])
    finally:
        os._exit(START_FAILED_EXIT)


def _new_network_namespace() -> None:
    """Root makes a network namespace directly; anyone else needs a user namespace too
    (where the kernel allows unprivileged ones), in which the task then appears as
    the overflow uid but keeps its real uid for files."""
    libc = ctypes.CDLL(None, use_errno=True)
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWNET | CLONE_NEWUSER
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _apply(spec: dict[str, Any], status_fd: int) -> None:
    cgroup = spec.get("cgroup")
    if cgroup:
        try:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError as exc:
            _fail(status_fd, f"cannot join the task cgroup {cgroup}: {exc.strerror}")
    if spec.get("no_network"):
        try:
            _new_network_namespace()
        except OSError as exc:
            _fail(
                status_fd,
                f"no-network was asked but this node cannot make a network namespace "
                f"({exc.strerror}); refusing to run the task with network",
            )
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        memory = spec.get("rlimit_as")
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = spec.get("rlimit_cpu")
        if cpu:
            # SIGXCPU at the soft limit, SIGKILL one second later if it is ignored.
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    except (OSError, ValueError) as exc:
        _fail(status_fd, f"cannot set the task's rlimits: {exc}")
    os.umask(0o077)
    uid, gid = spec.get("uid"), spec.get("gid")
    if uid is not None and gid is not None:
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        except OSError as exc:
            _fail(status_fd, f"cannot switch to uid {uid} gid {gid}: {exc.strerror}")
        if os.getuid() != uid or os.geteuid() != uid:
            _fail(status_fd, f"still not uid {uid} after setuid; refusing to run")


def main(argv: list[str]) -> None:
    spec_fd, status_fd = int(argv[1]), int(argv[2])
    os.set_inheritable(status_fd, False)
    with os.fdopen(spec_fd, "rb") as f:
        spec = json.loads(f.read())
    _apply(spec, status_fd)
    command: list[str] = spec["argv"]
    env: dict[str, str] = spec["env"]
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        _fail(status_fd, f"cannot run {command[0]!r}: {exc.strerror}")
    except ValueError as exc:  # a NUL in an argument, '=' in a variable name, ...
        _fail(status_fd, f"cannot run {command[0]!r}: {exc}")


if __name__ == "__main__":
    main(sys.argv)
