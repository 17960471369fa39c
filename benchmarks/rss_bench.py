"""Resident memory: the interpreter's floor, what each library adds, an idle daemon by feature.

    python benchmarks/rss_bench.py [--runs 3] [--settle 5]

Two tables, each row the median of `--runs` fresh processes (VmRSS from /proc):

- the libraries: ``python -c pass``, then Python with trio (the floor of any populi
  process), then trio plus each library the daemon may import, alone (the "adds"
  column is over the trio row), then populi's own modules: those `populi-node up`
  imports before its API answers, and those it imports after (the peer API, blobs,
  artifacts, task logs);
- the daemon, idle `--settle` seconds after ``GET /v1/status`` first answers, on
  loopback with ``--overlay none``: a plain member, with ``--api-listen``, with
  ``--engine`` (a stand-in engine, `populi_p2p.testing.standin`). Anonymous and
  file-backed memory are shown apart: the file-backed part (libpython, libcrypto,
  libsqlite3...) is shared with every other process that maps the same files.

Bytecode caches are written (PYTHONDONTWRITEBYTECODE is dropped for the children) and a
warm-up run goes first: an interpreter that compiles from source ends a few MiB larger,
which is not what an installed daemon does. Prints the load average before and after.
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from populi_p2p.api import ApiClient, ApiError  # noqa: E402
from tests.node.harness import Mesh  # noqa: E402

#: Each library as the daemon imports it (the modules it names, not only the package).
LIBRARIES: dict[str, str] = {
    "attrs": "import attrs",
    "msgpack": "import msgpack",
    "pynacl": "import nacl.signing, nacl.public, nacl.bindings",
    "sqlite3": "import sqlite3",
    "h11": "import h11",
    "hypercorn (h11 + h2 + wsproto)": (
        "import hypercorn.config, hypercorn.app_wrappers, hypercorn.trio.tcp_server"
    ),
    "httpx": "import httpx",
    "zeroconf (--mdns)": "import zeroconf",
    "prometheus_client (first /metrics)": "import prometheus_client",
    "pynvml (an NVIDIA driver)": "import pynvml",
    "platformdirs": "import platformdirs",
}
#: What `populi-node up` imports before its API answers, and after (`Node._start_http`).
POPULI_EARLY = "import populi_p2p.cli, populi_p2p.node"
POPULI_LATE = (
    "import populi_p2p.services.inference_host, populi_p2p.executor.logs,"
    " populi_p2p.blobs.service, populi_p2p.artifacts.service"
)
MEASURE = (
    "import re; s = open('/proc/self/status').read();"
    " print(int(re.search(r'VmRSS:\\s+(\\d+)', s).group(1)))"
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(REPO)
    return env


def import_rss(code: str, runs: int) -> float:
    """Median VmRSS (MiB) of a fresh interpreter that ran `code`."""
    found = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", f"{code}\n{MEASURE}"], env=_env(), cwd=REPO,
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        found.append(int(out.stdout.split()[-1]) / 1024)
    return statistics.median(found)


def status_mib(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon, RssFile (MiB) and the thread count of `pid`."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
        elif key == "Threads":
            out[key] = int(value)
    return out


def idle_daemon(state: Path, extra: list[str], settle: float) -> dict[str, float]:
    """A daemon's memory `settle` seconds after its API first answers."""
    argv = [
        sys.executable, "-m", "populi_p2p.cli", "up", "--state-dir", str(state),
        "--bind", "127.0.0.1", "--port", "0", "--overlay", "none", "--preset", "local", *extra,
    ]  # fmt: skip
    client = ApiClient(state / "api.sock", timeout=2.0)
    proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                error = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
                raise SystemExit(f"the daemon did not answer (exit {proc.returncode}): {error}")
            if client.socket_path.exists():
                try:
                    client.get("/v1/status")
                    break
                except ApiError:
                    pass
            time.sleep(0.01)  # polling another process's socket: no event to await
        time.sleep(settle)  # idle is what is measured
        return status_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        (state / "api.sock").unlink(missing_ok=True)


@contextmanager
def standin_engine(tmp: Path) -> Iterator[str]:
    """A stand-in engine on loopback; its URL."""
    port_file = tmp / "engine-port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "populi_p2p.testing.standin", "--port", "0",
         "--model", "m", "--port-file", str(port_file)],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the stand-in engine did not start")
            time.sleep(0.02)  # polling a file another process writes
        yield f"http://127.0.0.1:{int(port_file.read_text())}"
    finally:
        proc.kill()
        proc.wait()


def library_table(runs: int) -> None:
    python = import_rss("pass", runs)
    trio = import_rss("import trio", runs)
    print("| what | RSS MiB | adds MiB |")
    print("|---|---|---|")
    print(f"| `python -c pass` | {python:.1f} | |")
    print(f"| python + trio (the floor) | {trio:.1f} | {trio - python:+.1f} over python |")
    for name, code in LIBRARIES.items():
        rss = import_rss(f"import trio\n{code}", runs)
        print(f"| trio + {name} | {rss:.1f} | {rss - trio:+.1f} |")
    early = import_rss(POPULI_EARLY, runs)
    late = import_rss(f"{POPULI_EARLY}\n{POPULI_LATE}", runs)
    print(f"| populi before the API answers (`{POPULI_EARLY[7:]}`) | {early:.1f} |"
          f" {early - trio:+.1f} over trio |")  # fmt: skip
    print(f"| + populi after it (peer API, blobs, artifacts, task logs) | {late:.1f} |"
          f" {late - early:+.1f} |")  # fmt: skip


def daemon_table(runs: int, settle: float) -> None:
    print("| daemon, idle | RSS MiB | anonymous | file-backed | threads |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        state = Mesh(tmp).prepare("rss")
        idle_daemon(state, [], 0.0)  # warm-up: bytecode caches, page cache
        with standin_engine(tmp) as engine:
            features = {
                "plain member": [],
                "--api-listen 127.0.0.1:0": ["--api-listen", "127.0.0.1:0"],
                "--engine (a stand-in)": ["--engine", engine],
            }
            for name, extra in features.items():
                rows = [idle_daemon(state, extra, settle) for _ in range(runs)]
                med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
                print(f"| {name} | {med['VmRSS']:.1f} | {med['RssAnon']:.1f} |"
                      f" {med['RssFile']:.1f} | {med['Threads']:.0f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--settle", type=float, default=5.0, help="idle seconds before reading")
    parser.add_argument("--only", choices=("libraries", "daemon"), help="one table only")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"python {sys.version.split()[0]}, {args.runs} runs per row (median)\n")
    if args.only != "daemon":
        import_rss("import trio\n" + POPULI_EARLY + "\n" + POPULI_LATE, 1)  # warm-up
        library_table(args.runs)
        print()
    if args.only != "libraries":
        daemon_table(args.runs, args.settle)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
