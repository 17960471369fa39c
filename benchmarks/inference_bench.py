"""Inference relay benchmark: what routing through the mesh costs over calling the
engine directly. Printed, not asserted (targets from issue 11 in brackets).

The relay path runs as three separate processes on loopback, as in a deployment: the
stand-in engine, the serving node (its peer API and its engine client) and the
accepting node (the public API, the route, the signed peer call, the relay); the
client is this process. So the client's and the engine's own work are not charged to
the relay, and the per-process CPU time (from /proc) gives each node's cost per token
and per request, which the machine's load does not inflate the way wall time is.

* added time to first token, median and p99 [< 5 ms]: a streamed chat completion of
  one token, straight to the engine vs through the accepting node that relays to the
  serving node's peer API (signed call) which calls its engine; plus the CPU per
  request in each node;
* added latency per token, median and p99 [< 0.2 ms]: a 400-token stream with no
  engine delay, (relayed - direct) / tokens, per run; plus the CPU per token in each
  node;
* relayed tokens per second through one node [>= 5,000]: tokens/s of the relayed
  stream (wall), and the accepting node's capacity (tokens per CPU second);
* stream gap after the serving node is killed mid-stream, median and p99 [< 2 s]:
  in one process (the kill cancels the node's engine and peer API at once: sockets
  reset, no goodbye; the stand-in's prefill is ~0, so this is the relay's own
  failover time);
* a failure before the first byte (engine error, connection refused) retried on the
  next candidate: the time it adds to the first token [< 100 ms];
* route decision time over 1,000 and 10,000 candidate records.

The machine's load average is printed before and after: on a shared machine the wall
figures are noisy upper bounds.

Usage::

    python benchmarks/inference_bench.py            # everything
    python benchmarks/inference_bench.py --runs 50  # fewer runs, faster
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from populi_p2p.inference.engines import EngineService
from populi_p2p.inference.peer_api import PeerApi, PeerRoutes
from populi_p2p.inference.peer_auth import PeerCallSigner, PeerCallVerifier
from populi_p2p.inference.peer_client import PeerClient
from populi_p2p.inference.route import Candidate, choose_route
from populi_p2p.inference.service import InferenceService
from populi_p2p.testing.standin import StandinConfig
from populi_p2p.trust.identity import NodeIdentity
from tests.inference.conftest import ALICE, AUTHORITY, BOB, CERTS, NOW, keys
from tests.inference.harness import Mesh

CAROL = NodeIdentity.from_seed(b"c" * 32)
CERTS.setdefault(CAROL.node_id, AUTHORITY.enroll(CAROL.public_key, now=NOW - 60, serial=7).raw)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def stream(
    client: httpx.AsyncClient, url: str, on_token: Any = None, max_tokens: int | None = None
) -> tuple[float, float, int]:
    """(time to first token, total, tokens) of one streamed chat completion."""
    body: dict[str, Any] = {
        "model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]
    }  # fmt: skip
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    start = time.perf_counter()
    first = 0.0
    tokens = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"][0]["delta"].get("content"):
                    tokens += 1
                    if tokens == 1:
                        first = time.perf_counter() - start
                    if on_token is not None:
                        await on_token(tokens)
    return first, time.perf_counter() - start, tokens


########################################################################################
# The relay path as separate processes


async def _serving_node(engine_url: str, port_file: str) -> None:
    """The serving node: its peer API (signed calls only) in front of its engine."""

    async def publish(name: str, value: dict[str, Any] | None) -> None:
        pass

    engines = EngineService([engine_url], publish, interval=1.0)
    service = InferenceService(
        ALICE.node_id, view=list, address_of=lambda n: None, peer_client=None,
        engines=engines, listen=None,
    )  # fmt: skip
    routes = PeerRoutes()
    service.register_peer_routes(routes)
    verifier = PeerCallVerifier(keys(ALICE), ALICE.node_id, clock=time.time)
    api = PeerApi(verifier, routes, host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(engines.run)
        while engines.engine_for("m") is None:
            await trio.sleep(0.01)  # the engine's first poll (bounded by the parent)
        _write_port(port_file, await nursery.start(api.run))


async def _front_node(peer_port: int, port_file: str) -> None:
    """The accepting node: the public API, routing to the serving node."""
    view = [Candidate(ALICE.node_id, "alice", "alive", False, {"m": {"kind": "standin"}}, 0.001)]
    client = PeerClient(PeerCallSigner(CAROL, CERTS[CAROL.node_id], clock=time.time))
    service = InferenceService(
        CAROL.node_id, view=lambda: view, address_of=lambda n: ("127.0.0.1", peer_port),
        peer_client=client, engines=None, listen=("127.0.0.1", 0),
        state_of=lambda n: "alive",
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        _write_port(port_file, await nursery.start(service.run))


def _write_port(path: str, port: int | None) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(str(port))
    os.replace(path + ".tmp", path)


def _wait_port(path: Path, proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 30
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"a benchmark process did not start (exit {proc.returncode})")
        time.sleep(0.02)  # polling a file another process writes: no event to await
    return int(path.read_text())


@contextmanager
def relay_processes() -> Iterator[tuple[str, str, list[tuple[str, int]]]]:
    """(engine URL, accepting node URL, [(name, pid)]) with the three processes up."""
    procs: list[subprocess.Popen[bytes]] = []
    me = str(Path(__file__).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        try:
            engine = subprocess.Popen([sys.executable, "-m", "populi_p2p.testing.standin",
                                       "--model", "m", "--tokens", "400", "--port", "0",
                                       "--port-file", f"{tmp}/engine"])  # fmt: skip
            procs.append(engine)
            engine_url = f"http://127.0.0.1:{_wait_port(Path(tmp, 'engine'), engine)}"
            serving = subprocess.Popen(
                [
                    sys.executable,
                    me,
                    "--role",
                    "serving",
                    "--to",
                    engine_url,
                    "--port-file",
                    f"{tmp}/serving",
                ]
            )
            procs.append(serving)
            peer_port = _wait_port(Path(tmp, "serving"), serving)
            front = subprocess.Popen(
                [
                    sys.executable,
                    me,
                    "--role",
                    "front",
                    "--to",
                    str(peer_port),
                    "--port-file",
                    f"{tmp}/front",
                ]
            )
            procs.append(front)
            front_url = f"http://127.0.0.1:{_wait_port(Path(tmp, 'front'), front)}"
            pids = [("engine", engine.pid), ("serving node", serving.pid),
                    ("accepting node", front.pid)]  # fmt: skip
            yield engine_url, front_url, pids
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def overhead(runs: int) -> None:
    with relay_processes() as (engine_url, front_url, pids):
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            for _ in range(5):  # warm connections, both hops
                await stream(client, engine_url)
                await stream(client, front_url)
            results: dict[str, list[tuple[float, float, int]]] = {}
            cpu: dict[str, list[float]] = {}
            for label, max_tokens in (("ttft", 1), ("tokens", None)):
                direct, relayed = [], []
                before = [cpu_seconds(pid) for _, pid in pids]
                for _ in range(runs):
                    direct.append(await stream(client, engine_url, max_tokens=max_tokens))
                    relayed.append(await stream(client, front_url, max_tokens=max_tokens))
                cpu[label] = [
                    cpu_seconds(pid) - b for (_, pid), b in zip(pids, before, strict=True)
                ]
                results[label + ".direct"] = direct
                results[label + ".relayed"] = relayed
    ttft_d = [r[0] for r in results["ttft.direct"]]
    ttft_r = [r[0] for r in results["ttft.relayed"]]
    added = [(r - d) * 1000 for d, r in zip(ttft_d, ttft_r, strict=True)]
    print(
        f"time to first token: direct median {statistics.median(ttft_d) * 1000:.2f} ms,"
        f" relayed median {statistics.median(ttft_r) * 1000:.2f} ms"
    )
    print(f"  added: median {statistics.median(added):.2f} ms,"
          f" p99 {pct(added, 0.99):.2f} ms  [< 5 ms]")  # fmt: skip
    # The engine's CPU covers both the direct and the relayed request: halve it.
    per_req = [c / runs / (2 if i == 0 else 1) * 1000 for i, c in enumerate(cpu["ttft"])]
    print("  CPU per one-token request: " + ", ".join(
        f"{name} {ms:.2f} ms" for (name, _), ms in zip(pids, per_req, strict=True)))  # fmt: skip
    tokens = sum(r[2] for r in results["tokens.relayed"])
    per_tok = [
        ((r[1] - r[0]) - (d[1] - d[0])) / max(1, r[2] - 1) * 1000
        for d, r in zip(results["tokens.direct"], results["tokens.relayed"], strict=True)
    ]
    print(
        f"added per token: median {statistics.median(per_tok):.4f} ms,"
        f" p99 {pct(per_tok, 0.99):.4f} ms  [< 0.2 ms]"
    )
    per_token_cpu = [c / tokens / (2 if i == 0 else 1) * 1000 for i, c in enumerate(cpu["tokens"])]
    print("  CPU per relayed token (400-token streams): " + ", ".join(
        f"{name} {ms:.4f} ms" for (name, _), ms in zip(pids, per_token_cpu, strict=True)
    ))  # fmt: skip
    rates = [r[2] / r[1] for r in results["tokens.relayed"]]
    direct_rates = [d[2] / d[1] for d in results["tokens.direct"]]
    print(
        f"relayed tokens/s: median {statistics.median(rates):,.0f}"
        f" (direct {statistics.median(direct_rates):,.0f})  [>= 5,000]"
    )
    print(f"  the accepting node's capacity: {1 / (per_token_cpu[2] / 1000):,.0f} tokens"
          f" per CPU second; the serving node's {1 / (per_token_cpu[1] / 1000):,.0f}")  # fmt: skip


async def one_failover() -> float:
    """The gap (ms) around a kill of the serving node after token 10."""
    async with trio.open_nursery() as nursery:
        mesh = Mesh()
        cfg = StandinConfig(model="m", tokens=30, delay=0.002)
        await mesh.add_serving(nursery, ALICE, "alice", cfg)
        await mesh.add_serving(nursery, BOB, "bob", cfg)
        await mesh.start_front(nursery, CAROL)
        decision, _ = mesh.front.decide("m")  # type: ignore[union-attr]
        times: list[float] = []

        async def on_token(i: int) -> None:
            times.append(time.perf_counter())
            if i == 10:
                mesh.members[decision.order[0]].kill()

        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            _, _, tokens = await stream(client, mesh.url, on_token)
        assert tokens == 30, tokens
        nursery.cancel_scope.cancel()
    return (times[10] - times[9]) * 1000


async def failover_gaps(runs: int) -> None:
    gaps = [await one_failover() for _ in range(runs)]
    print(
        f"stream gap after the serving node is killed: median {statistics.median(gaps):.1f} ms,"
        f" p99 {pct(gaps, 0.99):.1f} ms over {runs} runs  [< 2 s]"
    )


async def one_retry(fault: str) -> tuple[float, int]:
    """(ms added to the first token, attempts) when the first choice fails before its
    first byte: its engine answers 500 (`fault` "error") or the node is gone, connection
    refused ("refused"). A fresh mesh each time: a failure demotes the node at once, so
    it is first choice only once."""
    async with trio.open_nursery() as nursery:
        mesh = Mesh()
        cfg = StandinConfig(model="m", tokens=1)
        await mesh.add_serving(nursery, ALICE, "alice", cfg)
        await mesh.add_serving(nursery, BOB, "bob", cfg)
        await mesh.start_front(nursery, CAROL)
        front = mesh.front
        assert front is not None
        first = mesh.members[front.decide("m")[0].order[0]]
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            base = statistics.median([(await stream(client, mesh.url))[0] for _ in range(5)])
            if fault == "error":
                first.engine.config = StandinConfig(model="m", tokens=1, error=True)  # type: ignore[union-attr]
            else:
                first.kill()
            ttft = (await stream(client, mesh.url))[0]
        attempts = len(front.recent_routes()[-1]["attempts"])
        nursery.cancel_scope.cancel()
    return (ttft - base) * 1000, attempts


async def first_byte_retries(runs: int) -> None:
    """The retry's own cost: time to first token with a failed first choice, against the
    same mesh's healthy median [< 100 ms]."""
    for fault, name in (("error", "engine error"), ("refused", "connection refused")):
        results = [await one_retry(fault) for _ in range(runs)]
        added = [ms for ms, _ in results]
        retried = sum(1 for _, attempts in results if attempts >= 2)
        print(
            f"failure before the first byte ({name}), retried on the next node: added"
            f" median {statistics.median(added):.1f} ms, p99 {pct(added, 0.99):.1f} ms"
            f" ({retried} of {runs} requests made 2 attempts)  [< 100 ms]"
        )


def route_decisions() -> None:
    rng = random.Random(11)
    for n in (1_000, 10_000):
        view = [
            Candidate(
                node_id=f"{i:032x}", name=f"n{i}",
                state=rng.choice(["alive"] * 8 + ["suspect", "dead"]),
                draining=rng.random() < 0.05,
                models={f"model{j}": {"inflight": rng.randrange(5)}
                        for j in rng.sample(range(20), 3)},
                rtt=rng.random() / 100,
            )
            for i in range(n)
        ]  # fmt: skip
        reliability = {c.node_id: rng.random() for c in view[: n // 2]}
        times = []
        for _ in range(30):
            start = time.perf_counter()
            choose_route("model3", view, reliability, 0.25)
            times.append((time.perf_counter() - start) * 1000)
        print(
            f"route decision over {n:,} candidates: median {statistics.median(times):.2f} ms,"
            f" p99 {pct(times, 0.99):.2f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--role", choices=["serving", "front"], help=argparse.SUPPRESS)
    parser.add_argument("--to", help=argparse.SUPPRESS)
    parser.add_argument("--port-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "serving":
        trio.run(_serving_node, args.to, args.port_file)
        return
    if args.role == "front":
        trio.run(_front_node, int(args.to), args.port_file)
        return
    load = os.getloadavg()
    print(
        f"loopback, separate processes, a shared {os.cpu_count()}-core machine"
        f" (load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}): figures are noisy"
    )
    route_decisions()
    trio.run(overhead, args.runs)
    trio.run(failover_gaps, args.kills)
    trio.run(first_byte_retries, args.kills)
    load = os.getloadavg()
    print(f"load average after: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


if __name__ == "__main__":
    main()
