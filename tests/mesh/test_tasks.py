"""Tasks on a real mesh: five `populi-node up` processes on loopback run submitted
commands through the lease service.

One mesh, steps in order (each waits by polling the API with a deadline):
mixed requirements land on matching nodes and succeed once; an impossible spec stays
pending and says why; drain keeps new work off a node; kill -9 of a running task's
owner re-runs it elsewhere at the next epoch; kill -9 of the accepting node right after
`submit` returns loses nothing; cancel kills the process group and the task never
comes back; drain --handoff moves a running task to another node.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from populi_p2p.api import ApiClient
from tests.node.harness import REPO, Daemon, Mesh, wait_until

#: Labels per node: n3 and n4 are the only "zone=y" nodes.
LABELS = {"n0": "zone=x", "n1": "zone=x", "n2": "zone=x", "n3": "zone=y", "n4": "zone=y"}
#: The tasks here write marks under the test's private tmp dir: as root, keep root
#: (test_memory_limit_stops_the_task_not_the_node proves the default, nobody).
AS_ROOT = ("--task-user", "root") if os.geteuid() == 0 else ()


def _task(d: Daemon, tid: str) -> dict[str, Any]:
    return d.client.get(f"/v1/tasks/{tid}")  # type: ignore[no-any-return]


def _finished(d: Daemon, tid: str) -> dict[str, Any] | None:
    task = _task(d, tid)
    return task if task["finished"] else None


def _submit(d: Daemon, command: list[str], **spec: Any) -> str:
    # Longer than the daemon's 10 s wait for acks, so a shortfall reads as its one line.
    client = ApiClient(d.client.socket_path, timeout=15.0)
    return str(client.post("/v1/tasks", {"command": command, **spec})["id"])


def _group_gone(pgid: int) -> bool:
    """No live (non-zombie) process is left in group `pgid` (zombies whose parent is
    gone wait for init to reap them; they run nothing)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return False
    return True


@pytest.mark.slow
def test_tasks_on_a_five_node_mesh(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, preset="local")
    marks = tmp_path / "marks"
    marks.mkdir()
    try:
        seed = mesh.start("n0", "--label", LABELS["n0"], *AS_ROOT)
        others = [
            mesh.spawn(n, "--bootstrap", seed.address, "--label", LABELS[n], *AS_ROOT)
            for n in ("n1", "n2", "n3", "n4")
        ]
        for d in others:
            mesh.ready(d)
        ds = [seed, *others]
        by_id = {d.node_id: d for d in ds}
        wait_until(lambda: mesh.converged(ds, {d.node_id: "alive" for d in ds}), 30, "5 daemons")

        # 1. Mixed requirements: each task succeeds exactly once, on a matching node;
        #    the process runs once (a start mark per task id).
        specs: list[dict[str, Any]] = [
            {"labels": ["zone=y"]},
            {"labels": ["zone=x"], "cpus": 0.5},
            {"prefer": ["zone=y"], "ram": 64 << 20},  # also its memory limit
            {"kind": "agent"},
            {"labels": ["zone=x"], "env": {"GREETING": "hi"}},
            {"labels": ["zone=y"], "retries": 0},
        ]
        script = f'echo "$POPULI_TASK_ID" >> {marks}/"$POPULI_TASK_ID"; echo "$GREETING"'
        tids = [_submit(ds[i % 5], ["sh", "-c", script], **s) for i, s in enumerate(specs)]
        impossible = _submit(seed, ["true"], labels=["zone=mars"])
        for tid, spec in zip(tids, specs, strict=True):
            task = wait_until(lambda t=tid: _finished(seed, t), 20, f"task {tid} to finish")
            assert task["phase"] == "succeeded", task
            assert [e["phase"] for e in task["epochs"]] == ["succeeded"], task
            owner = by_id[task["owner"]]
            for label in spec.get("labels", []):
                assert LABELS[owner.name] == label, (task, owner.name)
            assert (marks / tid).read_text().split() == [tid], "the process ran once"
        env_task = _task(seed, tids[4])
        assert env_task["result"]["output_tail"] == "hi\n"

        # 1b. A non-zero exit is retried (on another node first) up to --retries; the
        #     CLI's --wait follows it and exits with the task's code.
        proc = subprocess.run(
            [sys.executable, "-m", "populi_p2p.cli", "submit", "--state-dir",
             str(seed.state_dir), "--retries", "1", "--label", "zone=x", "--wait",
             "--", "sh", "-c", "exit 3"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert proc.returncode == 3, proc.stderr
        failed = _task(seed, proc.stdout.strip())
        assert [e["phase"] for e in failed["epochs"]] == ["failed", "failed"], failed
        assert failed["epochs"][0]["owner"] != failed["epochs"][1]["owner"], failed
        assert failed["phase"] == "failed" and failed["finished"]

        # 2. A spec nobody can run is accepted, stays pending, and says why.
        pending = wait_until(lambda: _task(seed, impossible)["why"], 10, "a why")
        assert _task(seed, impossible)["phase"] == "pending"
        assert "labels=5" in pending, pending

        # 3. Drain n4: its record says draining, and no new zone=y task lands there.
        n3, n4 = by_id[ds[3].node_id], by_id[ds[4].node_id]
        n4.client.post("/v1/drain", {"handoff": False})
        wait_until(
            lambda: all(
                m["status"] == "draining" for m in seed.members() if m["node_id"] == n4.node_id
            ),
            10, "n4's record to say draining",
        )  # fmt: skip
        assert n4.status()["tasks"]["draining"] is True
        drained = [_submit(seed, ["true"], labels=["zone=y"]) for _ in range(3)]
        for tid in drained:
            task = wait_until(lambda t=tid: _finished(seed, t), 20, "drained-mesh task")
            assert task["owner"] == n3.node_id, task
        n4.client.post("/v1/undrain")

        # 4. kill -9 of a running task's owner: re-placed at the next epoch, succeeds.
        slow = _submit(seed, ["sh", "-c", "sleep 2"], labels=["zone=y"])
        running = wait_until(
            lambda: (t := _task(seed, slow))["phase"] == "running" and t, 15, "slow to run"
        )
        victim = by_id[running["owner"]]
        victim.kill()
        task = wait_until(lambda: _finished(seed, slow), 30, "the task to run elsewhere")
        assert task["phase"] == "succeeded" and task["epoch"] >= 2, task
        assert task["owner"] != victim.node_id
        survivor_y = n3 if victim is n4 else n4

        # 5. kill -9 of the accepting node right after submit returns: it still runs
        #    (only the surviving zone=y node can run it, so it ran elsewhere).
        accepting = by_id[ds[1].node_id]
        kept = _submit(accepting, ["true"], labels=["zone=y"])
        accepting.kill()
        task = wait_until(lambda: _finished(seed, kept), 30, "the acked task to run")
        assert task["phase"] == "succeeded" and task["owner"] == survivor_y.node_id

        # 6. Cancel a running task: its process group is gone within the grace period
        #    (5 s) and the task never comes back.
        pidfile = marks / "pgid"
        long = _submit(
            seed, ["sh", "-c", f"echo $$ > {pidfile}; sleep 60 & sleep 60; wait"],
            labels=["zone=y"],
        )  # fmt: skip
        wait_until(lambda: _task(seed, long)["phase"] == "running", 15, "long to run")
        pgid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, "pid"))
        cancelled_at = time.monotonic()
        seed.client.post(f"/v1/tasks/{long}/cancel")
        wait_until(lambda: _group_gone(pgid), 2.0 + 3.0, "the process group to go")
        assert time.monotonic() - cancelled_at < 5.0
        # The cancel reaches every table by gossip, and the task never comes back: over
        # a lease ttl and its margin (local preset: 5 s) no new epoch appears.
        wait_until(lambda: _task(survivor_y, long)["phase"] == "cancelled", 5, "the cancel")
        epoch = _task(seed, long)["epoch"]
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            task = _task(survivor_y, long)
            assert task["phase"] == "cancelled" and task["epoch"] == epoch, task
            time.sleep(0.25)

        # 7. drain --handoff: the running task stops here and runs elsewhere at the next
        #    epoch; the released epoch is not a failure (no retry used).
        moved = _submit(seed, ["sleep", "30"], retries=0)
        first = wait_until(
            lambda: (t := _task(seed, moved))["phase"] == "running" and t, 15, "moved to run"
        )
        holder = by_id[first["owner"]]
        holder.client.post("/v1/drain", {"handoff": True})
        again = wait_until(
            lambda: (t := _task(seed, moved))["phase"] == "running"
            and t["epoch"] > first["epoch"] and t,
            15, "the handed-off task to run elsewhere",
        )  # fmt: skip
        assert again["owner"] != holder.node_id
        assert [e["phase"] for e in again["epochs"]][:-1] == ["released"], again
        seed.client.post(f"/v1/tasks/{moved}/cancel")
    finally:
        mesh.stop_all()
