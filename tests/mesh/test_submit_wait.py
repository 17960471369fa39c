"""``populi-node submit --wait``: the task's stdout and stderr stream to the caller's
while it runs (fetched from the owner over the mesh, as ``logs --follow`` does), the
command exits with the task's code, and Ctrl-C says that the task keeps running and how
to cancel it.

Two daemons on loopback; only A carries the label the tasks ask for, and B is where
they are submitted, so the output travels from A.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.node.harness import REPO, Daemon, Mesh, wait_until

#: The tasks read a gate under the test's tmp dir: as root, keep root.
AS_ROOT = ("--task-user", "root") if os.geteuid() == 0 else ()
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _submit(d: Daemon, *command: str) -> list[str]:
    return [
        sys.executable, "-m", "populi_p2p.cli", "submit", "--state-dir", str(d.state_dir),
        "--label", "site=a", "--retries", "0", "--wait", "--", *command,
    ]  # fmt: skip


@pytest.mark.slow
def test_wait_streams_output_exits_with_the_code_and_ctrl_c_says_how_to_cancel(
    tmp_path: Path,
) -> None:
    mesh = Mesh(tmp_path / "mesh", preset="local")
    try:
        a = mesh.start("a", "--label", "site=a", *AS_ROOT)
        b = mesh.start("b", "--bootstrap", a.address, *AS_ROOT)
        both = {a.node_id: "alive", b.node_id: "alive"}
        wait_until(lambda: mesh.converged([a, b], both), 30, "two daemons")

        # Output and exit code: stdout to stdout, stderr to stderr, then the code.
        script = "echo out-1; echo err-1 >&2; echo out-2; exit 4"
        done = subprocess.run(
            _submit(b, "sh", "-c", script), capture_output=True, text=True, timeout=60, env=ENV
        )
        assert done.returncode == 4, done.stderr
        tid, *lines = done.stdout.splitlines()
        assert lines == ["out-1", "out-2"], done.stdout
        assert "err-1" in done.stderr.splitlines(), done.stderr
        assert "owner a" in done.stderr, done.stderr  # the owner by name

        # Output arrives while the task runs; Ctrl-C leaves it running and says so.
        gate = tmp_path / "gate"
        script = f"echo started; while [ ! -e {gate} ]; do sleep 0.05; done"
        # As at a terminal: Ctrl-C's default action, even where this test process
        # runs with SIGINT ignored (an ignored signal is inherited across exec, and
        # Python then installs no KeyboardInterrupt handler).
        proc = subprocess.Popen(
            _submit(b, "sh", "-c", script),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        seen: list[str] = []
        assert proc.stdout is not None
        reader = threading.Thread(target=lambda: seen.extend(proc.stdout or ()), daemon=True)
        reader.start()
        wait_until(lambda: "started\n" in seen, 30, "the running task's first line")
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(
                f"submit --wait ignored Ctrl-C (this process's SIGINT handler:"
                f" {signal.getsignal(signal.SIGINT)!r})"
            ) from None
        reader.join(timeout=10)
        tid = seen[0].strip()
        assert proc.returncode == 130, err
        assert f"still running: populi-node cancel {tid} --state-dir {b.state_dir}" in err, err
        assert b.client.get(f"/v1/tasks/{tid}")["phase"] == "running"
        b.client.post(f"/v1/tasks/{tid}/cancel")
    finally:
        mesh.stop_all()
