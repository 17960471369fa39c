"""Through a real inference engine: llama.cpp's ``llama-server`` (built by ``make
engine``), on a tiny model the test writes (`populi_p2p.testing.tiny_gguf`).

- The engine continues a final assistant message: at temperature 0, the answer to
  "the prompt plus the first k tokens of the answer" is the rest of the answer.
- A daemon started with ``--gguf`` runs ``llama-server`` itself; another daemon routes
  a streamed chat completion to it; kill -9 of the daemon takes its engine with it.
- A stream whose serving daemon is killed mid-way equals the uninterrupted text
  (`real_failover.FailoverLab`; `benchmarks/real_failover_bench.py` runs it 40 times).

`make test` builds the engine first (docs/testing.md), so these tests do not skip in
CI: without ``llama-server`` they FAIL and say how to build it. A developer who has not
built it can opt out with ``POPULI_SKIP_REAL_ENGINE=1``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from populi_p2p.inference.llama_server import LlamaServerError, find_llama_server
from populi_p2p.testing.tiny_gguf import MODEL_ALIAS, N_CTX, write_tiny_llama
from tests.node.harness import Mesh, wait_until

from .real_failover import (
    KILL_AT,
    MAX_TOKENS,
    MODEL_SEED,
    FailoverLab,
    LlamaProcess,
    chat_body,
    restart_would_match,
    stream_text,
)

pytestmark = pytest.mark.slow

#: Set to 1 to skip (not fail) when llama-server is not built. Never in CI.
OPT_OUT = "POPULI_SKIP_REAL_ENGINE"
PROMPT = "say something"


@pytest.fixture(autouse=True)
def require_llama_server() -> None:
    """Fail (or, with the opt-out, skip) when ``llama-server`` is missing."""
    try:
        find_llama_server()
        return
    except LlamaServerError as exc:
        why = str(exc)
    if os.environ.get(OPT_OUT) == "1":
        pytest.skip(f"{why}; skipped because {OPT_OUT}=1")
    pytest.fail(f"{why}. To skip it locally instead, set {OPT_OUT}=1.", pytrace=False)


def test_llama_server_continues_a_partial_answer(tmp_path: Path) -> None:
    """At temperature 0, the prompt plus the answer's first k tokens as a final
    assistant message gets the rest of the answer, token for token (each token of the
    tiny model is one letter or a space, so k characters are k tokens). The answer is
    one a new answer after any k would not reproduce, so a restart cannot pass."""
    model = write_tiny_llama(tmp_path / "tiny.gguf", seed=MODEL_SEED)
    assert model.stat().st_size < 1 << 20
    engine = LlamaProcess(model, tmp_path / "llama.log")
    try:
        whole, lines, _ = stream_text(engine.url, chat_body(PROMPT))
        assert len(whole) == MAX_TOKENS and re.fullmatch(r"[a-z ]+", whole), whole
        assert lines[-1] == "[DONE]"
        assert restart_would_match(whole) == [], whole
        for k in (1, KILL_AT, 33, MAX_TOKENS - 1):
            body = chat_body(PROMPT, MAX_TOKENS - k)
            body["messages"].append({"role": "assistant", "content": whole[:k]})
            rest, _, _ = stream_text(engine.url, body)
            assert whole[:k] + rest == whole, (k, whole, rest)
    finally:
        engine.stop()


def test_streamed_chat_through_a_node_that_runs_llama_server(tmp_path: Path) -> None:
    """``--gguf NAME=FILE``: the daemon starts llama-server, its record says kind
    llama.cpp and the model's context length; a stream sent to another daemon comes
    from it; kill -9 of the daemon takes its llama-server with it."""
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    mesh = Mesh(tmp_path)
    try:
        a = mesh.start("a", "--peer-port", "0", "--gguf", f"{MODEL_ALIAS}={model}")
        b = mesh.start("b", "--peer-port", "0", "--api-listen", "127.0.0.1:0",
                       "--bootstrap", a.address)  # fmt: skip
        api = f"http://127.0.0.1:{b.client.get('/v1/inference/requests')['listening']}"

        def served_by_a() -> list[dict[str, Any]] | None:
            data = httpx.get(api + "/v1/models", trust_env=False, timeout=5).json()["data"]
            model = next((m for m in data if m["id"] == MODEL_ALIAS), None)
            return None if model is None else model["nodes"]

        nodes = wait_until(served_by_a, 60, "b to see a's llama-server model")
        assert [(n["node"], n["kind"], n["context_length"]) for n in nodes] == [
            (a.node_id, "llama.cpp", N_CTX)
        ]
        engines = a.client.get("/v1/inference/requests")["engines"]
        assert [(e["healthy"], e["kind"], e["models"]) for e in engines] == [
            (True, "llama.cpp", [MODEL_ALIAS])
        ]
        text, lines, resp = stream_text(api, chat_body(PROMPT, 8))
        assert resp.headers["x-populi-node"] == a.node_id
        assert "continuation" not in resp.headers["x-populi-route"]
        assert len(text) == 8 and re.fullmatch(r"[a-z ]+", text), text
        finish = [json.loads(x)["choices"][0].get("finish_reason") for x in lines[:-1]]
        assert [f for f in finish if f] == ["length"]
        assert lines.count("[DONE]") == 1 and lines[-1] == "[DONE]"
        routes = b.client.get("/v1/inference/requests")["requests"]
        assert routes[-1]["attempts"][-1].endswith("served"), routes[-1]

        children = _children(a.proc.pid)
        assert len(children) == 1, children  # the llama-server
        a.kill()
        wait_until(lambda: not Path(f"/proc/{children[0]}").exists(), 10,
                   "llama-server to die with its daemon")  # fmt: skip
    finally:
        mesh.stop_all()


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_failover_on_llama_server_equals_the_uninterrupted_text(tmp_path: Path) -> None:
    """kill -9 of the serving daemon after `KILL_AT` of `MAX_TOKENS` tokens: the other
    node's llama-server continues the partial answer, and the client's text is exactly
    the engine's uninterrupted answer, with one ``[DONE]``."""
    lab = FailoverLab(tmp_path)
    try:
        lab.start()
        reference = lab.reference(PROMPT)
        assert len(reference) == MAX_TOKENS
        assert restart_would_match(reference) == [], reference  # a restart would show
        text, killed, attempts, lines = lab.failover(PROMPT)
        assert killed, "the stream ended before the kill"
        assert "broken" in attempts[0] and attempts[-1].endswith("served"), attempts
        assert text == reference, (text, reference)
        assert lines.count("[DONE]") == 1 and lines[-1] == "[DONE]"
    finally:
        lab.stop()
