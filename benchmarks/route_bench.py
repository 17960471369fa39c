"""Routing and relay on full daemons: how load spreads, and what the relay adds to the
time to first token. Printed, not asserted (issue 21's targets in brackets).

Real `populi-node up` processes on loopback (`tests.node.harness.Mesh`) and stand-in
engine processes; the client is this process.

* **split**: 16 concurrent streams through an accepting daemon that serves nothing,
  over two serving daemons with equal engines [no worse than 10/6], then over two
  whose engines differ in capacity 2:1 (stand-in ``--slots``) [follows capacity];
* **ttft**: a streamed one-token chat completion, straight to the serving node's engine
  and through the accepting daemon (public API, route, signed peer call to the serving
  daemon, its engine), alternated sample by sample in the same run [added: median
  <= 2 ms, p99 <= 5 ms], and the CPU each daemon spends per request (``/proc``), its
  background work measured apart while idle. By default the engine answers at once
  with one token (the worst case: its end, and the serving daemon's relay of it, run
  while the accepting daemon forwards the token, on the same cores);
  ``--ttft-tokens 8 --engine-delay 0.02`` asks for 8 tokens from an engine that takes
  20 ms a token, as a GPU engine does. ``--profile DIR`` runs both daemons
  under cProfile and prints the top entries of each; ``--sample DIR`` records them
  with py-spy (``pip install py-spy``; raw stacks, one file per daemon). Either
  inflates the figures of its run.

The machine's load average is printed before and after: on a shared machine the wall
figures are noisy upper bounds.

Usage::

    python benchmarks/route_bench.py                 # split and ttft
    python benchmarks/route_bench.py --only ttft --runs 500
    python benchmarks/route_bench.py --only ttft --runs 500 --ttft-tokens 8 --engine-delay 0.02
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.node.harness import LOOPBACK, REPO, Daemon, Mesh, wait_until

BODY: dict[str, Any] = {
    "model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}],
}  # fmt: skip


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} {five:.1f} {fifteen:.1f} ({os.cpu_count()} cores)"


########################################################################################
# Processes


def engine(tmp: Path, name: str, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / f"{name}.port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "populi_p2p.testing.standin", "--port", "0",
         "--port-file", str(port_file), "--model", "m", *flags],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    port = wait_until(lambda: port_file.exists() and port_file.read_text(), 20, f"{name} up")
    return proc, f"http://127.0.0.1:{port}"


def spawn(mesh: Mesh, name: str, flags: Sequence[str], profile: Path | None) -> Daemon:
    """`mesh.start`, under cProfile when `profile` is a directory."""
    if profile is None:
        return mesh.start(name, *flags)
    state = mesh.prepare(name)
    log = mesh.root / f"{name}.log"
    argv = [
        sys.executable, "-m", "cProfile", "-o", str(profile / f"{name}.prof"),
        "-m", "populi_p2p.cli", "up", "--state-dir", str(state), "--name", name,
        *LOOPBACK, "--preset", mesh.preset, *flags,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    daemon = Daemon(name, state, proc, log)
    mesh.daemons.append(daemon)
    return mesh.ready(daemon)


@contextmanager
def daemons(
    engine_flags: Sequence[Sequence[str]], profile: Path | None = None
) -> Iterator[tuple[str, dict[str, str], dict[str, str], list[Daemon]]]:
    """(accepting node's API URL, engine URL by serving node id, name by node id,
    [serving daemons..., accepting daemon]) with every process up and the model
    routable from the accepting node."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        mesh = Mesh(tmp)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            urls, serving = [], []
            for i, flags in enumerate(engine_flags):
                proc, url = engine(tmp, f"e{i}", *flags)
                procs.append(proc)
                urls.append(url)
            for i, url in enumerate(urls):
                seed = ("--bootstrap", serving[0].address) if serving else ()
                flags = ("--peer-port", "0", "--engine", url, *seed)
                serving.append(spawn(mesh, f"s{i}", flags, profile))
            front = spawn(
                mesh, "front",
                ("--peer-port", "0", "--api-listen", "127.0.0.1:0", "--bootstrap",
                 serving[0].address), profile,
            )  # fmt: skip
            port = front.client.get("/v1/inference/requests")["listening"]
            api = f"http://127.0.0.1:{port}"

            def routable() -> bool:
                data = httpx.get(api + "/v1/models", trust_env=False, timeout=5).json()["data"]
                return any(m["id"] == "m" and len(m["nodes"]) == len(urls) for m in data)

            wait_until(routable, 60, "the model at the accepting node")
            by_node = {d.node_id: u for d, u in zip(serving, urls, strict=True)}
            names = {d.node_id: d.name for d in serving}
            yield api, by_node, names, [*serving, front]
        finally:
            if profile is not None:
                for d in mesh.daemons:
                    d.terminate()
                for d in mesh.daemons:
                    with_timeout(d)
            mesh.stop_all()
            for proc in procs:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)


def with_timeout(d: Daemon) -> None:
    try:
        d.wait_exit(30)
    except subprocess.TimeoutExpired:
        print(f"{d.name} did not exit on SIGTERM; its profile is lost", file=sys.stderr)


########################################################################################
# Measures


async def one_stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[float, str, int]:
    """(time to first token, x-populi-node, tokens) of one streamed chat completion."""
    start = time.perf_counter()
    first = 0.0
    tokens = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        node = r.headers.get("x-populi-node", "")
        async for line in r.aiter_lines():
            chunk = json.loads(line[6:]) if line.startswith("data: {") else None
            if chunk is not None and chunk["choices"][0]["delta"].get("content"):
                tokens += 1
                if tokens == 1:
                    first = time.perf_counter() - start
    return first, node, tokens


async def split(api: str, names: dict[str, str], streams: int) -> Counter[str]:
    """Where `streams` concurrent streams went (by serving node name)."""
    counts: Counter[str] = Counter()
    async with httpx.AsyncClient(
        timeout=60, trust_env=False, limits=httpx.Limits(max_connections=streams * 2)
    ) as client:

        async def one() -> None:
            _, node, tokens = await one_stream(client, api, BODY)
            counts[names.get(node, node or "failed") if tokens else "failed"] += 1

        async with trio.open_nursery() as nursery:
            for _ in range(streams):
                nursery.start_soon(one)
    return counts


def run_split(streams: int, tries: int) -> None:
    cases = [
        ("two equal nodes (4 slots each)", [("--slots", "4"), ("--slots", "4")], "10/6"),
        ("capacity 2:1 (8 and 4 slots)", [("--slots", "8"), ("--slots", "4")], "about 11/5"),
    ]
    for label, flags, target in cases:
        engine_flags = [("--tokens", "40", "--delay", "0.02", *f) for f in flags]
        with daemons(engine_flags) as (api, _, names, _):
            splits = []
            for _ in range(tries):
                counts = trio.run(split, api, names, streams)
                splits.append(
                    "/".join(str(counts.get(n, 0)) for n in sorted(names.values()))
                    + (f" ({counts['failed']} failed)" if counts["failed"] else "")
                )
        print(f"{streams} concurrent streams, {label}: s0/s1 = {', '.join(splits)}  [{target}]")


async def ttft(
    api: str, engines: dict[str, str], runs: int, tokens: int
) -> tuple[list[float], list[float]]:
    """(direct, relayed) time to first token, seconds, alternated per sample."""
    body = {**BODY, "max_tokens": tokens}
    direct, relayed = [], []
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        for _ in range(10):  # warm both paths' connections
            _, node, _ = await one_stream(client, api, body)
            await one_stream(client, engines[node], body)
        for _ in range(runs):
            first, node, _ = await one_stream(client, api, body)
            relayed.append(first)
            direct.append((await one_stream(client, engines[node], body))[0])
    return direct, relayed


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_ttft(
    runs: int, profile: Path | None, sample: Path | None, tokens: int, delay: float
) -> None:
    print(f"ttft: {tokens} token(s) a request, the engine taking {delay * 1000:g} ms a token")
    flags = ("--tokens", "400", "--delay", str(delay))
    with daemons([flags], profile) as (api, engines, _, procs):
        idle = [cpu_seconds(d.proc.pid) for d in procs]
        time.sleep(3.0)  # the daemons' own background work, to tell it apart
        before = [cpu_seconds(d.proc.pid) for d in procs]
        idle_ms = [(b - i) / 3.0 for i, b in zip(idle, before, strict=True)]
        samplers = [] if sample is None else [
            subprocess.Popen(["py-spy", "record", "--pid", str(d.proc.pid), "--rate", "2000",
                              "--format", "raw", "--nonblocking", "-o",
                              str(sample / f"{d.name}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for d in procs
        ]  # fmt: skip
        start = time.monotonic()
        direct, relayed = trio.run(ttft, api, engines, runs, tokens)
        elapsed = time.monotonic() - start
        after = [cpu_seconds(d.proc.pid) for d in procs]
        for sampler in samplers:
            sampler.send_signal(signal.SIGINT)
            sampler.wait(timeout=30)
        cpu = [(a - b) / runs * 1000 for a, b in zip(after, before, strict=True)]
    added = [(r - d) * 1000 for d, r in zip(direct, relayed, strict=True)]
    print(
        f"time to first token over {runs} samples: direct median"
        f" {statistics.median(direct) * 1000:.2f} ms, through the accepting daemon median"
        f" {statistics.median(relayed) * 1000:.2f} ms"
    )
    print(
        f"  added: median {statistics.median(added):.2f} ms, p99 {pct(added, 0.99):.2f} ms"
        "  [median <= 2 ms, p99 <= 5 ms]" + ("  (under cProfile)" if profile else "")
    )
    idle_share = [ms * elapsed / runs * 1000 for ms in idle_ms]
    print(
        f"  CPU per relayed request: serving daemon {cpu[0]:.2f} ms, accepting daemon"
        f" {cpu[-1]:.2f} ms, of which background work (as measured idle) {idle_share[0]:.2f}"
        f" and {idle_share[-1]:.2f} ms"
    )
    if profile is not None:
        for name in ("front", "s0"):
            path = profile / f"{name}.prof"
            if path.exists():
                print(f"--- cProfile of {name} (tottime) ---")
                pstats.Stats(str(path)).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["split", "ttft"])
    parser.add_argument("--runs", type=int, default=300, help="TTFT samples")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tries", type=int, default=4, help="split tries per case")
    parser.add_argument("--ttft-tokens", type=int, default=1, help="tokens a TTFT request asks")
    parser.add_argument(
        "--engine-delay", type=float, default=0.0, help="the TTFT engine's seconds a token"
    )
    parser.add_argument("--profile", type=Path, help="cProfile the daemons into DIR")
    parser.add_argument(
        "--sample", type=Path, help="sample the daemons with py-spy (raw stacks) into DIR"
    )
    args = parser.parse_args()
    print(f"loopback, real daemons, stand-in engines; {load_line()}")
    if args.only in (None, "split"):
        run_split(args.streams, args.tries)
    if args.only in (None, "ttft"):
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
        if args.sample is not None:
            args.sample.mkdir(parents=True, exist_ok=True)
        run_ttft(args.runs, args.profile, args.sample, args.ttft_tokens, args.engine_delay)
    print(f"after: {load_line()}")


if __name__ == "__main__":
    main()
