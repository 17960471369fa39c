"""Fetching a blob from 3 holders vs `curl` from one, on one machine, in the same run.

Starts 4 daemons on loopback; three `model add` the same file (default 2 GiB,
``--size``); the fourth pulls it (`POST /v1/blobs/pull`, verified chunks from the three
at once). The baseline is `curl` downloading the same file from one holder over plain
HTTP (Python's `http.server` serving the holder's blob file). Prints both speeds, the
ratio, the fetching daemon's peak RSS over its idle RSS while it fetched (sampled every
20 ms), the CPU seconds the fetcher and the holders spent, and curl and its server
(steadier than speeds on a loaded machine), and the load average. Goal (issue 21): at
least half curl's speed, at most 64 MiB extra memory.

    python benchmarks/blob_fetch.py [--size 2GiB] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _mesh import REPO, Mesh, wait_for

from populi_p2p.gpu._labels import parse_size


def _write(path: Path, size: int) -> str:
    block = os.urandom(1024 * 1024)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            piece = block[: min(left, len(block))]
            f.write(piece)
            h.update(piece)
            left -= len(piece)
            block = hashlib.sha256(block[:64]).digest() + block[32:]  # chunks differ
    return h.hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _curl(path: Path, out: Path) -> tuple[float, float]:
    """Seconds `curl` takes to download `path` from a local plain HTTP server, and the
    CPU seconds curl and the server spent (the server's start included)."""
    cpu_before = _children_cpu()
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", str(path.parent)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/{path.name}"
        wait_for(lambda: subprocess.run(["curl", "-sfI", url], capture_output=True).returncode
                 == 0, "http.server", 30, 0.1)  # fmt: skip
        start = time.monotonic()
        subprocess.run(["curl", "-sf", "-o", str(out), url], check=True)
        seconds = time.monotonic() - start
    finally:
        server.kill()
        server.wait()
    return seconds, _children_cpu() - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="2GiB", help="blob size (default 2GiB)")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the daemons")
    args = parser.parse_args()
    size = parse_size(args.size)
    root = Path(tempfile.mkdtemp(prefix="blob-bench-", dir=args.dir))
    mesh = Mesh(root, 4, "local", pace=False)
    try:
        src = root / "model.gguf"
        digest = _write(src, size)
        first = mesh.spawn(0, [])
        mesh.ready(first)
        for i in (1, 2, 3):
            mesh.ready(mesh.spawn(i, [first.address]))
        holders, fetcher = mesh.daemons[:3], mesh.daemons[3]
        for d in holders:
            d.client._timeout = 3600.0
            d.client.post("/v1/blobs/add", {"path": str(src), "name": "bench"})
        src.unlink()

        def seen() -> bool:
            rows = fetcher.client.get("/v1/blobs")["mesh"]
            return any(r["hash"] == digest and len(r["holders"]) == 3 for r in rows)

        wait_for(seen, "the fetcher to see 3 holders", 60, 0.1)
        curl_s, curl_cpu = _curl(holders[0].state / "blobs" / digest, root / "curl.out")
        (root / "curl.out").unlink()
        idle = fetcher.rss_mib()
        peak = idle
        cpu_before = [d.cpu_seconds() for d in mesh.daemons]
        start = time.monotonic()
        fetcher.client.post("/v1/blobs/pull", {"blob": digest})
        verifying = None  # when the last chunk was in (the whole hash's tail began)
        while True:
            row = fetcher.client.get(f"/v1/blobs/progress?blob={digest}")
            peak = max(peak, fetcher.rss_mib())
            if row["state"] in ("verifying", "done") and verifying is None:
                verifying = time.monotonic()
            if row["state"] in ("done", "failed"):
                break
            time.sleep(0.02)
        fetch_s = time.monotonic() - start
        tail_s = fetch_s - ((verifying or start) - start)
        cpu = [d.cpu_seconds() - b for d, b in zip(mesh.daemons, cpu_before, strict=True)]
        if row["state"] != "done":
            raise SystemExit(f"the fetch failed: {row['error']}")
        served = {h[:8]: s["served"] for h, s in row["holders"].items()}
        mib = size / 2**20
        print(f"blob: {mib:.0f} MiB, {row['chunks']} chunks; chunks served per holder {served}")
        print(f"curl, 1 holder, plain HTTP:        {mib / curl_s:8.1f} MiB/s ({curl_s:.2f} s)")
        print(f"populi, 3 holders, signed+checked: {mib / fetch_s:8.1f} MiB/s ({fetch_s:.2f} s,"
              f" whole hash included, {tail_s:.2f} s of it after the last chunk)")  # fmt: skip
        print(f"ratio populi/curl: {curl_s / fetch_s:.2f} (goal >= 0.5)")
        print(f"fetcher RSS: idle {idle:.1f} MiB, peak {peak:.1f} MiB, extra {peak - idle:.1f}"
              " MiB (goal <= 64)")  # fmt: skip
        gib = size / 2**30
        print(f"CPU seconds in the fetch: fetcher {cpu[3]:.2f}, holders {sum(cpu[:3]):.2f}"
              f" ({(cpu[3] + sum(cpu[:3])) / gib:.2f} s per GiB in all); curl and"
              f" http.server {curl_cpu:.2f} ({curl_cpu / gib:.2f} s per GiB)")  # fmt: skip
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
              f" on {os.cpu_count()} CPUs")  # fmt: skip
    finally:
        mesh.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.chdir(REPO)
    main()
