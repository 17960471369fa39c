"""One task against another on the same node (issue 18, row 3): anyone who may submit
a task tries to read another running task's environment and work-dir file through
``/proc``, and to freeze it with SIGSTOP.

Before, every task ran as ``nobody``: the attacker read the victim's
``/proc/PID/environ`` and ``/proc/PID/cwd/secret`` and stopped it. Now each task has a
uid of its own and its own PID namespace (docs/executor.md, "Isolation"), so every try
is refused and the victim runs on. A real `populi-node up` with its default settings,
as root (a non-root daemon cannot switch users: the test skips there).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.node.harness import Daemon, Mesh, wait_until

from .programs import ATTACKER, SECRET, VICTIM, holding, refusals, state

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="a uid per task needs a root daemon"),
]


def _finished(d: Daemon, tid: str) -> dict[str, Any] | None:
    task: dict[str, Any] = d.client.get(f"/v1/tasks/{tid}")
    return task if task["finished"] else None


def test_a_task_cannot_read_or_stop_another(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, preset="local")
    try:
        node = mesh.start("solo")
        victim = node.client.post(
            "/v1/tasks",
            {"command": ["python3", "-c", VICTIM], "env": {"POPULI_SECRET": SECRET},
             "retries": 0},
        )["id"]  # fmt: skip
        tasks = node.state_dir / "tasks" / victim

        def ready() -> bool:
            return any(log.read_text() == "ready\n" for log in tasks.glob("*/stdout"))

        wait_until(ready, 30, "the victim to write its secret")
        (pid,) = wait_until(lambda: holding(SECRET), 10, "the victim's process")
        (secret_file,) = tasks.glob("*/work/secret")
        attacker = node.client.post(
            "/v1/tasks",
            {"command": ["python3", "-c", ATTACKER, str(pid), SECRET, str(secret_file)],
             "retries": 0},
        )["id"]  # fmt: skip
        task = wait_until(lambda: _finished(node, attacker), 30, "the attacker to end")
        # The whole output (the result's tail is short), from the node's disk: we are root.
        (log,) = (node.state_dir / "tasks" / attacker).glob("*/stdout")
        tail = log.read_text()
        print(tail)
        assert task["phase"] == "succeeded", task
        assert refusals(tail).keys() >= {"environ", "cwd-file", "work-file", "stop"}, tail
        assert "LEAK" not in tail
        # The victim runs on, not stopped (a SIGSTOP takes effect before kill() returns).
        assert state(pid) in ("S", "R"), state(pid)
        assert _finished(node, victim) is None
        node.client.post(f"/v1/tasks/{victim}/cancel")
        wait_until(lambda: _finished(node, victim), 30, "the victim's cancel")
    finally:
        mesh.stop_all()
