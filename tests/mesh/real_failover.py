"""A failover through llama.cpp's ``llama-server``: the lab that the CI test
(`test_real_engine.py`) runs once and `benchmarks/real_failover_bench.py` runs 40 times.

Three real daemons: ``a`` and ``c`` each serve the tiny model (`tiny_gguf`) through a
``llama-server`` of their own, ``b`` accepts the request. A streamed chat completion at
temperature 0 goes to ``b``; after `KILL_AT` tokens the daemon serving it gets kill -9;
``b`` moves the stream to the other node, which is asked to continue the partial
answer. The text the client got must equal the uninterrupted text (the same request
sent straight to an engine).

The tiny model makes a token in well under a millisecond, so a whole answer would be
gone before a kill could land. Each engine is therefore reached through a `Pacer`: a
loopback TCP relay that passes the engine's bytes unchanged but holds each SSE event
(``\\n\\n``) for `PACE` seconds. The text is the engine's own; only its speed is
that of a real model (20 tokens/s).
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from populi_p2p.inference.llama_server import GgufSpec, find_llama_server, llama_server_argv
from populi_p2p.testing.tiny_gguf import MODEL_ALIAS, write_tiny_llama
from tests.node.harness import Daemon, Mesh, wait_until

#: The tiny model's weights seed. With most seeds, greedy decoding falls at once into a
#: short cycle that ignores the prompt (the default seed 11 gives "xdegxdeg..."), and a
#: new answer started after 4k tokens would pass for a continuation. Seed 23 answers
#: each prompt differently, with no period: a restart after any k tokens differs from
#: the answer (`restart_would_match` checks it per prompt).
MODEL_SEED = 23
#: Seconds each SSE event of an engine's answer is held (20 tokens/s).
PACE = 0.05
#: Tokens asked for, and after how many the serving daemon is killed.
MAX_TOKENS = 64
KILL_AT = 8
_LISTENING = b"HTTP server is listening"


class Pacer:
    """A loopback TCP relay to `upstream` that holds each ``\\n\\n``-ended piece of the
    answer for `pace` seconds (requests pass at once). Threads; `close` stops it."""

    def __init__(self, upstream: tuple[str, int], pace: float) -> None:
        self.upstream = upstream
        self.pace = pace
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                engine = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, engine, 0.0), daemon=True).start()
            threading.Thread(
                target=self._pipe, args=(engine, client, self.pace), daemon=True
            ).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, pace: float) -> None:
        try:
            while data := src.recv(65536):
                if not pace:
                    dst.sendall(data)
                    continue
                pieces = data.split(b"\n\n")
                for i, piece in enumerate(pieces):
                    last = i == len(pieces) - 1
                    dst.sendall(piece if last else piece + b"\n\n")
                    if not last:
                        time.sleep(pace)  # the pace itself, not a synchronisation
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


class LlamaProcess:
    """``llama-server`` on the tiny model, port 0 (read from its log)."""

    def __init__(self, model: Path, log_path: Path, threads: int = 1) -> None:
        argv = llama_server_argv(find_llama_server(), GgufSpec(MODEL_ALIAS, model), threads=threads)
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

        def port() -> int | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"llama-server exited: {self.tail()}")
            text = log_path.read_bytes()
            if _LISTENING not in text:
                return None
            line = text[text.index(_LISTENING) :].split(b"\n", 1)[0]
            return int(line.rsplit(b"port: ", 1)[1].split(b",")[0])

        self.port = wait_until(port, 60, "llama-server to listen")
        self.url = f"http://127.0.0.1:{self.port}"

        def loaded() -> bool:
            try:
                return httpx.get(self.url + "/health", trust_env=False, timeout=2).is_success
            except httpx.HTTPError:
                return False

        wait_until(loaded, 60, "llama-server to load the model")

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def view_names(self) -> dict[str, str]:
        """Serving daemon name -> its state in ``b``'s view."""
        assert self.accepting is not None
        view = self.accepting.view()
        return {name: view.get(d.node_id, "?") for name, d in self.serving.items()}

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def restart_would_match(answer: str) -> list[int]:
    """The k for which "the first k tokens, then a new answer" would equal `answer` (one
    token per character): a failover test is blind to a restart after such a k."""
    return [k for k in range(1, len(answer)) if answer[k:] == answer[: len(answer) - k]]


def chat_body(prompt: str, max_tokens: int = MAX_TOKENS, stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL_ALIAS, "stream": stream, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": prompt}],
    }  # fmt: skip


def stream_text(
    url: str, body: dict[str, Any], on_token: Callable[[int, httpx.Response], None] | None = None
) -> tuple[str, list[str], httpx.Response]:
    """POST a streamed chat completion: (text, raw data lines, response)."""
    pieces: list[str] = []
    lines: list[str] = []
    with (
        httpx.Client(timeout=60, trust_env=False) as client,
        client.stream("POST", url + "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            lines.append(line[6:])
            if line[6:] == "[DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                continue  # the stream's end, kept in `lines` for the caller to judge
            if not event.get("choices"):
                continue  # a usage-only event
            piece = event["choices"][0].get("delta", {}).get("content") or ""
            if piece:
                pieces.append(piece)
                if on_token is not None:
                    on_token(len(pieces), resp)
    return "".join(pieces), lines, resp


class FailoverLab:
    """Two serving daemons with a paced ``llama-server`` each, one accepting daemon."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.model = write_tiny_llama(root / "tiny-llama.gguf", seed=MODEL_SEED)
        self.mesh = Mesh(root)
        self.engines: list[LlamaProcess] = []
        self.pacers: list[Pacer] = []
        self.serving: dict[str, Daemon] = {}  # name -> daemon
        self.urls: dict[str, str] = {}  # name -> its paced engine's URL
        self.accepting: Daemon | None = None
        self.api = ""
        #: The accepting daemon's route log entry of the last `failover`.
        self.last_route: dict[str, Any] = {}

    def start(self) -> None:
        for name in ("a", "c"):
            engine = LlamaProcess(self.model, self.root / f"llama-{name}.log")
            self.engines.append(engine)
            pacer = Pacer(("127.0.0.1", engine.port), PACE)
            self.pacers.append(pacer)
            self.urls[name] = pacer.url
        self.serving["a"] = self.mesh.start("a", "--peer-port", "0", "--engine", self.urls["a"])
        self.accepting = b = self.mesh.start(
            "b", "--peer-port", "0", "--api-listen", "127.0.0.1:0",
            "--bootstrap", self.serving["a"].address,
        )  # fmt: skip
        self.api = f"http://127.0.0.1:{b.client.get('/v1/inference/requests')['listening']}"
        self.restart("c")
        self.wait_both_serving()

    def restart(self, name: str) -> Daemon:
        """(Re)start serving daemon `name` on its engine, joining through ``b``."""
        assert self.accepting is not None
        daemon = self.mesh.start(name, "--peer-port", "0", "--engine", self.urls[name],
                                 "--bootstrap", self.accepting.address)  # fmt: skip
        self.serving[name] = daemon
        return daemon

    def wait_both_serving(self, timeout: float = 60) -> None:
        """Until ``b`` routes the model to both serving daemons (alive, records in)."""

        def both() -> bool:
            data = httpx.get(self.api + "/v1/models", trust_env=False, timeout=5).json()
            nodes = [m["nodes"] for m in data["data"] if m["id"] == MODEL_ALIAS]
            ids = {d.node_id for d in self.serving.values()}
            return bool(nodes) and {n["node"] for n in nodes[0]} == ids

        wait_until(both, timeout, "b to see the model on both serving daemons")

    def reference(self, prompt: str) -> str:
        """The uninterrupted answer, straight from an engine (no pacing, no mesh)."""
        text, _, _ = stream_text(self.engines[0].url, chat_body(prompt))
        return text

    def failover(self, prompt: str) -> tuple[str, str, list[str], list[str]]:
        """One stream through ``b`` whose serving daemon is killed after `KILL_AT`
        tokens: (text, killed daemon's name, route attempts, raw data lines)."""
        assert self.accepting is not None
        by_id = {d.node_id: name for name, d in self.serving.items()}
        killed: list[str] = []

        def kill(i: int, resp: httpx.Response) -> None:
            if i == KILL_AT:
                name = by_id[resp.headers["x-populi-node"]]
                self.serving[name].kill()
                killed.append(name)

        text, lines, _ = stream_text(self.api, chat_body(prompt), on_token=kill)
        self.last_route = self.accepting.client.get("/v1/inference/requests")["requests"][-1]
        return text, killed[0] if killed else "", self.last_route["attempts"], lines

    def view_names(self) -> dict[str, str]:
        """Serving daemon name -> its state in ``b``'s view."""
        assert self.accepting is not None
        view = self.accepting.view()
        return {name: view.get(d.node_id, "?") for name, d in self.serving.items()}

    def stop(self) -> None:
        self.mesh.stop_all()
        for pacer in self.pacers:
            pacer.close()
        for engine in self.engines:
            engine.stop()
