"""Deployments: from ``deploy`` to the first token, and a replica's replacement after
its owner's kill -9, on real daemons on one machine.

    python benchmarks/deploy_bench.py [--size 256MiB] [--engine standin] [--runs 3]

Three daemons (preset ``local``): ``h`` holds the model blob and accepts requests
(``--api-listen``) but is drained, so the replica is placed on ``s1`` or ``s2`` and
fetches the blob from ``h`` (the blob on one other node). Each run:

1. **deploy to first token**: ``POST /v1/deploy`` (1 replica), then at once a streamed
   request to ``h``, which waits while the replica fetches and loads
   (``--load-wait``); the time from the deploy call to the first token. The owner's
   fetch (``deploy.serving`` minus the start in its log is not parsed: the fetch
   alone is the blob service's ``blob.fetched``) is reported beside it;
2. **replacement**: kill -9 the replica's owner; streamed requests to ``h`` again
   (each waits for a replica); the time from the kill to the first token served by
   the other node, which must detect the death (SWIM), wait out the lease
   (``lease_ttl`` x ``clock_margin``), fetch the blob from ``h`` and load it.

The engine is the stand-in (``--engine standin``: it reads the whole model file, as a
real engine loads it) unless another is named. With ``--engine llama-server``, each
replica runs llama.cpp's ``llama-server`` (``make engine``) on the tiny model
(`populi_p2p.testing.tiny_gguf`, seed 23) padded with zeros to ``--size`` (llama.cpp
ignores bytes after the tensors): the fetch moves the whole blob, the engine maps the
file and loads the tiny model's tensors, and the first token is the engine's own.
Prints each run, the medians and the load average.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from populi_p2p.api import ApiError
from populi_p2p.gpu._labels import parse_size
from populi_p2p.presets import resolve_preset
from tests.node.harness import Daemon, Mesh, wait_until


def _write(path: Path, size: int, engine: str) -> None:
    if engine != "standin":  # a real engine: a model it loads, padded to `size`
        from populi_p2p.testing.tiny_gguf import write_tiny_llama

        write_tiny_llama(path, seed=23)
        with open(path, "ab") as f:
            f.truncate(max(size, path.stat().st_size))
        return
    with open(path, "wb") as f:
        block = hashlib.sha256(b"deploy-bench").digest() * (1 << 15)  # 1 MiB
        for _ in range(size // len(block)):
            f.write(block)
        f.write(block[: size % len(block)])


#: Each server's flags, to restart it after its kill.
FLAGS: dict[str, tuple[str, ...]] = {}


class _Refused(Exception):
    """A request answered with an error before its first token."""


def _first_token(port: int, timeout: float = 300.0) -> tuple[float, str]:
    """Seconds until the first token of a streamed request, and the serving node."""
    body = {"model": "bench", "stream": True, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    began = time.monotonic()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=timeout) as r:
        if r.status_code != 200:
            raise _Refused(f"request failed: {r.status_code} {r.read()[:300]!r}")
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                return time.monotonic() - began, r.headers.get("x-populi-node", "")
    raise SystemExit("the stream ended without a token")


def _owner(h: Daemon) -> str | None:
    data = h.client.get("/v1/deployments")["deployments"]
    rows = [r for d in data if d["name"] == "bench" for r in d["replicas"]
            if r["state"] == "serving"]  # fmt: skip
    return rows[0]["node_id"] if rows else None


def _run(mesh: Mesh, h: Daemon, servers: list[Daemon], port: int) -> tuple[float, float]:
    began = time.monotonic()
    h.client.post("/v1/deploy", {"model": "bench", "replicas": 1})
    _ttft, _node = _first_token(port)
    deploy_s = time.monotonic() - began
    owner = wait_until(lambda: _owner(h), 30, "the owner to be listed")
    victim = next(d for d in servers if d.node_id == owner)
    killed = time.monotonic()
    victim.kill()
    while True:  # requests until one is served by the replacement
        try:
            _ttft, node = _first_token(port)
        except _Refused:  # the dead owner was still listed: a client retries
            time.sleep(0.05)
            continue
        if node and node != owner:
            break
    replace_s = time.monotonic() - killed
    h.client.post("/v1/undeploy", {"name": "bench"})
    # The killed node comes back empty-handed (its copy of the blob removed) for the next run.
    shutil.rmtree(victim.state_dir / "blobs", ignore_errors=True)
    again = mesh.start(victim.name, *FLAGS[victim.name], state=victim.state_dir)
    servers[servers.index(victim)] = again
    for d in servers:  # the survivor's copy goes too: every run fetches from h
        wait_until(lambda d=d: _dropped(d), 60, f"{d.name} to drop its copy")
    return deploy_s, replace_s


def _dropped(d: Daemon) -> bool:
    """True once `d` holds no copy (removed here once its replica's pin is gone)."""
    try:
        if not any(r["name"] == "bench" for r in d.client.get("/v1/blobs")["local"]):
            return True
        d.client.post("/v1/blobs/rm", {"blob": "bench"})
    except ApiError:  # still starting, or still pinned by the stopping replica
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256MiB", help="model blob size (default 256MiB)")
    parser.add_argument("--engine", default="standin", help="--deploy-engine (default standin)")
    parser.add_argument("--runs", type=int, default=3, help="runs (default 3)")
    args = parser.parse_args()
    size = parse_size(args.size)
    root = Path(tempfile.mkdtemp(prefix="deploy-bench-"))
    mesh = Mesh(root)
    as_root = ("--task-user", "root") if os.geteuid() == 0 else ()
    flags = ("--peer-port", "0", "--deploy-engine", args.engine, "--load-wait", "300", *as_root)
    try:
        h = mesh.start("h", *flags, "--api-listen", "0")
        servers = []
        for name in ("s1", "s2"):
            d = mesh.start(name, *flags, "--bootstrap", h.address)
            FLAGS[name] = (*flags, "--bootstrap", h.address)
            servers.append(d)
        model = root / "bench.gguf"
        _write(model, size, args.engine)
        h.client._timeout = 600.0
        h.client.post("/v1/blobs/add", {"path": str(model), "name": "bench"})
        h.client.post("/v1/drain", {"handoff": False})
        port = int(h.client.get("/v1/inference/requests")["listening"])
        ids = {d.node_id for d in (h, *servers)}
        wait_until(lambda: all({m["node_id"] for m in d.members()} >= ids for d in servers),
                   30, "the mesh to form")  # fmt: skip
        lease = resolve_preset("local").lease
        print(
            f"blob {size / 2**20:.0f} MiB on h only; engine {args.engine}; preset local"
            f" (lease_ttl {lease.lease_ttl:g} s x clock_margin {lease.clock_margin:g})"
        )
        deploys, replaces = [], []
        for i in range(args.runs):
            deploy_s, replace_s = _run(mesh, h, servers, port)
            deploys.append(deploy_s)
            replaces.append(replace_s)
            print(
                f"run {i + 1}: deploy to first token {deploy_s:6.2f} s;"
                f" kill -9 to first token from the replacement {replace_s:6.2f} s"
            )
            wait_until(lambda: not any(d["replicas"] and any(r["state"] != "stopped"
                       for r in d["replicas"]) for d in h.client.get("/v1/deployments")
                       ["deployments"]), 60, "the undeploy")  # fmt: skip
            ids = {d.node_id for d in (h, *servers)}
            wait_until(lambda ids=ids: all(
                {m["node_id"] for m in d.members() if m["state"] == "alive"} >= ids - {d.node_id}
                for d in (h, *servers)), 60, "the mesh to heal")  # fmt: skip
        print(json.dumps({"deploy_to_first_token_s": round(statistics.median(deploys), 2),
                          "replacement_s": round(statistics.median(replaces), 2)}))  # fmt: skip
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
              f" on {os.cpu_count()} CPUs")  # fmt: skip
    finally:
        mesh.stop_all()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
