"""Real daemons, real engine: the tiny model (`tiny_gguf`, seed 23) deployed with 2
replicas on 4 daemons, each replica a llama.cpp ``llama-server`` its owner started
(``--deploy-engine llama-server``); kill -9 of a replica's owner; the replica is placed
again on another node, and the replacement answers with the same text at temperature 0.

The engines run as the node's task user: as root, a uid of their own (no
``--task-user``), so the model's hard link, the binary (given to the engine in its work
directory when the task user cannot reach the node's copy) and llama.cpp's start-up
backend search (patched by `scripts/build-llama-server.sh`) are all exercised as a
deployment on a shared machine runs them.

Skips, with the reason, only where ``llama-server`` is not built (``make engine``);
CI builds it (`make test`), so it runs there.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from populi_p2p.inference.llama_server import LlamaServerError, find_llama_server
from tests.node.harness import REPO, Daemon, Mesh, wait_until

from .real_failover import MODEL_SEED

pytestmark = pytest.mark.slow

TOKENS = 24


@pytest.fixture(autouse=True)
def require_llama_server() -> None:
    try:
        find_llama_server()
    except LlamaServerError as exc:
        pytest.skip(f"deploying on llama-server needs it built: {exc}")
    pytest.importorskip("gguf")


def _cli(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "populi_p2p.cli", *args, "--state-dir", str(d.state_dir)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip


def _serving(d: Daemon) -> list[dict[str, Any]] | None:
    data = d.client.get("/v1/deployments")["deployments"]
    rows: list[dict[str, Any]] = next((x["replicas"] for x in data if x["name"] == "tiny"), [])
    return rows if len(rows) == 2 and all(r["state"] == "serving" for r in rows) else None


def _answer(api: str, direct: bool = False) -> tuple[str, str]:
    """A streamed answer at temperature 0, through the accepting node (text, serving
    node) or `direct` from an engine (text, '')."""
    body = {"model": "tiny", "stream": True, "max_tokens": TOKENS, "temperature": 0,
            "messages": [{"role": "user", "content": "say something"}]}  # fmt: skip
    text = []
    with httpx.stream("POST", api + "/v1/chat/completions", json=body, timeout=60,
                      trust_env=False) as r:  # fmt: skip
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0].get("delta", {})
                text.append(delta.get("content") or "")
        return "".join(text), "" if direct else r.headers["x-populi-node"]


def _catalogue(api: str) -> list[tuple[str, str, int]]:
    data = httpx.get(api + "/v1/models", trust_env=False, timeout=5).json()["data"]
    nodes = next((m["nodes"] for m in data if m["id"] == "tiny"), [])
    return sorted((n["node"], n["kind"], n["context_length"]) for n in nodes)


def test_two_replicas_on_llama_server_one_owner_killed_replaced(tmp_path: Path) -> None:
    from populi_p2p.testing.tiny_gguf import N_CTX, write_tiny_llama

    model = write_tiny_llama(tmp_path / "tiny.gguf", seed=MODEL_SEED)
    mesh = Mesh(tmp_path)
    try:
        common = ("--peer-port", "0", "--deploy-engine", "llama-server")
        a = mesh.start("a", *common, "--api-listen", "127.0.0.1:0")
        others = [mesh.start(n, *common, "--bootstrap", a.address) for n in "bcd"]
        ids = {d.node_id for d in (a, *others)}
        wait_until(lambda: all({m["node_id"] for m in d.members()} >= ids for d in (a, *others)),
                   30, "the mesh to form")  # fmt: skip
        out = _cli(a, "model", "add", str(model), "--name", "tiny")
        assert out.returncode == 0, out.stderr
        out = _cli(a, "deploy", "tiny", "--replicas", "2", "--wait", "90")
        assert out.returncode == 0, out.stdout + out.stderr + _cli(a, "deployments").stdout
        rows = _serving(a)
        assert rows is not None
        owners = {r["node_id"] for r in rows}
        assert len(owners) == 2, rows
        api = f"http://127.0.0.1:{a.client.get('/v1/inference/requests')['listening']}"
        # The record says what serves it: llama.cpp, its context the model's own (the
        # engine's -c, 4096 by default, is more than the tiny model was trained for).
        listed = wait_until(lambda: len(c := _catalogue(api)) == 2 and c, 30, "both listed")
        assert listed == sorted((o, "llama.cpp", N_CTX) for o in owners), listed
        reference, first = _answer(api)
        assert first in owners
        assert len(reference) == TOKENS and re.fullmatch(r"[a-z ]+", reference), reference

        victim = next(d for d in others if d.node_id in owners)  # a cancels at the end
        killed = time.monotonic()
        victim.kill()

        def replaced() -> list[dict[str, Any]] | None:
            rows = _serving(a)
            return rows if rows and victim.node_id not in {r["node_id"] for r in rows} else None

        rows = wait_until(replaced, 90, "the replica to be placed again and serve")
        took = time.monotonic() - killed
        now = {r["node_id"] for r in rows}
        assert len(now) == 2 and any(r["epoch"] >= 2 for r in rows), rows
        (new,) = now - owners
        print(f"replacement on llama-server serving {took:.1f} s after the kill")
        wait_until(lambda: [n for n, _, _ in _catalogue(api)] == sorted(now), 30,
                   "the catalogue to list the replacement, not the dead node")  # fmt: skip
        # Through a, the text goes on the same (temperature 0, the same model) ...
        text, node = _answer(api)
        assert text == reference and node in now, (text, reference, node)
        # ... and the replacement's own engine (the URL its node lists) gives it too.
        owner = next(d for d in (a, *others) if d.node_id == new)
        engines = owner.client.get("/v1/inference/requests")["engines"]
        assert [(e["healthy"], e["kind"], e["models"]) for e in engines] == [
            (True, "llama.cpp", ["tiny"])
        ], engines
        text, _ = _answer(engines[0]["url"], direct=True)
        assert text == reference, (text, reference)
        out = _cli(a, "undeploy", "tiny")
        assert out.returncode == 0, out.stderr
    finally:
        mesh.stop_all()
