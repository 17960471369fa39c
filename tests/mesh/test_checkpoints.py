"""Checkpoints on real daemons (docs/artifacts.md, "Checkpoints").

The second test drains the owner of a checkpointed task with ``populi-node drain
--handoff``: the process is stopped, its checkpoint dir snapshotted (the task never
asks for one), and the other node resumes it from that snapshot.

Three `populi-node up` daemons (the ownership lab, `tests/history/scenario.py`) run a
"training" task (`tests/history/trainer.py`): it counts to 100, a step every 0.05 s,
writing its step into ``$POPULI_CHECKPOINT_DIR`` and asking for a snapshot at each
step. Once it has logged step 50, its owner is killed with kill -9. The next owner
restores the latest snapshot held by the two others: the task resumes from step 45 or
later, sees ``$POPULI_RESUMED_FROM`` (the first epoch), and counts on to 100. The
assertions read the lines the task appended to a file in the lab's directory (outside
every state dir), and the history of runs goes through the ownership checker. Every
wait polls with a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.history import trainer
from tests.history.scenario import Lab, poll, task_python
from tests.node.harness import REPO, Daemon, Mesh, wait_until

pytestmark = pytest.mark.slow

STEPS = 100
KILL_AT = 50


@pytest.fixture
def lab() -> Iterator[Lab]:
    lab = Lab(3)
    try:
        yield lab
    finally:
        lab.stop()


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _last_step(path: Path) -> int:
    return max((r["step"] for r in _lines(path) if r["event"] == "step"), default=0)


def _ckpt_pins(lab: Lab) -> list[str]:
    """The snapshot pins the live daemons hold."""
    return [
        pin
        for d in lab.live.values()
        for blob in d.client.get("/v1/blobs")["local"]
        for pin in blob["pins"]
        if pin.startswith("ckpt:")
    ]


def test_a_killed_owners_training_resumes_from_its_checkpoint(lab: Lab) -> None:
    lab.start(timeout=60)
    script = lab.root / "trainer.py"
    shutil.copy(trainer.__file__, script)
    script.chmod(0o644)
    command = [task_python(), str(script), str(lab.logdir), str(STEPS), "0.05"]
    tid = lab.submit(0, 0.0, command=command, checkpoint_every=0.0)
    assert tid is not None, "the submit was not acknowledged"
    steps = lab.logdir / f"{tid}.steps"
    assert poll(lambda: _last_step(steps) >= KILL_AT, 90, 0.02), _lines(steps)[-3:]
    assert _ckpt_pins(lab), "no snapshot was pinned while the task ran"
    assert lab.kill_owner([tid]) == tid
    killed_step = _last_step(steps)
    settled = lab.settle([tid], timeout=120)
    report = lab.report()
    assert report.ok, "\n".join(report.lines())
    assert settled, "the task never finished and agreed everywhere"
    assert report.runs == 2, report.summary()
    resumes = [r for r in _lines(steps) if r["event"] == "resume"]
    assert len(resumes) == 2, resumes
    first, second = resumes
    assert first["from_step"] == 0 and first["resumed_from"] is None, first
    assert second["from_step"] >= KILL_AT - 5, (second, killed_step)
    assert second["resumed_from"] == str(first["epoch"]), second
    after = [
        r["step"] for r in _lines(steps) if r["event"] == "step" and r["epoch"] == second["epoch"]
    ]
    assert after == list(range(second["from_step"] + 1, STEPS + 1))
    d = next(iter(lab.live.values()))
    task = d.client.get(f"/v1/tasks/{tid}")
    assert task["phase"] == "succeeded", task
    ck = task["checkpoint"]
    assert ck["epoch"] == second["epoch"] and ck["taken_in"] == second["epoch"], ck
    assert len(ck["holders"]) == 2 and ck["size"] > 0, ck  # the owner and the other one
    # Finished: the snapshots are released by each node's next sweep (every 5 s).
    assert poll(lambda: not _ckpt_pins(lab), 30, 0.5), _ckpt_pins(lab)


#: Counts to its target in 0.05 s steps, keeping its step in the checkpoint dir (written
#: whole, then renamed) and never asking for a snapshot: the only one is the drain's.
COUNTER = """d="$POPULI_CHECKPOINT_DIR"; n=$(cat "$d/step" 2>/dev/null || echo 0)
echo "start ${POPULI_RESUMED_FROM:-none} $n" >> "$LOG"
while [ "$n" -lt "$TARGET" ]; do
  n=$((n + 1)); echo "$n" > "$d/step.tmp"; mv "$d/step.tmp" "$d/step"; echo "$n" > "$LOG.step"
  sleep 0.05
done
echo "done $n" >> "$LOG"
"""


def _cli(d: Daemon, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "populi_p2p.cli", command, "--state-dir", str(d.state_dir), *args],
        capture_output=True, text=True, cwd=REPO, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def test_a_handoff_drain_snapshots_the_checkpoint_dir_for_the_next_owner(tmp_path: Path) -> None:
    as_root = ("--task-user", "root") if os.geteuid() == 0 else ()
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o777)
    logs.chmod(0o777)
    log = logs / "counter.log"
    mesh = Mesh(tmp_path / "mesh")
    try:
        a = mesh.start("a", "--peer-port", "0", *as_root)
        b = mesh.start("b", "--peer-port", "0", "--bootstrap", a.address, *as_root)
        wait_until(lambda: len(a.members()) >= 2, 30, "two members")
        submit = _cli(a, "submit", "--checkpoint", "--env", f"LOG={log}", "--env", "TARGET=120",
                      "--", "sh", "-c", COUNTER)  # fmt: skip
        assert submit.returncode == 0, submit.stderr
        tid = submit.stdout.strip()
        step = logs / "counter.log.step"

        def at_step() -> int:
            text = step.read_text().strip() if step.exists() else ""
            return int(text) if text.isdigit() else 0

        wait_until(lambda: at_step() >= 20, 60, "the counter at step 20")
        first = a.client.get(f"/v1/tasks/{tid}")
        owner = next(d for d in (a, b) if d.node_id == first["owner"])
        other = b if owner is a else a
        drained = _cli(owner, "drain", "--handoff")
        assert drained.returncode == 0, drained.stderr
        task = wait_until(lambda: (t := other.client.get(f"/v1/tasks/{tid}"))["finished"] and t,
                          120, "the task finished on the other node")  # fmt: skip
        assert task["phase"] == "succeeded", task
        assert task["owner"] == other.node_id
        starts = [line.split() for line in log.read_text().splitlines() if line.startswith("start")]
        assert len(starts) == 2, starts
        assert starts[0] == ["start", "none", "0"], starts
        # The second run starts where the first stopped: the drain's snapshot, taken
        # after the process ended, holds its last step.
        _, resumed_from, from_step = starts[1]
        assert resumed_from == str(first["epoch"]) and int(from_step) >= 20, starts
        taken = owner.status()["artifacts"]["checkpoints_taken"]
        assert taken == 1, taken  # the task never asked: this one is the drain's
        assert log.read_text().splitlines()[-1] == "done 120"
    finally:
        mesh.stop_all()
