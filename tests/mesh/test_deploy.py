"""Real daemons: a model deployed with 2 replicas on 4 daemons (stand-in engine) is
served from two distinct nodes; a replica's owner killed with kill -9 is replaced on
another node and serving goes on; the history checker (tests/history/checker.py) finds
no replica run twice at once. And a request for a model that is deployed but still
loading waits for it, within ``--load-wait``, instead of failing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.history.checker import Killed, check_overlaps, load_events, runs_from
from tests.history.scenario import TASK_FLAGS
from tests.node.harness import REPO, Daemon, Mesh, wait_until

pytestmark = pytest.mark.slow


def _model(tmp: Path) -> Path:
    path = tmp / "tiny.gguf"
    path.write_bytes(hashlib.sha256(b"tiny").digest() * 40000)  # 1.25 MiB
    return path


def _cli(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "populi_p2p.cli", *args, "--state-dir", str(d.state_dir)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip


def _replicas(d: Daemon, name: str = "tiny") -> list[dict[str, Any]]:
    data = d.client.get("/v1/deployments")
    found = [x["replicas"] for x in data["deployments"] if x["name"] == name]
    return found[0] if found else []


def _serving(d: Daemon, n: int) -> list[dict[str, Any]] | None:
    rows = _replicas(d)
    ok = len(rows) == n and all(r["state"] == "serving" for r in rows)
    return rows if ok else None


def _port(d: Daemon) -> int:
    return int(d.client.get("/v1/inference/requests")["listening"])


def _stream(port: int, tokens: int = 8, timeout: float = 30.0) -> str:
    body = {"model": "tiny", "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    text = []
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                      timeout=timeout) as r:  # fmt: skip
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0].get("delta", {})
                text.append(delta.get("content") or "")
    return "".join(text)


def _mesh(tmp: Path, names: list[str], *flags: str, env: dict[str, str]) -> list[Daemon]:
    mesh = _MESHES[-1]
    common = ("--peer-port", "0", "--deploy-engine", "standin", *TASK_FLAGS, *flags)
    first = mesh.start(names[0], *common, "--api-listen", "0", env=env)
    rest = [mesh.start(n, *common, "--bootstrap", first.address, env=env) for n in names[1:]]
    daemons = [first, *rest]
    ids = {d.node_id for d in daemons}
    wait_until(lambda: all({m["node_id"] for m in d.members()} >= ids for d in daemons),
               30, "the mesh to form")  # fmt: skip
    return daemons


_MESHES: list[Mesh] = []


@pytest.fixture
def mesh(tmp_path: Path) -> Any:
    _MESHES.append(Mesh(tmp_path))
    try:
        yield _MESHES[-1]
    finally:
        _MESHES.pop().stop_all()


def test_two_replicas_kill_one_owner_replaced_and_serving(mesh: Mesh, tmp_path: Path) -> None:
    logdir = tmp_path / "history"
    logdir.mkdir()
    os.chmod(logdir, 0o777)
    env = {"POPULI_STANDIN_HISTORY": str(logdir)}
    a, *others = _mesh(tmp_path, ["a", "b", "c", "d"], env=env)
    out = _cli(a, "model", "add", str(_model(tmp_path)), "--name", "tiny")
    assert out.returncode == 0, out.stderr
    out = _cli(a, "deploy", "tiny", "--replicas", "2", "--wait", "60")
    assert out.returncode == 0, out.stdout + out.stderr + a.log()[-3000:]
    rows = _serving(a, 2)
    assert rows is not None
    owners = {r["node_id"] for r in rows}
    assert len(owners) == 2, rows  # anti-affinity: two nodes
    port = _port(a)
    assert _stream(port) == "".join(f"w{i} " for i in range(8))
    # Kill -9 the owner of a replica (not the node that deployed: it cancels at the end).
    victim = next(d for d in others if d.node_id in owners)
    killed_at = time.time()
    victim.kill()
    killed = Killed(victim.name, victim.proc.pid, killed_at, {}, time.time())
    while_down = _stream(port)  # the other replica serves meanwhile
    assert while_down == "".join(f"w{i} " for i in range(8))

    def replaced() -> list[dict[str, Any]] | None:
        rows = _serving(a, 2)
        if rows is None or victim.node_id in {r["node_id"] for r in rows}:
            return None
        return rows

    rows = wait_until(replaced, 60, "the replica to be placed again and serve")
    assert len({r["node_id"] for r in rows}) == 2, rows
    assert any(r["epoch"] >= 2 for r in rows), rows
    print(f"replacement serving {time.time() - killed_at:.1f} s after the kill")
    assert _stream(port) == "".join(f"w{i} " for i in range(8))
    out = _cli(a, "deployments")
    assert out.returncode == 0 and out.stdout.count("serving") == 2, out.stdout
    out = _cli(a, "undeploy", "tiny")
    assert out.returncode == 0, out.stderr
    wait_until(lambda: all(r["state"] == "stopped" for r in _replicas(a)), 30, "stopped")
    # The history is read once no engine it names is alive.
    wait_until(lambda: not _alive(load_events(logdir)), 30, "every engine to exit")
    runs = runs_from(load_events(logdir), killed=[killed])
    assert len(runs) >= 3, runs  # two first runs and the replacement
    assert check_overlaps(runs) == []


def _alive(events: list[Any]) -> list[int]:
    alive = []
    for pid in {e.pid for e in events}:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    return alive


def test_a_request_waits_for_a_loading_replica(mesh: Mesh, tmp_path: Path) -> None:
    env = {"POPULI_STANDIN_LOAD_DELAY": "3"}
    a, _b = _mesh(tmp_path, ["a", "b"], "--load-wait", "30", env=env)
    assert _cli(a, "model", "add", str(_model(tmp_path)), "--name", "tiny").returncode == 0
    out = _cli(a, "deploy", "tiny", "--replicas", "1")
    assert out.returncode == 0, out.stderr
    began = time.monotonic()
    assert _stream(_port(a), timeout=60) == "".join(f"w{i} " for i in range(8))
    assert time.monotonic() - began >= 2.0  # it waited for the load, and did not fail
