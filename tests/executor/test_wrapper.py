"""The task wrapper, run for real as the executor runs it (``python -I -S _wrapper.py
SPEC STATUS CONTROL``, in a session of its own): it ends the way the command ended,
says in one line why a command cannot run, and kills the task's whole tree when the
command ends, when the fence passes (whether or not the daemon's loop runs), and when
the daemon dies. Its parsing and PATH search are also checked in-process.

Every wait is on the wrapper's exit or on a pipe, bounded by a deadline."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from populi_p2p.executor import _wrapper
from populi_p2p.executor._launch import DEFAULT_PATH, WRAPPER

from .helpers import alive

WAIT = 30.0  # far beyond what any wrapper here needs


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@attrs.define
class Wrapped:
    process: subprocess.Popen[bytes]
    status: int  # our end of the wrapper's status pipe
    control: int  # our end of its control pipe (closing it is the daemon's death)

    def status_lines(self) -> list[str]:
        """Every line the wrapper wrote, once it closed the pipe (it exited)."""
        data = b""
        deadline = time.monotonic() + WAIT
        while True:
            assert select.select([self.status], [], [], deadline - time.monotonic())[0]
            chunk = os.read(self.status, 4096)
            if not chunk:
                return data.decode().splitlines()
            data += chunk

    def line(self) -> str:
        """The next status line, as it comes (the wrapper still runs)."""
        data = b""
        deadline = time.monotonic() + WAIT
        while not data.endswith(b"\n"):
            assert select.select([self.status], [], [], deadline - time.monotonic())[0]
            data += os.read(self.status, 1)
        return data.decode().strip()

    def output_line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().decode().strip()

    def wait(self) -> int:
        return self.process.wait(timeout=WAIT)

    def daemon_dies(self) -> None:
        """Close the control pipe's only writer, as the daemon's death does."""
        if self.control >= 0:
            os.close(self.control)
            self.control = -1


@pytest.fixture
def wrap(tmp_path: Path) -> Iterator[Any]:
    started: list[Wrapped] = []

    def start(*argv: str, **spec: Any) -> Wrapped:
        instructions = {"argv": list(argv), "env": {"PATH": DEFAULT_PATH}, **spec}
        spec_r, spec_w = os.pipe()
        status_r, status_w = os.pipe()
        control_r, control_w = os.pipe()
        os.write(spec_w, json.dumps(instructions).encode())
        os.close(spec_w)
        fds = (spec_r, status_w, control_r)
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", WRAPPER, *map(str, fds)], pass_fds=fds,
            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, env={}, cwd=tmp_path,
        )  # fmt: skip
        for fd in fds:
            os.close(fd)
        started.append(Wrapped(process, status_r, control_w))
        return started[-1]

    yield start
    for wrapped in started:  # the daemon's death first: the wrapper kills the tree
        wrapped.daemon_dies()
        try:
            wrapped.process.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            os.killpg(wrapped.process.pid, signal.SIGKILL)
            wrapped.process.wait()
        os.close(wrapped.status)


########################################################################################
# The command's end is the wrapper's


@pytest.mark.parametrize(("script", "code"), [("exit 0", 0), ("exit 3", 3),
                                              ("kill -USR1 $$", -signal.SIGUSR1),
                                              ("kill -TERM $$", -signal.SIGTERM)])  # fmt: skip
def test_the_wrapper_ends_the_way_the_command_did(wrap: Any, script: str, code: int) -> None:
    """SIGTERM too: the wrapper ignores it for itself, the command gets the default."""
    wrapped = wrap("sh", "-c", script)
    assert wrapped.wait() == code
    assert wrapped.status_lines() == ["ok"]


def test_the_tree_is_killed_when_the_command_exits(wrap: Any) -> None:
    """A child in the group and a grandchild that left it with setsid: both killed when
    the command exits (the wrapper is their subreaper)."""
    wrapped = wrap("sh", "-c", "sleep 300 & echo $!; setsid sleep 301 & echo $!; exit 4")
    child = int(wrapped.output_line())
    escaped = int(wrapped.output_line())
    assert wrapped.wait() == 4
    assert wrapped.status_lines() == ["ok"]
    assert not alive(child) and not alive(escaped)


########################################################################################
# A command that cannot run says why, in one line


def _file(tmp_path: Path, name: str, text: str, mode: int) -> str:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    return str(path)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda t: "no-such-command-here",
         "command not found in PATH=" + DEFAULT_PATH),
        (lambda t: _file(t, "plain", "echo hi\n", 0o644),
         "not executable by uid"),
        (lambda t: _file(t, "noshebang", "\x7fELFjunk", 0o755),
         "not executable (Exec format error): a script needs a #! line"),
        (lambda t: _file(t, "interp", "#!/no/such/interpreter -x\n", 0o755),
         "not executable: its interpreter '/no/such/interpreter' was not found"),
        (lambda t: str(t),
         "not executable by uid"),  # a directory: EACCES from execve
    ],
    ids=["missing", "no-x-bit", "no-shebang", "missing-interpreter", "directory"],
)  # fmt: skip
def test_a_command_that_cannot_run_is_unrunnable_with_the_reason(
    wrap: Any, tmp_path: Path, make: Any, says: str
) -> None:
    command = make(tmp_path)
    wrapped = wrap(command)
    assert wrapped.wait() == _wrapper.START_FAILED_EXIT
    (line,) = wrapped.status_lines()
    assert line.startswith(f"unrunnable cannot run {command!r}"), line
    assert says in line, line
    assert wrapped.process.stderr is not None
    assert wrapped.process.stderr.read().decode().startswith(f"populi: cannot run {command!r}")


def test_other_start_failures_are_plain_fails(wrap: Any) -> None:
    wrapped = wrap("true", cgroup="/nonexistent/cgroup")
    assert wrapped.wait() == _wrapper.START_FAILED_EXIT
    (line,) = wrapped.status_lines()
    assert line.startswith("fail cannot join the task cgroup /nonexistent/cgroup"), line


def test_rlimits_reach_the_command(wrap: Any) -> None:
    wrapped = wrap("sh", "-c", "ulimit -v; ulimit -t; ulimit -c; umask",
                   rlimit_as=512 << 20, rlimit_cpu=7)  # fmt: skip
    assert wrapped.wait() == 0
    assert [wrapped.output_line() for _ in range(4)] == [str(512 << 10), "7", "0", "0077"]


########################################################################################
# The fence and the daemon's death


_TERM_NOTING = "trap 'echo term' TERM; echo up; while :; do sleep 0.05; done"


def test_the_fence_terms_then_kills_without_the_daemon(wrap: Any) -> None:
    deadline = _boottime() + 1.0
    wrapped = wrap("sh", "-c", _TERM_NOTING, deadline=deadline, fence_grace=0.5)
    assert wrapped.output_line() == "up"
    assert wrapped.line() == "ok"
    assert wrapped.line() == "fenced"
    assert wrapped.output_line() == "term"
    assert wrapped.wait() == -signal.SIGKILL
    assert _boottime() >= deadline


def test_a_fence_line_moves_the_deadline_and_zero_grace_sends_no_term(wrap: Any) -> None:
    wrapped = wrap("sh", "-c", _TERM_NOTING)  # unfenced at first
    assert wrapped.output_line() == "up"
    line = f"fence {_boottime() + 0.3} 0\n".encode()
    os.write(wrapped.control, line[:7])  # a line split across writes is put together
    os.write(wrapped.control, line[7:])
    assert wrapped.wait() == -signal.SIGKILL
    assert wrapped.status_lines() == ["ok", "fenced"]
    assert wrapped.process.stdout is not None
    assert b"term" not in wrapped.process.stdout.read()


def test_the_daemons_death_kills_the_tree(wrap: Any) -> None:
    wrapped = wrap("sh", "-c", "setsid sleep 300 & echo $!; " + _TERM_NOTING)
    escaped = int(wrapped.output_line())
    assert wrapped.output_line() == "up"
    wrapped.daemon_dies()
    assert wrapped.wait() == _wrapper.START_FAILED_EXIT
    assert not alive(escaped)


########################################################################################
# In-process: the control lines and the PATH search


def _watch(**spec: Any) -> Any:
    return _wrapper._Watch(0, spec, -1)


def test_control_lines_move_the_fence_until_it_began() -> None:
    watch = _watch()
    assert (watch.deadline, watch.grace) == (None, 1.0)
    watch.control(b"fence 10.5 2\nfence 11")
    assert (watch.deadline, watch.grace, watch.pending) == (10.5, 2.0, b"fence 11")
    watch.control(b" -3\n")
    assert (watch.deadline, watch.grace) == (11.0, 0.0)  # a negative grace is none
    for junk in (b"fence nan 1\n", b"fence 12 inf\n", b"fence x 1\n", b"fence 12\n",
                 b"fenced 12 1\n", b"\n"):  # fmt: skip
        watch.control(junk)
        assert (watch.deadline, watch.grace) == (11.0, 0.0), junk
    watch.fenced = True  # the SIGTERM went out: past the point of no return
    watch.control(b"fence 99 1\n")
    assert watch.deadline == 11.0


def test_the_spec_sets_the_first_fence() -> None:
    watch = _watch(deadline=5.0, fence_grace=0.25)
    assert (watch.deadline, watch.grace) == (5.0, 0.25)
    far = _watch(deadline=_boottime() + 3600, fence_grace=1)
    assert far.fence_step() == _wrapper.FENCE_CHECK_MAX and not far.fenced
    assert _watch().fence_step() is None


def test_find_looks_along_path_as_execvp_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "tool").mkdir()  # a directory of that name is no candidate
    (tmp_path / "b" / "tool").write_text("")
    (tmp_path / "tool").write_text("")
    monkeypatch.chdir(tmp_path)
    path = f"{tmp_path}/a:{tmp_path}/missing::{tmp_path}/b"
    assert _wrapper._find("tool", path) == ([os.path.join(".", "tool"), f"{tmp_path}/b/tool"], [])
    assert _wrapper._find("./x/tool", path) == (["./x/tool"], [])
    assert _wrapper._find("", path) == ([], [])


def test_interpreter_reads_the_shebang(tmp_path: Path) -> None:
    assert _wrapper._interpreter(_file(tmp_path, "s", "#! /bin/sh -e\necho", 0o755)) == "/bin/sh"
    assert _wrapper._interpreter(_file(tmp_path, "n", "echo", 0o755)) == ""
    assert _wrapper._interpreter(_file(tmp_path, "e", "#!\n", 0o755)) == ""
    assert _wrapper._interpreter(str(tmp_path / "missing")) == ""
