"""A task's processes never outlive the daemon that started them (issue "One owner per
task", section 5): kill -9 of a real `populi-node up` ends its task, background
children included, within a second; and a task whose wrapper could not act (stopped)
is killed by the next daemon on the same state directory before that one serves."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.node.harness import Daemon, Mesh, wait_until

#: The shell prints its pid and its background child's (as its PID namespace numbers
#: them, when it has one), then waits on the child.
_SCRIPT = "sleep 300 & echo $$ $!; wait"


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw.rpartition(b")")[2].split()[0] != b"Z"


def _below(root: int) -> list[int]:
    """Every live process below `root` in the process tree, parents first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_bytes().rpartition(b")")[2].split()
        except OSError:
            continue
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = [], [root]
    while frontier:
        below = sorted(children.get(frontier.pop(0), []))
        found.extend(below)
        frontier.extend(below)
    return found


def _task_pids(node: Daemon) -> list[int]:
    """The wrapper (the daemon's one child), then every process of the one task running
    on `node`: its init when it has one, the shell and the background sleep."""
    tid = node.client.post("/v1/tasks", {"command": ["sh", "-c", _SCRIPT], "retries": 0})["id"]

    def printed() -> list[int] | None:
        logs = list((node.state_dir / "tasks" / tid).glob("*/stdout"))
        text = logs[0].read_text() if logs else ""
        return [int(p) for p in text.split()] if text.endswith("\n") else None

    wait_until(printed, 30, "the task to print its pids")
    pids = _below(node.proc.pid)
    assert len(pids) >= 3 and all(_alive(p) for p in pids), pids
    return pids


@pytest.mark.slow
def test_kill_9_of_the_daemon_ends_its_task_within_a_second(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, preset="local")
    try:
        node = mesh.start("solo")
        pids = _task_pids(node)
        node.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: not any(map(_alive, pids)), 1.0, "the task to die with its daemon")
        print(f"task gone {time.monotonic() - killed:.3f} s after kill -9 of its daemon")
    finally:
        mesh.stop_all()


@pytest.mark.slow
def test_the_next_daemon_kills_what_a_stopped_wrapper_left(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, preset="local")
    pids: list[int] = []
    try:
        node = mesh.start("solo")
        pids = _task_pids(node)
        os.kill(pids[0], signal.SIGSTOP)  # the wrapper cannot act on the daemon's death
        node.kill()
        assert all(_alive(p) for p in pids)  # the chain is broken: only the record is left
        again = mesh.start("solo", state=node.state_dir)
        assert not any(map(_alive, pids)), "the restarted daemon serves while they live"
        assert list((again.state_dir / "tasks" / ".running").iterdir()) == []
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        mesh.stop_all()
