"""A real daemon keeps itself stable first: a task that breaks its memory limit is
stopped and reported ``failed`` with the reason, and the node keeps running; as root,
tasks run as ``nobody`` by default (issue 10, "Limits")."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any

import pytest

from .harness import Daemon, Mesh, wait_until

MIB = 1 << 20


def _finished(d: Daemon, tid: str) -> dict[str, Any] | None:
    task: dict[str, Any] = d.client.get(f"/v1/tasks/{tid}")
    return task if task["finished"] else None


@pytest.mark.slow
def test_memory_limit_stops_the_task_not_the_node(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, preset="local")
    try:
        node = mesh.start("solo")
        hog = node.client.post(
            "/v1/tasks",
            {"command": ["python3", "-c", "x = bytearray(2**31); print('survived')"],
             "ram": 256 * MIB, "retries": 0},
        )["id"]  # fmt: skip
        task = wait_until(lambda: _finished(node, hog), 30, "the memory hog to end")
        assert task["phase"] == "failed", task
        tail = task["result"]["output_tail"]
        assert "[populi] memory: used more than its memory limit" in tail, tail
        assert "survived" not in tail
        assert node.running and node.status()["tasks"]["running"] == 0

        # The node still runs work afterwards, and as root that work runs as nobody.
        who = node.client.post("/v1/tasks", {"command": ["id", "-un"], "retries": 0})["id"]
        after = wait_until(lambda: _finished(node, who), 30, "the next task to end")
        assert after["phase"] == "succeeded", after
        expected = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        assert after["result"]["output_tail"].strip() == expected, after
    finally:
        mesh.stop_all()
