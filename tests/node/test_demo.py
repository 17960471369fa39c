"""`make demo` runs `python -m populi_p2p.demo`: it must work and clean up after itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import REPO


@pytest.mark.slow
def test_demo_runs_and_cleans_up(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "populi_p2p.demo"],
        capture_output=True, text=True, env=env, timeout=90, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("NAME ") == 2  # the table, before and after
    assert "agree node3 is dead" in out
    # The dashboard's address is printed; stdin is not a terminal, so nothing waits.
    assert "dashboard: http://127.0.0.1:" in out
    after = out.split("kill -9 node3")[1]
    assert any(line.startswith("node3") and " dead " in line for line in after.splitlines())
    # Nothing left behind in its temporary directory.
    assert not any(p.name.startswith("populi-demo-") for p in tmp_path.iterdir())
