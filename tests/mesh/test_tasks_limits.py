"""A real daemon keeps itself stable first: a task that breaks its memory limit is
stopped and reported ``failed`` with the reason, and the node keeps running; as root,
each task runs as a uid of its own by default (issues 10 and 18)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from populi_p2p.api import ApiError
from populi_p2p.cli import main
from tests.node.harness import Daemon, Mesh, wait_until

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

        # The node still runs work afterwards, and as root that work runs as a uid of
        # its own from the dynamic range (else as the daemon's user).
        who = node.client.post("/v1/tasks", {"command": ["id", "-u"], "retries": 0})["id"]
        after = wait_until(lambda: _finished(node, who), 30, "the next task to end")
        assert after["phase"] == "succeeded", after
        uid = int(after["result"]["output_tail"].strip())
        assert 61184 <= uid <= 65519 if os.geteuid() == 0 else uid == os.geteuid(), after
    finally:
        mesh.stop_all()


@pytest.mark.slow
def test_logs_prints_the_full_output_of_a_task_run_here(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    mesh = Mesh(tmp_path, preset="local")
    try:
        node = mesh.start("solo")
        # Far more than a result's tail: the full output stays on the owner.
        script = "echo first; head -c 200000 /dev/zero | tr '\\0' x; echo; echo last; echo oops >&2"
        tid = node.client.post("/v1/tasks", {"command": ["sh", "-c", script]})["id"]
        task = wait_until(lambda: _finished(node, tid), 30, "the task to end")
        assert task["phase"] == "succeeded" and len(task["result"]["output_tail"]) < 1000
        state = ["--state-dir", str(node.state_dir)]
        assert main(["logs", tid[:8], *state]) in (None, 0)
        out = capsysbinary.readouterr().out
        assert out == b"first\n" + b"x" * 200000 + b"\nlast\n"
        assert main(["logs", tid, "--follow", "--stderr", *state]) in (None, 0)
        assert capsysbinary.readouterr().out == b"oops\n"
        # Hostile arguments are one line each, never a crash.
        assert main(["logs", "nosuchtask", *state]) == 1
        err = capsysbinary.readouterr().err.decode().strip()
        assert "no single task matches" in err and len(err.splitlines()) == 1
        bad = node.client.get  # the API refuses a bad offset or stream with one line
        for query, says in (("offset=-1", "offset"), ("stream=passwd", "stream must be")):
            with pytest.raises(ApiError, match=says):
                bad(f"/v1/tasks/{tid}/logs?{query}")
    finally:
        mesh.stop_all()


@pytest.mark.slow
def test_a_missing_command_fails_once_and_says_command_not_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon's PATH starts with a directory the task's uid cannot search (root's
    ``~/.local/bin``, issue 20): the task still says "command not found", and it fails
    for good at its first epoch, whatever its retries."""
    closed = tmp_path / "root-only" / "bin"
    closed.mkdir(parents=True)
    (tmp_path / "root-only").chmod(0o700)
    mesh = Mesh(tmp_path, preset="local")
    try:
        node = mesh.start("solo", env={"PATH": f"{closed}:{os.environ['PATH']}"})
        state = ["--state-dir", str(node.state_dir)]
        code = main(["submit", "--wait", "--retries", "2", *state, "--", "pyhton3", "-c", "1"])
        tid = capsys.readouterr().out.splitlines()[0]
        assert code == 127
        task = node.client.get(f"/v1/tasks/{tid}")
        assert task["phase"] == "failed" and task["finished"], task
        assert [e["epoch"] for e in task["epochs"]] == [1], "not retried"
        assert task["result"]["final"]
        assert main(["task", tid, *state]) in (None, 0)
        shown = capsys.readouterr().out
        assert "[populi] start_failed: cannot run 'pyhton3': command not found in PATH=" in shown
        assert shown.rstrip().endswith("; not retried") and "Permission denied" not in shown
    finally:
        mesh.stop_all()
