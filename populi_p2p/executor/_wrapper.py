"""The task's first process: set its limits, start the command, and outlive it.

The executor spawns ``python -I -S _wrapper.py SPEC_FD STATUS_FD CONTROL_FD`` in a
new session, with a clean environment (the task's environment is hostile: an
``LD_PRELOAD`` or ``PYTHONPATH`` in it must not reach a process that still runs as
root). This script, stdlib only and run by path, stays the parent of the command so
that something outside the daemon's event loop owns the task's processes:

1. reads its JSON instructions from ``SPEC_FD`` (a pipe; nothing shows in ``ps``);
2. makes itself a child subreaper, so every orphan of the task is re-parented to it;
3. forks the command, which joins the task's cgroup, makes a network namespace when
   asked (``unshare`` through libc; ``os.unshare`` is Python 3.12+), sets rlimits and
   umask 077, drops to the task user (groups, gid, uid), sets ``PR_SET_PDEATHSIG`` to
   SIGKILL (after the uid change, which would clear it), looks the command up along
   the task's ``PATH`` as that user, and ``execve``\\ s it;
4. watches three things: the command's end, ``CONTROL_FD`` and the fence deadline.

When the spec says ``isolate`` (a root daemon whose kernel passed `probe`), step 3
goes through an init: the wrapper makes a PID namespace for its children and forks
the task's pid 1, which makes its own mount and IPC namespaces (a fresh ``/proc``,
``/tmp`` and ``/var/tmp`` on the task's own tmp dir, an empty ``/dev/shm``), forks the
command as above, reaps whatever is orphaned inside, and when the command ends hands
its wait status to the wrapper and exits, which kills everything left in the
namespace. The init stays root, ignores what the wrapper ignores (a PID namespace's
init gets no signal it has no handler for but SIGKILL and SIGSTOP), and dies with the
wrapper (``PR_SET_PDEATHSIG``, and a lifeline pipe for the instant before it was set).

``CONTROL_FD`` is a pipe whose only writer is the daemon: end of file means the daemon
is gone (even by SIGKILL), and the wrapper then kills the task's whole tree. Lines on
it (``fence DEADLINE GRACE``) move the fence: at ``DEADLINE - GRACE`` (CLOCK_BOOTTIME,
the same clock system-wide, which unlike CLOCK_MONOTONIC runs while the machine is
suspended) the group gets SIGTERM, at ``DEADLINE`` the tree is killed, whether or not
the daemon's loop runs. The wrapper looks at the clock at least every
``FENCE_CHECK_MAX`` seconds, since a poll's timeout does not count a suspend.

``STATUS_FD`` carries lines to the daemon: ``ok`` once the command was exec'd (``ok
PID`` with an init: PID is the init's, which is not the task's to pay for), or
``fail REASON``, or ``unrunnable REASON`` when the command is missing or not executable
for the task's user (the wrapper then exits 127, with ``populi: REASON`` on the task's
stderr), and later ``fenced`` if the fence stopped the task. When the command ends,
whatever is left of its group and of the descendants is killed and reaped, and the
wrapper ends the way the command did (same exit code, or killed by the same signal),
so the executor reads the command's status as its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import math
import os
import resource
import select
import signal
import stat
import sys
import time
from typing import Any, NoReturn

#: From <sched.h> and <linux/prctl.h>; stable Linux ABI.
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
#: From <sys/mount.h>.
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: Exit code when the command could not be started (the executor reads the status line).
START_FAILED_EXIT = 127
#: First word of the status line (instead of ``fail``) when the command itself cannot
#: run as given: not found, or not executable for the task's user.
UNRUNNABLE = "unrunnable"
#: Signals the wrapper ignores (a stop's SIGTERM to the group is for the command) and
#: those Python ignores at start-up; the command gets all of them back at default.
_IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_RESET = (*_IGNORED, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0))


def _fail(status_fd: int, message: str) -> NoReturn:
    try:
        os.write(status_fd, message.encode("utf-8", "replace")[:1024])
    finally:
        os._exit(START_FAILED_EXIT)


def _mount(source: str | None, target: str, kind: str | None, flags: int, data: str = "") -> None:
    def raw(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    if _libc.mount(raw(source), raw(target), raw(kind), ctypes.c_ulong(flags), raw(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target}: {os.strerror(errno)}")


def _isolate(tmp: str, work: str | None) -> None:
    """In the task's new PID namespace: its own mount and IPC namespaces, a fresh
    ``/proc`` (only the task's processes), ``/tmp`` and ``/var/tmp`` on `tmp`, an empty
    ``/dev/shm``; `work` still reachable at its path should it lie under those."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    path_only = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    tmp_fd = os.open(tmp, path_only)
    work_fd = os.open(work, path_only) if work else None
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for shared in ("/tmp", "/var/tmp"):
        if os.path.isdir(shared) and not os.path.islink(shared):
            _mount(f"/proc/self/fd/{tmp_fd}", shared, None, MS_BIND)
    if os.path.isdir("/dev/shm") and not os.path.islink("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    if work and work_fd is not None:
        here, there = os.fstat(work_fd), None
        with contextlib.suppress(OSError):
            there = os.stat(work)
        if there is None or (there.st_dev, there.st_ino) != (here.st_dev, here.st_ino):
            os.makedirs(work, mode=0o711, exist_ok=True)  # in the task's own tmp
            _mount(f"/proc/self/fd/{work_fd}", work, None, MS_BIND)
        os.close(work_fd)
    os.close(tmp_fd)


def probe(directory: str) -> str:
    """``ok`` if this kernel gives a task the namespaces `_isolate` makes (binding
    `directory` as its tmp), else why not: one line for the executor's start-up log."""
    if os.geteuid() != 0:
        return "not root"
    try:
        _check(_libc.unshare(CLONE_NEWPID))
    except OSError as exc:
        return f"no PID namespace: {exc.strerror}"
    why_r, why_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            _isolate(directory, None)
        except OSError as exc:
            os.write(why_w, f"no private mounts: {exc.strerror}".encode())
        except BaseException as exc:
            os.write(why_w, f"no private mounts: {exc}".encode())
        finally:
            os._exit(0)
    os.close(why_w)
    with os.fdopen(why_r, "rb") as f:
        why = f.read(1024).decode("utf-8", "replace")
    os.waitpid(child, 0)
    return why or "ok"


def _new_network_namespace() -> None:
    """Root makes a network namespace directly; anyone else needs a user namespace too
    (where the kernel allows unprivileged ones), in which the task then appears as
    the overflow uid but keeps its real uid for files."""
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWNET | CLONE_NEWUSER
    _check(_libc.unshare(flags))


############################################################################
# The command's side of the fork


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


def _become_command(spec: dict[str, Any], exec_fd: int, parent: int) -> None:
    """In the forked child: limits, user, death signal, exec. Never returns.

    `parent` is the pid our parent has as we see it: the wrapper's, or 1 (the init).
    """
    try:
        signal.set_wakeup_fd(-1)
        for sig in _RESET:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        _apply(spec, exec_fd)
        # Last, after the uid change (which clears it): the wrapper (or the init) is
        # single-threaded, so "parent thread" means it. If it is already gone, so are we.
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(START_FAILED_EXIT)
        command: list[str] = spec["argv"]
        try:
            _exec(command, spec["env"], exec_fd)
        except ValueError as exc:  # a NUL in an argument, '=' in a variable name, ...
            _fail(exec_fd, f"cannot run {command[0]!r}: {exc}")
    except BaseException as exc:  # never run the wrapper's code twice
        _fail(exec_fd, f"cannot start the command: {exc}")
    finally:
        os._exit(START_FAILED_EXIT)


def _find(name: str, path: str) -> tuple[list[str], list[str]]:
    """The files `name` may be along `path` (as ``execvp`` looks, empty entries being
    the work dir), and the entries this uid cannot search."""
    if "/" in name:
        return [name], []
    found, closed = [], []
    for entry in path.split(":") if name else []:
        candidate = os.path.join(entry or ".", name)
        try:
            if stat.S_ISREG(os.stat(candidate).st_mode):
                found.append(candidate)
        except PermissionError:
            closed.append(entry)
        except OSError:
            continue
    return found, closed


def _interpreter(path: str) -> str:
    """The program a script's ``#!`` line names ('' if none or unreadable)."""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        line = f.read(256).partition(b"\n")[0]
        if line.startswith(b"#!") and line[2:].split():
            return line[2:].split()[0].decode("utf-8", "replace")
    return ""


def _exec(argv: list[str], env: dict[str, str], exec_fd: int) -> NoReturn:
    """Exec the command as the task's user, or say in one line why it cannot run.

    A command that is missing or not executable for this uid is `UNRUNNABLE` (the
    spec's fault: no retry would do better); any other failure is a plain ``fail``.
    """
    name, uid = argv[0], os.getuid()
    path = env.get("PATH", "")
    found, closed = _find(name, path)
    first: tuple[str, OSError] | None = None
    for candidate in found:
        try:
            os.execve(candidate, argv, env)
        except OSError as failed:
            first = first or (candidate, failed)
    head = f"{UNRUNNABLE} cannot run {name!r}"
    if first is None:
        where = f" in PATH={path}" if "/" not in name else ""
        shut = f"; not searchable by uid {uid}: {':'.join(closed)}" if closed else ""
        _fail(exec_fd, f"{head}: command not found{where}{shut}")
    candidate, exc = first
    at = f" ({candidate})" if candidate != name else ""
    if exc.errno == errno.ENOENT and os.path.lexists(candidate):
        script = _interpreter(candidate)
        missing = f"its interpreter {script!r}" if script else "its interpreter"
        _fail(exec_fd, f"{head}{at}: not executable: {missing} was not found")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        _fail(exec_fd, f"{head}: command not found ({exc.strerror})")
    if exc.errno in (errno.EACCES, errno.EPERM):
        _fail(
            exec_fd,
            f"{head}{at}: not executable by uid {uid} ({exc.strerror}): it needs"
            " the x bit, search on each directory above it and a mount without noexec",
        )
    if exc.errno == errno.ENOEXEC:
        _fail(exec_fd, f"{head}{at}: not executable ({exc.strerror}): a script needs a #! line")
    if exc.errno in (errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG):
        _fail(exec_fd, f"{head}{at}: not executable ({exc.strerror})")
    _fail(exec_fd, f"cannot run {name!r}{at}: {exc.strerror}")


def _init(spec: dict[str, Any], fds: tuple[int, int, int], wrappers: tuple[int, ...]) -> None:
    """The task's pid 1: namespaces, the command, its orphans. Never returns.

    `fds` are the exec pipe (as for `_become_command`), the report pipe and the
    lifeline; `wrappers` the wrapper's own descriptors, closed here. When the command
    ends, its wait status goes to the wrapper on the report pipe (a namespace's init
    cannot end the way a signal would end it) and we exit: the kernel then kills
    whatever is left in the namespace.
    """
    exec_fd, report_fd, lifeline = fds
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wrappers:
            os.close(fd)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([lifeline], [], [], 0)[0]:  # end of file: the wrapper is gone
            os._exit(START_FAILED_EXIT)
        isolate: dict[str, Any] = spec["isolate"]
        try:
            _isolate(isolate["tmp"], isolate.get("work"))
        except OSError as exc:
            _fail(exec_fd, f"cannot isolate the task: {exc.strerror}")
        command = os.fork()
        if command == 0:
            os.close(report_fd)
            os.close(lifeline)
            _become_command(spec, exec_fd, 1)
        os.close(exec_fd)
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == command:
                os.write(report_fd, str(status).encode())
                os._exit(0)
    except BaseException as exc:  # never run the wrapper's code twice
        with contextlib.suppress(OSError):
            _fail(exec_fd, f"cannot start the task's init: {exc}")
    finally:
        os._exit(START_FAILED_EXIT)


############################################################################
# The wrapper's side: watch, fence, kill the tree


def _ours(me: int) -> list[int]:
    """Every live process in our group or below us in the process tree (not us)."""
    children: dict[int, list[int]] = {}
    found: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            children.setdefault(int(fields[1]), []).append(int(name))
            if int(fields[2]) == me:
                found.add(int(name))
        except (OSError, ValueError, IndexError):
            continue
    frontier = [me]
    while frontier:
        below = children.get(frontier.pop(), [])
        found.update(below)
        frontier.extend(below)
    found.discard(me)
    return sorted(found)


class _Watch:
    """The wrapper's state once the command runs."""

    def __init__(self, child: int, spec: dict[str, Any], status_fd: int) -> None:
        self.child = child
        self.status: int | None = None  # the command's wait status, once reaped
        self.cgroup: str | None = spec.get("cgroup")
        self.status_fd = status_fd
        self.deadline: float | None = spec.get("deadline")
        grace = spec.get("fence_grace")
        self.grace: float = 1.0 if grace is None else float(grace)
        self.fenced = False  # SIGTERM sent for the fence: past the point of no return
        self.pending = b""

    def reap(self, block: bool) -> bool:
        """Reap children; False once none is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.child:
                self.status = status
            if block:
                return True

    def kill_tree(self) -> None:
        """SIGKILL the group, the cgroup and every descendant until none is left."""
        me = os.getpid()
        while True:
            if self.cgroup:
                with contextlib.suppress(OSError), open(f"{self.cgroup}/cgroup.kill", "w") as f:
                    f.write("1")
            for pid in _ours(me):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if not self.reap(block=True):
                return

    def control(self, data: bytes) -> None:
        """Take ``fence DEADLINE GRACE`` lines; a fence that already began stays."""
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            words = line.split()
            if len(words) == 3 and words[0] == b"fence" and not self.fenced:
                with contextlib.suppress(ValueError):
                    deadline, grace = float(words[1]), float(words[2])
                    if math.isfinite(deadline) and math.isfinite(grace):
                        self.deadline, self.grace = deadline, max(0.0, grace)

    def fence_step(self) -> float | None:
        """Act on the fence now; seconds until it next needs us (None: no fence)."""
        if self.deadline is None:
            return None
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        if not self.fenced and now >= self.deadline - self.grace:
            self.fenced = True
            with contextlib.suppress(OSError):
                os.write(self.status_fd, b"fenced\n")
            if now < self.deadline:  # no TERM to whom the KILL goes at once
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgrp(), signal.SIGTERM)  # we ignore it; the task does not
        if now >= self.deadline:
            self.kill_tree()
            return 0.0
        due = (self.deadline if self.fenced else self.deadline - self.grace) - now
        return min(due, FENCE_CHECK_MAX)


#: Longest wait between two looks at the fence clock: a poll's timeout does not count
#: a suspend, so after a wake-up the fence fires within this.
FENCE_CHECK_MAX = 0.25


def _watch(watch: _Watch, control_fd: int, wake_fd: int) -> None:
    """Until the command ends (or the fence or the daemon's death ends it)."""
    poller = select.poll()
    poller.register(control_fd, select.POLLIN)
    poller.register(wake_fd, select.POLLIN)
    while watch.status is None:
        wait = watch.fence_step()
        if watch.status is not None:
            break
        timeout = None if wait is None else max(0, int(wait * 1000) + 1)
        for fd, _ in poller.poll(timeout):
            if fd == wake_fd:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_fd, 4096)
                watch.reap(block=False)
            elif fd == control_fd:
                data = os.read(control_fd, 4096)
                if not data:  # the daemon is gone: so is its task
                    watch.kill_tree()
                    os._exit(START_FAILED_EXIT)
                watch.control(data)
    watch.kill_tree()


def _end_like(status: int) -> None:
    """Exit the way the command did, so our parent reads its status as ours."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's action is fixed
            signal.signal(sig, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default is not to end a process
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _command_status(report_fd: int, fallback: int) -> int:
    """The command's wait status as its init reported it (else the init's own)."""
    os.set_blocking(report_fd, False)
    with contextlib.suppress(OSError, ValueError):
        return int(os.read(report_fd, 64))
    return fallback


def main(argv: list[str]) -> None:
    if argv[1] == "probe":
        print(probe(argv[2]))
        return
    spec_fd, status_fd, control_fd = int(argv[1]), int(argv[2]), int(argv[3])
    for fd in (status_fd, control_fd):
        os.set_inheritable(fd, False)
    with os.fdopen(spec_fd, "rb") as f:
        spec = json.loads(f.read())
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # re-raising SIGSEGV dumps nothing
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError as exc:
        _fail(status_fd, f"fail cannot become the task's subreaper: {exc.strerror}\n")
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    exec_r, exec_w = os.pipe()
    report_r, report_w = os.pipe()  # the init's report of the command's status
    lifeline_r, lifeline_w = os.pipe()  # never written: its end of file is our death
    isolate = bool(spec.get("isolate"))
    if isolate:
        try:
            _check(_libc.unshare(CLONE_NEWPID))
        except OSError as exc:
            _fail(status_fd, f"fail cannot make the task's PID namespace: {exc.strerror}\n")
    # Blocked across the fork: a stop's SIGTERM then reaches the child after it
    # restored the default action, instead of meeting our SIG_IGN.
    signal.pthread_sigmask(signal.SIG_BLOCK, set(_IGNORED))
    wrapper = os.getpid()
    child = os.fork()
    if child == 0:
        if isolate:
            ours = (status_fd, control_fd, wake_r, wake_w, exec_r, report_r, lifeline_w)
            _init(spec, (exec_w, report_w, lifeline_r), ours)
        _become_command(spec, exec_w, wrapper)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(_IGNORED))
    for fd in (exec_w, report_w, lifeline_r):
        os.close(fd)
    with os.fdopen(exec_r, "rb") as f:
        failure = f.read(2048)  # EOF with nothing: the exec happened (close-on-exec)
    watch = _Watch(child, spec, status_fd)
    if failure:
        line = failure.replace(b"\n", b" ")
        word, _, reason = line.partition(b" ")
        if word != UNRUNNABLE.encode():
            line, reason = b"fail " + line, line
        with contextlib.suppress(OSError):  # where `logs` and `submit --wait` show it
            os.write(2, b"populi: " + reason + b"\n")
        os.write(status_fd, line + b"\n")
        watch.kill_tree()
        os._exit(START_FAILED_EXIT)
    with contextlib.suppress(OSError):  # a dead daemon: the control pipe says so next
        os.write(status_fd, f"ok {child}\n".encode() if isolate else b"ok\n")
    try:
        _watch(watch, control_fd, wake_r)
    except BaseException:
        watch.kill_tree()  # our bug must not leave the task unowned
        raise
    assert watch.status is not None
    _end_like(_command_status(report_r, watch.status) if isolate else watch.status)


if __name__ == "__main__":
    main(sys.argv)
