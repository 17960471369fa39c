"""A daemon's own start-up: CPU seconds and wall time from exec until its API answers.

    python benchmarks/startup.py [--runs 7]

Starts `populi-node up` alone on loopback (a prepared state dir, `--overlay none`,
kernel-chosen port), polls its unix socket until ``GET /v1/status`` answers, then reads
the process's own CPU time (user + system, all threads, from /proc) and its resident
memory, at that moment and again after `--settle` seconds. Prints the median of
`--runs` runs. Nothing else should be running: on a shared machine the wall time is
noisy (the CPU seconds much less so).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from populi_p2p.api import ApiClient, ApiError  # noqa: E402
from tests.node.harness import Mesh  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_run(state: Path, settle: float) -> tuple[float, float, float, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [
        sys.executable, "-m", "populi_p2p.cli", "up", "--state-dir", str(state),
        "--bind", "127.0.0.1", "--port", "0", "--overlay", "none", "--preset", "local",
    ]  # fmt: skip
    client = ApiClient(state / "api.sock", timeout=2.0)
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the daemon exited with {proc.returncode}")
            if client.socket_path.exists():
                try:
                    client.get("/v1/status")
                    break
                except ApiError:
                    pass
            time.sleep(0.002)
        wall = time.monotonic() - started
        cpu = cpu_seconds(proc.pid)
        time.sleep(settle)
        return wall, cpu, rss_mib(proc.pid), cpu_seconds(proc.pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        (state / "api.sock").unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before RSS is read")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Mesh(Path(tmp)).prepare("bench")
        one_run(state, 0.0)  # warm the page cache and the bytecode cache
        runs = [one_run(state, args.settle) for _ in range(args.runs)]
    wall, cpu, rss, cpu_later = (statistics.median(column) for column in zip(*runs, strict=True))
    print(f"runs                         {args.runs}")
    print(f"wall until the API answers   {wall:.3f} s (median)")
    print(f"CPU until the API answers    {cpu:.3f} s (median)")
    print(f"CPU after {args.settle:.0f} s               {cpu_later:.3f} s (median)")
    print(f"resident memory after {args.settle:.0f} s   {rss:.1f} MiB (median)")


if __name__ == "__main__":
    main()
