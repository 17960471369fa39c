"""Inference relay benchmark: what routing through the mesh costs over calling the
engine directly. Printed, not asserted (targets from issue 11 in brackets):

* added time to first token, median and p99 [< 5 ms]: a streamed chat completion of
  one token, straight to the stand-in engine vs through an accepting node that relays
  to the serving node's peer API (signed call) which calls its engine;
* added latency per token, median and p99 [< 0.2 ms]: a 400-token stream with no
  engine delay, (relayed - direct) / tokens, per run;
* relayed tokens per second through one node [>= 5,000];
* stream gap after the serving node is killed mid-stream, median and p99 [< 2 s]:
  the time between the last token before and the first token after the kill (the
  kill cancels the node's engine and peer API at once: sockets reset, no goodbye;
  the stand-in's prefill is ~0, so this is the relay's own failover time);
* route decision time over 1,000 and 10,000 candidate records.

Everything (engines, nodes, client) runs in one process on loopback, on one core:
figures include the client's own parsing and are an upper bound on the relay's cost.

Usage::

    python benchmarks/inference_bench.py            # everything
    python benchmarks/inference_bench.py --runs 50  # fewer runs, faster
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from populi_p2p.identity import NodeIdentity
from populi_p2p.inference.route import Candidate, choose_route
from populi_p2p.inference.standin import StandinConfig
from tests.inference.conftest import ALICE, AUTHORITY, BOB, CERTS, NOW
from tests.inference.harness import Mesh

CAROL = NodeIdentity.from_seed(b"c" * 32)
CERTS.setdefault(CAROL.node_id, AUTHORITY.enroll(CAROL.public_key, now=NOW - 60, serial=7).raw)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def stream(
    client: httpx.AsyncClient, url: str, on_token: Any = None
) -> tuple[float, float, int]:
    """(time to first token, total, tokens) of one streamed chat completion."""
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}
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


async def overhead(runs: int) -> None:
    async with trio.open_nursery() as nursery:
        results: dict[str, list[tuple[float, float, int]]] = {}
        for label, tokens in (("ttft", 1), ("tokens", 400)):
            mesh = Mesh()
            serving = await mesh.add_serving(
                nursery, ALICE, "alice", StandinConfig(model="m", tokens=tokens)
            )
            await mesh.start_front(nursery, CAROL)
            engine_url = serving.engine_url
            async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
                for _ in range(5):  # warm connections
                    await stream(client, engine_url)
                    await stream(client, mesh.url)
                direct, relayed = [], []
                for _ in range(runs):
                    direct.append(await stream(client, engine_url))
                    relayed.append(await stream(client, mesh.url))
            results[label + ".direct"] = direct
            results[label + ".relayed"] = relayed
            serving.kill()
        ttft_d = [r[0] for r in results["ttft.direct"]]
        ttft_r = [r[0] for r in results["ttft.relayed"]]
        added = [(r - d) * 1000 for d, r in zip(ttft_d, ttft_r, strict=True)]
        print(
            f"time to first token: direct median {statistics.median(ttft_d) * 1000:.2f} ms,"
            f" relayed median {statistics.median(ttft_r) * 1000:.2f} ms"
        )
        print(f"  added: median {statistics.median(added):.2f} ms,"
              f" p99 {pct(added, 0.99):.2f} ms  [< 5 ms]")  # fmt: skip
        per_tok = [
            ((r[1] - r[0]) - (d[1] - d[0])) / max(1, r[2] - 1) * 1000
            for d, r in zip(results["tokens.direct"], results["tokens.relayed"], strict=True)
        ]
        print(
            f"added per token: median {statistics.median(per_tok):.4f} ms,"
            f" p99 {pct(per_tok, 0.99):.4f} ms  [< 0.2 ms]"
        )
        rates = [r[2] / r[1] for r in results["tokens.relayed"]]
        direct_rates = [d[2] / d[1] for d in results["tokens.direct"]]
        print(
            f"relayed tokens/s: median {statistics.median(rates):,.0f}"
            f" (direct {statistics.median(direct_rates):,.0f})  [>= 5,000]"
        )
        nursery.cancel_scope.cancel()


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
    args = parser.parse_args()
    print("(one process, loopback, a shared machine: figures are noisy)")
    route_decisions()
    trio.run(overhead, args.runs)
    trio.run(failover_gaps, args.kills)


if __name__ == "__main__":
    main()
