"""``populi-node logs`` from a node that did not run the task: the output is fetched
from the owner over the signed peer API (issue 10, "Results").

Two daemons on loopback; only A carries the label the tasks ask for, so they run on
A and B is the node the operator asks. B prints the full output, follows a running
task as it writes, keeps a bad id to one line, and names A in one line once A is gone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from populi_p2p.api import ApiError
from populi_p2p.cli import main
from tests.node.harness import REPO, Daemon, Mesh, wait_until

#: The tasks read a gate under the test's private tmp dir: as root, keep root.
AS_ROOT = ("--task-user", "root") if os.geteuid() == 0 else ()


def _task(d: Daemon, tid: str) -> dict[str, Any]:
    return d.client.get(f"/v1/tasks/{tid}")  # type: ignore[no-any-return]


def _submit(d: Daemon, script: str) -> str:
    spec = {"command": ["sh", "-c", script], "labels": ["site=a"], "retries": 0}
    return str(d.client.post("/v1/tasks", spec)["id"])


@pytest.mark.slow
def test_logs_and_follow_fetch_over_the_mesh_from_the_owner(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    mesh = Mesh(tmp_path / "mesh", preset="local")
    try:
        a = mesh.start("a", "--label", "site=a", *AS_ROOT)
        b = mesh.start("b", "--bootstrap", a.address, *AS_ROOT)
        both = {a.node_id: "alive", b.node_id: "alive"}
        wait_until(lambda: mesh.converged([a, b], both), 30, "two daemons")
        on_b = ["--state-dir", str(b.state_dir)]

        # More than one chunk (64 KiB) and far more than a result's tail.
        script = "echo first; head -c 200000 /dev/zero | tr '\\0' x; echo; echo last; echo oops >&2"
        tid = _submit(b, script)
        done = wait_until(lambda: (t := _task(b, tid))["finished"] and t, 30, "the task to end")
        assert done["phase"] == "succeeded" and done["owner"] == a.node_id, done
        assert main(["logs", tid[:8], *on_b]) in (None, 0)
        assert capsysbinary.readouterr().out == b"first\n" + b"x" * 200000 + b"\nlast\n"
        assert main(["logs", tid, "--stderr", *on_b]) in (None, 0)
        assert capsysbinary.readouterr().out == b"oops\n"
        # B's checks hold for a remote log too: one line each, never a crash.
        for query, says in (("offset=-1", "offset"), ("stream=passwd", "stream must be")):
            with pytest.raises(ApiError, match=says):
                b.client.get(f"/v1/tasks/{tid}/logs?{query}")
        assert main(["logs", "no/such-task", *on_b]) == 1
        err = capsysbinary.readouterr().err.decode().strip()
        assert len(err.splitlines()) == 1 and "task" in err, err

        # --follow from B sees the first line while the task still waits at its gate.
        gate = tmp_path / "gate"
        tid = _submit(b, f"echo started; while [ ! -e {gate} ]; do sleep 0.05; done; echo ended")
        running = wait_until(
            lambda: (t := _task(b, tid))["phase"] == "running" and t, 30, "the task to run"
        )
        assert running["owner"] == a.node_id, running
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        follow = subprocess.Popen(
            [sys.executable, "-m", "populi_p2p.cli", "logs", tid, "--follow", *on_b],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        try:
            assert follow.stdout is not None
            os.set_blocking(follow.stdout.fileno(), False)
            seen = bytearray()

            def got(line: bytes) -> bool:
                seen.extend(follow.stdout.read() or b"")  # type: ignore[union-attr]
                return line in seen

            wait_until(lambda: got(b"started\n"), 30, "--follow to print the first line")
            assert b"ended" not in seen and follow.poll() is None  # still following
            gate.touch()
            wait_until(lambda: got(b"ended\n"), 30, "--follow to print the last line")
            assert follow.wait(timeout=30) == 0, follow.stderr.read() if follow.stderr else ""
            assert bytes(seen) == b"started\nended\n"
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.wait()

        # The owner gone: one line naming it.
        a.kill()
        assert main(["logs", tid, *on_b]) == 1
        err = capsysbinary.readouterr().err.decode().strip()
        assert len(err.splitlines()) == 1 and a.node_id[:12] in err, err
        assert "output cannot be fetched" in err or "did not answer" in err, err
    finally:
        mesh.stop_all()
