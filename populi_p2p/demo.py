"""`make demo`: a 6-node mesh on loopback as real processes: kill -9s, inference, a
deployment, tasks.

What it shows, in about 30 seconds: a fresh cluster authority enrolls six machines
(here six state directories), six `populi-node up` daemons find each other through one
bootstrap peer, the members table, then a node killed with SIGKILL (no goodbye) and the
table once the survivors agree it is dead. It prints the dashboard's address (the first
node's page, through a loopback relay to its API socket); run in a terminal, it waits for
Enter before the kill and again before stopping the mesh, so the page can be watched.

Then inference: two stand-in engines (``populi_p2p.testing.standin``,
processes on loopback) attached to the last two nodes with ``--engine``, node2 accepting
OpenAI requests on ``--api-listen``; the official ``openai`` client streams a chat
completion from node2, the serving node is killed with SIGKILL mid-stream, and the
stream finishes on the other node with the text intact. Then a deployment: the tiny
model (`populi_p2p.testing.tiny_gguf`) added as a blob on node2 and deployed from it
with 2 replicas (node2 drained meanwhile, so the replicas go to other nodes and every
stream is relayed), a replica's owner killed with SIGKILL, the replica placed again on
another node, and streams through node2 answered before, during and after (two at
once, until one comes from the replacement), the same text each time (temperature
0). Each replica's owner fetches the blob and runs llama.cpp's ``llama-server`` on it
when it is built (``make engine``; ``--deploy-engine llama-server``), else a stand-in
engine that reads the fetched blob (``--deploy-engine standin``, said in one line).
If ``llama-server`` is built, node1 also serves a real engine it runs itself on the
tiny model (``--gguf``), and a stream from node2 comes from it.
Then tasks: a few short tasks submitted through the control API run on their owners
(the ``populi-node tasks`` table), then a longer one, a counter that checkpoints each
step, whose owner is killed once a snapshot is recorded; it runs again at the next epoch
on another node, resumes from the restored checkpoint (``$POPULI_RESUMED_FROM``) and
finishes (the epochs and their owners are printed). Each part has a deadline: a part
that does not finish says why and the demo goes on.
Every wait polls the daemons' control API with a deadline; nothing sleeps for a guessed
time. Everything lives in a temporary directory
that is removed at the end, and every process started is stopped, even on Ctrl-C.

Run it with ``python -m populi_p2p.demo`` (``--nodes N`` for another size, at least 6).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from .api import ApiClient, ApiError
from .cli import format_members
from .inference.keys import issue_api_key
from .observe.relay import UnixRelay
from .trust.authority import AUTHORITY_PUBLIC_FILE, ClusterAuthority
from .trust.certificate import write_certificate
from .trust.identity import NodeIdentity

__all__ = ["main"]

#: Longest the demo waits for any one step, seconds.
STEP_TIMEOUT = 40.0

#: The stand-in engines' stream: TOKENS words, one every TOKEN_DELAY seconds (slow
#: enough for a visible kill mid-stream), the node killed after KILL_AT tokens.
TOKENS = 30
TOKEN_DELAY = 0.1
KILL_AT = 10

#: Tokens asked of the real engine (llama.cpp on the tiny model), when it is installed.
REAL_TOKENS = 16

#: Tokens of each stream from the deployed model, and its weights' seed (one whose
#: greedy answer does not fall into a short cycle: tests/mesh/real_failover.py).
DEPLOY_TOKENS = 12
DEPLOY_SEED = 23
#: Rounds of two streams at once after the replacement serves, until one comes from it.
AFTER_TRIES = 8

#: The short tasks of the tasks part.
SHORT_TASKS = 3


class DemoError(Exception):
    """A step did not happen in time; the message says which."""


#: Seconds between the steps of the demo's long task.
LONG_STEP: Final = 0.25


def _counter(steps: int) -> str:
    """A shell task that counts to `steps`, its count in its checkpoint dir (written,
    renamed, then a snapshot asked for), and says where it resumed."""
    return (
        'c="$POPULI_CHECKPOINT_DIR"; s=$(cat "$c/step" 2>/dev/null || echo 0);'
        ' [ -n "$POPULI_RESUMED_FROM" ] && echo "resumed from epoch $POPULI_RESUMED_FROM'
        ' at step $s";'
        f' while [ "$s" -lt {steps} ]; do sleep {LONG_STEP}; s=$((s+1));'
        ' echo "$s" > "$c/s.tmp"; mv "$c/s.tmp" "$c/step"; touch "$c/.request"; done;'
        ' echo "done at step $s"'
    )


def _wait(condition: Callable[[], Any], what: str, timeout: float = STEP_TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = condition()
        except ApiError:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def _pause(prompt: str) -> None:
    """Wait for Enter when a person runs the demo in a terminal; never in CI."""
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():
        return
    try:
        input(f"{prompt} ")
    except EOFError:
        pass


class _Demo:
    def __init__(self, root: Path, nodes: int, long_task: float = 8.0) -> None:
        self.root = root
        self.long_task = long_task
        self.api_key = ""
        env = dict(os.environ)
        repo = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
        self.env = env
        self.count = nodes
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.clients: dict[str, ApiClient] = {}
        self.ids: dict[str, str] = {}
        self.relay: UnixRelay | None = None
        self.engines: list[subprocess.Popen[bytes]] = []
        self.llama_model: Path | None = None
        self.deploy_engine = "standin"
        self.killed: set[str] = set()

    def enroll(self, name: str, authority: ClusterAuthority) -> Path:
        state = self.root / name
        identity = NodeIdentity.load_or_create(state)
        cert = authority.enroll(identity.public_key, now=time.time())
        write_certificate(state / "node.cert", cert)
        shutil.copy(self.root / "authority" / AUTHORITY_PUBLIC_FILE, state / AUTHORITY_PUBLIC_FILE)
        return state

    def start(self, name: str, state: Path, *flags: str) -> dict[str, Any]:
        log = (self.root / f"{name}.log").open("wb")
        argv = [
            sys.executable, "-m", "populi_p2p.cli", "up", "--state-dir", str(state),
            "--name", name, "--bind", "127.0.0.1", "--port", "0", "--overlay", "none",
            "--preset", "local", "--label", f"demo/role={name}", *flags,
        ]  # fmt: skip
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.env
        )
        client = ApiClient(state / "api.sock", timeout=5.0)
        self.clients[name] = client

        def answered() -> dict[str, Any] | None:
            if self.procs[name].poll() is not None:
                tail = (self.root / f"{name}.log").read_text(errors="replace")[-500:]
                raise DemoError(f"{name} exited at start: {tail}")
            return client.get("/v1/status") if client.socket_path.exists() else None

        status: dict[str, Any] = _wait(answered, f"{name} to start")
        self.ids[name] = status["node"]["node_id"]
        return status

    def views(self, names: list[str]) -> dict[str, dict[str, str]]:
        out = {}
        for name in names:
            members = self.clients[name].get("/v1/members")
            out[name] = {m["node_id"]: m["state"] for m in members}
        return out

    def engine(self, name: str) -> str:
        """Start one stand-in engine process on loopback; returns its URL."""
        port_file = self.root / f"{name}.port"
        argv = [
            sys.executable, "-m", "populi_p2p.testing.standin", "--port", "0",
            "--port-file", str(port_file), "--model", "standin", "--tokens", str(TOKENS),
            "--delay", str(TOKEN_DELAY),
        ]  # fmt: skip
        log = (self.root / f"{name}.log").open("wb")
        self.engines.append(
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        )
        port = _wait(lambda: port_file.exists() and port_file.read_text().strip(), f"{name} up")
        return f"http://127.0.0.1:{port}"

    def llama_model_file(self) -> Path | None:
        """The tiny generated model for node1's ``--gguf`` (the node then runs llama.cpp's
        ``llama-server`` itself), if ``llama-server`` is built and gguf installed."""
        from .inference.llama_server import LlamaServerError, find_llama_server

        try:
            find_llama_server()
        except LlamaServerError:
            return None
        if importlib.util.find_spec("gguf") is None:
            return None
        from .testing.tiny_gguf import write_tiny_llama

        return write_tiny_llama(self.root / "tiny-llama.gguf")

    def kill(self, name: str) -> None:
        """SIGKILL one daemon: no goodbye, just gone."""
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(timeout=10)
        self.killed.add(name)

    def alive(self) -> list[str]:
        return [n for n in self.procs if n not in self.killed]

    def name_of(self, node_id: str | None) -> str:
        names = {v: k for k, v in self.ids.items()}
        return names.get(node_id or "", (node_id or "-")[:12])

    def stop(self) -> None:
        if self.relay is not None:
            self.relay.close()
        for proc in [*self.procs.values(), *self.engines]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in [*self.procs.values(), *self.engines]:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    ####
    # Inference

    def inference(self) -> None:
        """A streamed chat completion through the API node, its serving node killed."""
        try:
            import openai
        except ImportError:
            raise DemoError("the openai package is missing (pip install -e '.[demo]')") from None
        names = list(self.procs)
        api_node = names[1]
        port = self.clients[api_node].get("/v1/inference/requests")["listening"]
        base = f"http://127.0.0.1:{port}/v1"
        client = openai.OpenAI(base_url=base, api_key=self.api_key, timeout=30.0, max_retries=0)
        print(f"\n-- inference: {names[-2]} and {names[-1]} serve 'standin' through stand-in")
        print(f"   engines; {api_node} accepts OpenAI requests at {base}")

        def served_by_two() -> bool:
            models = {m.id: m for m in client.models.list().data}
            model = models.get("standin")
            return model is not None and len(getattr(model, "nodes", [])) == 2

        _wait(served_by_two, f"{api_node} to see the model on two nodes")
        pieces: list[str] = []
        with client.chat.completions.with_streaming_response.create(
            model="standin", stream=True, messages=[{"role": "user", "content": "count"}]
        ) as response:
            first = self.name_of(response.headers.get("x-populi-node"))
            print(f"   stream from {first} (x-populi-node), route: "
                  f"{response.headers.get('x-populi-route')}")  # fmt: skip
            stream: Iterator[Any] = iter(response.parse())
            for chunk in stream:
                piece = chunk.choices[0].delta.content if chunk.choices else None
                if not piece:
                    continue
                pieces.append(piece)
                print(piece, end="", flush=True)
                if len(pieces) == KILL_AT and first in self.procs:
                    print(f"\n   kill -9 {first} mid-stream (pid {self.procs[first].pid})")
                    self.kill(first)
        text = "".join(pieces)
        want = "".join(f"w{i} " for i in range(TOKENS))
        verdict = "intact, no repeat" if text == want else f"NOT intact (want {want!r})"
        print(f"\n   stream finished: {len(pieces)} pieces, text {verdict}")
        routes = self.clients[api_node].get("/v1/inference/requests")["requests"]
        if routes:
            attempts = [a.replace(self.ids.get(first, "?"), first) for a in routes[-1]["attempts"]]
            for name in self.alive():
                attempts = [a.replace(self.ids[name], name) for a in attempts]
            print(f"   route attempts: {'; '.join(attempts)}")
        if text != want:
            raise DemoError("the stream's text was not intact")

    def real_engine(self) -> None:
        """A streamed chat completion from node2, served by llama.cpp on node1."""
        if not self.llama_model:
            print("\n-- real engine: llama-server is not built (make engine);"
                  " stand-in engines only")  # fmt: skip
            return
        import openai

        from .testing.tiny_gguf import MODEL_ALIAS

        names = list(self.procs)
        api_node, host = names[1], names[0]
        port = self.clients[api_node].get("/v1/inference/requests")["listening"]
        base = f"http://127.0.0.1:{port}/v1"
        client = openai.OpenAI(base_url=base, api_key=self.api_key, timeout=30.0, max_retries=0)
        print(
            f"\n-- real engine: {host} serves {MODEL_ALIAS!r} through llama.cpp's "
            "llama-server, which it started itself (--gguf); a tiny generated model, so the"
        )
        print("   text is gibberish")  # fmt: skip

        def listed() -> bool:
            return any(m.id == MODEL_ALIAS for m in client.models.list().data)

        _wait(listed, f"{api_node} to see {MODEL_ALIAS!r}")
        pieces: list[str] = []
        with client.chat.completions.with_streaming_response.create(
            model=MODEL_ALIAS, stream=True, max_tokens=REAL_TOKENS,
            messages=[{"role": "user", "content": "say something"}],
        ) as response:  # fmt: skip
            served = self.name_of(response.headers.get("x-populi-node"))
            print(f"   stream from {served} (x-populi-node): ", end="")
            for chunk in response.parse():
                piece = chunk.choices[0].delta.content if chunk.choices else None
                if piece:
                    pieces.append(piece)
                    print(piece, end="", flush=True)
        print(f"\n   real engine: {len(pieces)} tokens from {served} through {api_node}")
        if served != host or len(pieces) != REAL_TOKENS:
            raise DemoError(f"wanted {REAL_TOKENS} tokens from {host}")

    ####
    # Deployments

    def deploy(self) -> None:
        """``deploy`` the tiny model with 2 replicas; kill -9 one replica's owner; it is
        placed again elsewhere, and streams go on, the same text (temperature 0)."""
        api_node = list(self.procs)[1]
        # Deployed from the API node, never the victim (it undeploys at the end), drained
        # meanwhile: the replicas go to other nodes, so each stream goes through a relay
        # to one of them, and the replacement's answers can be seen.
        at = api_node
        model = self._tiny_model()
        self._cli(at, "model", "add", str(model), "--name", "tiny")
        self._cli(at, "drain")
        print(f"\n-- deploy: the tiny model ({model.stat().st_size} bytes) added on {at};"
              f" populi-node drain, deploy tiny --replicas 2 (from {at})")  # fmt: skip
        if self.deploy_engine == "llama-server":
            print("   each replica's owner fetches it and runs llama.cpp's llama-server on it")
        else:
            print("   llama-server is not built (make engine): stand-in engines that read"
                  " the fetched blob")  # fmt: skip
        began = time.monotonic()
        self._cli(at, "deploy", "tiny", "--replicas", "2")
        rows = _wait(lambda: self._serving(api_node), "both replicas to serve")
        print(f"   both serving {time.monotonic() - began:.1f} s after deploy; deployments:\n")
        print(self._cli(api_node, "deployments").rstrip())
        port = self.clients[api_node].get("/v1/inference/requests")["listening"]
        texts: list[str] = []

        def stream() -> str:
            text, node = self._deployed_stream(port)
            texts.append(text)
            return f"{text!r} from {node}"

        print(f"\n   streams through {api_node} (temperature 0)")
        print(f"   before: {stream()}")
        owner_ids = [r["node_id"] for r in rows]
        owners = [self.name_of(r["node_id"]) for r in rows if r["node_id"] != self.ids[api_node]]
        # Not the first live node either: the tasks part reads through it (`client_alive`).
        victim = next((n for n in owners if n != self.alive()[0]), owners[0])
        print(f"   kill -9 {victim} (owner of a replica; pid {self.procs[victim].pid})")
        killed = time.monotonic()
        self.kill(victim)
        print(f"   meanwhile: {stream()}")
        victim_id = self.ids[victim]
        rows = _wait(lambda: (r := self._serving(api_node)) and victim_id not in
                     {x["node_id"] for x in r} and r, "the replica to be placed again")  # fmt: skip
        print(f"   placed again and serving {time.monotonic() - killed:.1f} s after the"
              f" kill; deployments:\n")  # fmt: skip
        print(self._cli(api_node, "deployments").rstrip())
        # After: two streams at once, which the router spreads over the two replicas,
        # until one comes from the replacement (a few tries at most).
        new = self.name_of(next(iter({r["node_id"] for r in rows} - set(owner_ids)), ""))
        _wait(lambda: self.ids.get(new) in self._model_nodes(port, "tiny"),
              f"{api_node} to list {new}'s replica")  # fmt: skip
        with ThreadPoolExecutor(2) as pool:
            for _ in range(AFTER_TRIES):
                answers = list(pool.map(lambda _: self._deployed_stream(port), range(2)))
                if any(node == new for _, node in answers):
                    break
        print()
        for text, node in answers:
            texts.append(text)
            replacement = " (the replacement)" if node == new else ""
            print(f"   after: {text!r} from {node}{replacement}")
        same = len(set(texts)) == 1 and texts[0]
        print(f"   {len(texts)} streams, {'the same text' if same else 'NOT the same text'}")
        print(f"   {self._cli(at, 'undeploy', 'tiny').strip()}")
        self._cli(at, "undrain")
        if not same:
            raise DemoError("the deployed model's streams differed")

    def _model_nodes(self, port: int, model: str) -> set[str]:
        """The nodes the API node's catalogue lists for `model`."""
        import httpx

        url = f"http://127.0.0.1:{port}/v1/models"
        auth = {"authorization": f"Bearer {self.api_key}"}
        data = httpx.get(url, headers=auth, timeout=10).json().get("data") or []
        return {n["node"] for m in data if m.get("id") == model for n in m.get("nodes", [])}

    def _deployed_stream(self, port: int) -> tuple[str, str]:
        """A streamed chat completion for the deployed model: (text, serving node)."""
        import json

        import httpx

        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": DEPLOY_TOKENS, "temperature": 0, "stream": True}  # fmt: skip
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        auth = {"authorization": f"Bearer {self.api_key}"}
        pieces = []
        with httpx.stream("POST", url, json=body, headers=auth, timeout=30) as r:
            if r.status_code != 200:
                raise DemoError(f"a request for tiny failed: {r.status_code} {r.read()[:200]!r}")
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    pieces.append(choices[0].get("delta", {}).get("content") or "")
            return "".join(pieces).strip(), self.name_of(r.headers.get("x-populi-node"))

    def _tiny_model(self) -> Path:
        path = self.root / "tiny.gguf"
        if importlib.util.find_spec("gguf") is not None:
            from .testing.tiny_gguf import write_tiny_llama

            return write_tiny_llama(path, seed=DEPLOY_SEED)
        path.write_bytes(b"GGUF" + bytes(range(256)) * 2048)  # gguf missing: any bytes
        return path

    def _cli(self, name: str, *args: str) -> str:
        state = self.clients[name].socket_path.parent
        proc = subprocess.run(
            [sys.executable, "-m", "populi_p2p.cli", *args, "--state-dir", str(state)],
            capture_output=True, text=True, timeout=60, env=self.env,
        )  # fmt: skip
        if proc.returncode != 0:
            raise DemoError(f"populi-node {' '.join(args)}: {proc.stderr.strip()[-300:]}")
        return proc.stdout

    def _serving(self, name: str) -> list[dict[str, Any]] | None:
        data = self.clients[name].get("/v1/deployments")["deployments"]
        rows: list[dict[str, Any]] = next((d["replicas"] for d in data if d["name"] == "tiny"), [])
        return rows if len(rows) == 2 and all(r["state"] == "serving" for r in rows) else None

    ####
    # Tasks

    def client_alive(self) -> ApiClient:
        """A control client of a live node, longer timeout: submit waits for acks."""
        name = self.alive()[0]
        return ApiClient(self.clients[name].socket_path, timeout=15.0)

    def submit(self, name: str, command: list[str], **spec: Any) -> str:
        """Submit through `name`'s control API; returns once enough members acked."""
        client = ApiClient(self.clients[name].socket_path, timeout=15.0)
        return str(client.post("/v1/tasks", {"command": command, **spec})["id"])

    def task(self, tid: str) -> dict[str, Any]:
        return self.client_alive().get(f"/v1/tasks/{tid}")  # type: ignore[no-any-return]

    def tasks_table(self) -> None:
        """The `populi-node tasks` table, from the CLI itself."""
        state = self.clients[self.alive()[0]].socket_path.parent
        proc = subprocess.run(
            [sys.executable, "-m", "populi_p2p.cli", "tasks", "--state-dir", str(state)],
            capture_output=True, text=True, timeout=30, env=self.env,
        )  # fmt: skip
        print(proc.stdout.rstrip() or proc.stderr.strip())

    def epochs(self, tid: str) -> None:
        for e in self.task(tid)["epochs"]:
            code = "" if e["exit_code"] is None else f", exit {e['exit_code']}"
            print(f"   epoch {e['epoch']}: owner {self.name_of(e['owner'])}, {e['phase']}{code}")

    def tasks(self) -> None:
        """Short tasks run on their owners; a longer one survives its owner's kill -9."""
        alive = self.alive()
        print(f"\n-- tasks: {SHORT_TASKS} short tasks, submitted to {', '.join(alive)} in turn")
        tids = [
            self.submit(alive[i % len(alive)], ["sh", "-c", f"echo hello {i}"])
            for i in range(SHORT_TASKS)
        ]
        _wait(
            lambda: all(self.task(t)["phase"] == "succeeded" for t in tids),
            "the short tasks to succeed",
        )
        print("   all succeeded; populi-node tasks:\n")
        self.tasks_table()
        # A task's replicas are the members its accepting node holds alive: wait until
        # every survivor holds the nodes killed so far dead, so none is named a replica.
        gone = {nid for name, nid in self.ids.items() if name in self.killed}
        _wait(
            lambda: all(v.get(i) in (None, "dead", "left") for v in self.views(alive).values()
                        for i in gone),
            "the survivors to hold the killed nodes dead",
        )  # fmt: skip
        # Submitted to the last node, so that the first (the dashboard's) likely stays up.
        # A counter that checkpoints each step: the next owner resumes where it was.
        steps = max(4, int(self.long_task / LONG_STEP))
        long = self.submit(alive[-1], ["sh", "-c", _counter(steps)], retries=0,
                           checkpoint_every=0.0)  # fmt: skip
        print(f"\n   long task {long[:12]} (counts to {steps}, a step every {LONG_STEP} s,"
              f" a checkpoint each step) submitted to {alive[-1]}")  # fmt: skip
        running = _wait(
            lambda: (t := self.task(long))["phase"] == "running" and t, "the long task to run"
        )
        ck = _wait(
            lambda: (c := self.task(long)["checkpoint"]) and c["sha256"] and c["seq"] >= 2
            and c["epoch"] == running["epoch"] and c,
            "the long task to record a checkpoint",
        )  # fmt: skip
        held = ", ".join(self.name_of(h) for h in ck["holders"])
        print(f"   checkpoint #{ck['seq']} of epoch {ck['epoch']}: {ck['size']} bytes,"
              f" held by {held}")  # fmt: skip
        owner = self.name_of(running["owner"])
        if owner not in self.procs or owner in self.killed:
            raise DemoError(f"the long task's owner {owner} is not one of the demo's nodes")
        print(f"   running at epoch {running['epoch']} on {owner}; kill -9 {owner}")
        killed = time.monotonic()
        self.kill(owner)
        # Running again, or already done again: a table may show the end before it
        # shows the start (gossip carries the newer change under the same key).
        again = _wait(
            lambda: (t := self.task(long))["epoch"] > running["epoch"]
            and (t["phase"] == "running" or t["finished"]) and t,
            "the long task to run again elsewhere",
        )  # fmt: skip
        print(f"   {again['phase']} again at epoch {again['epoch']} on"
              f" {self.name_of(again['owner'])} {time.monotonic() - killed:.1f} s after"
              " the kill")  # fmt: skip
        done = _wait(
            lambda: (t := self.task(long))["finished"] and t,
            "the long task to finish", timeout=self.long_task + STEP_TIMEOUT,
        )  # fmt: skip
        result = done.get("result") or {}
        output = (result.get("output_tail") or "").split("[stderr]")[0].strip()
        print(f"   finished: {done['phase']}, output {output!r}; its epochs:")
        print(f"   (the restored checkpoint: {output.splitlines()[0] if output else '-'})")
        self.epochs(long)
        if done["phase"] != "succeeded":
            raise DemoError(f"the long task ended {done['phase']}")

    def run(self) -> None:
        t0 = time.monotonic()
        authority = ClusterAuthority.create(self.root / "authority")
        print(f"cluster {authority.fingerprint}: authority created in {self.root / 'authority'}")
        names = [f"node{i}" for i in range(1, self.count + 1)]
        states = {name: self.enroll(name, authority) for name in names}
        self.api_key = issue_api_key(authority, "demo", now=time.time()).token
        # Roles for the inference part: engines on the last two nodes, the API on node2.
        # The deployed stand-in engines run with this Python, which a dynamic task uid
        # may not execute (a Python under /root): as root, tasks run as root here.
        as_root = ["--task-user", "root"] if os.geteuid() == 0 else []
        self.llama_model = self.llama_model_file()
        # Deployed replicas run llama.cpp's llama-server when it is built.
        self.deploy_engine = "llama-server" if self.llama_model else "standin"
        flags: dict[str, list[str]] = {
            name: ["--peer-port", "0", "--deploy-engine", self.deploy_engine, *as_root]
            for name in names
        }
        for name in names[-2:]:
            flags[name] += ["--engine", self.engine(f"engine-{name}")]
        flags[names[1]] += ["--api-listen", "127.0.0.1:0"]
        print(f"enrolled {len(names)} nodes; stand-in engines for {names[-2]} and {names[-1]};")
        if self.llama_model:
            from .testing.tiny_gguf import MODEL_ALIAS

            flags[names[0]] += ["--gguf", f"{MODEL_ALIAS}={self.llama_model}"]
            print(f"llama.cpp's llama-server for {names[0]} (--gguf);")
        print("starting the nodes as separate processes on 127.0.0.1")
        first = self.start(names[0], states[names[0]], *flags[names[0]])
        seed = first["node"]["address"]
        for name in names[1:]:
            self.start(name, states[name], "--bootstrap", seed, *flags[name])
        every = set(self.ids.values())
        _wait(
            lambda: all(
                {k for k, v in view.items() if v == "alive"} == every
                for view in self.views(names).values()
            ),
            "every node to see every other alive",
        )
        took = time.monotonic() - t0
        print(f"\nconverged after {took:.1f} s; members as {names[0]} sees them:\n")
        print(format_members(self.clients[names[0]].get("/v1/members")))
        self.relay = UnixRelay(self.clients[names[0]].socket_path)
        print(f"\ndashboard: {self.relay.url} ({names[0]}'s page, live; metrics at /metrics)")
        _pause(f"press Enter to kill {names[2]} and watch the page show it dead")

        victim = names[2]
        survivors = [n for n in names if n != victim]
        print(f"\nkill -9 {victim} (pid {self.procs[victim].pid}): no goodbye, just gone")
        killed = time.monotonic()
        self.kill(victim)
        victim_id = self.ids[victim]
        # Each survivor counts once it has shown the victim dead: a dead member is
        # forgotten after `dead_retention` (15 s local), which the first to declare it can
        # reach before a slow survivor declares it too.
        declared: set[str] = set()

        def all_declared() -> bool:
            for name, view in self.views(survivors).items():
                if view.get(victim_id) == "dead":
                    declared.add(name)
            return declared >= set(survivors)

        _wait(all_declared, f"the survivors to agree {victim} is dead")
        took = time.monotonic() - killed
        print(f"all {len(survivors)} survivors agree {victim} is dead after {took:.1f} s;")
        print(f"members as {names[0]} sees them:\n")
        print(format_members(self.clients[names[0]].get("/v1/members")))
        for part in (self.inference, self.real_engine, self.deploy, self.tasks):
            try:
                part()
            except DemoError as exc:
                print(f"\n{part.__name__} part did not finish: {exc}; going on")
        _pause(f"the mesh stays up; press Enter to stop it (dashboard: {self.relay.url})")
        print(f"\ndemo done in {time.monotonic() - t0:.1f} s; stopping the mesh")


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m populi_p2p.demo", description=__doc__)
    parser.add_argument("--nodes", type=int, default=6, help="mesh size (default 6, at least 6)")
    parser.add_argument(
        "--long-task", type=float, default=8.0, metavar="SECONDS",
        help="how long the task whose owner is killed runs (default 8)",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if args.nodes < 6:
        parser.error(
            "--nodes must be at least 6 (a kill each for the mesh, the stream, the"
            " deployment and the task; two engines; one API node)"
        )
    if not 1.0 <= args.long_task <= 600.0:
        parser.error("--long-task must be 1 to 600 seconds")
    root = Path(tempfile.mkdtemp(prefix="populi-demo-"))
    demo = _Demo(root, args.nodes, args.long_task)
    try:
        demo.run()
    except DemoError as exc:
        print(f"demo failed: {exc} (logs in {root})", file=sys.stderr)
        args.keep = True
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        demo.stop()
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
