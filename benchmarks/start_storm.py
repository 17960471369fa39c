"""N daemons started at once on loopback: how long until every API answers, how long
until everyone sees everyone alive, and what the logs said meanwhile.

    python benchmarks/start_storm.py --n 100 [--preset lan] [--base-port 27000] [--hold 15]
        [--keep DIR [--trace]]

Every daemon gets fixed ports (swim on `--base-port` + 2i, its peer API on the next
one: the default peer port is the swim port + 1, which would race the next daemon's
bind) and bootstraps through daemons 0 and 1, so all can be exec'd in the same instant.

Times come from the daemons' own log lines (millisecond stamps), not from polling their
APIs: on 2 cores, polling 100 APIs in a loop costs the starved daemons more CPU than
their membership does, and blurs what it measures. Reported:

* every API answers: the last `node.ready` line (logged once the API socket serves);
  one status call per daemon afterwards confirms it;
* all see N alive: the first moment at which every daemon's log, replayed (joined and
  recovered: alive; suspected, failed, left: not), has all N-1 others alive;
* whether that still holds `--hold` seconds later (replayed again, and one status
  call per daemon);
* at convergence, from one status call per daemon: the state exchanges (push-pulls,
  joins included) the two seeds and the others answered, and the join attempts made;
* counted over the whole run (to the end of the hold): `member.suspect`,
  `member.dead`, `self.refuted` and `udp.blocked` lines (none of them is true here:
  nothing fails and nothing blocks UDP), and those after the first convergence.

With `--trace` every daemon also writes a packet trace (`populi_p2p._trace`), copied
into `--keep`'s directory; `benchmarks/storm_trace.py DIR` then says where news waited.

The daemons run from compiled bytecode, as an installed package does: the sources are
compiled into their `__pycache__` before the storm (an interpreter reads bytecode even
under `PYTHONDONTWRITEBYTECODE`, which only stops it writing). Without that, where
`PYTHONDONTWRITEBYTECODE` is set, each of the N interpreters compiles every module of
the node itself, about a third of its start-up CPU, and the storm measures the compiler.

A daemon that exits ends the run with its log. Every daemon is SIGKILLed on the way
out. Printed, not asserted; on a shared machine the times are noisy.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from populi_p2p._trace import TRACE_DIR_ENV  # noqa: E402
from populi_p2p.api import ApiClient, ApiError  # noqa: E402
from tests.node.harness import Mesh  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from _mesh import CLOCK_TICKS, log_events  # noqa: E402

COUNTED = ("member.suspect", "member.dead", "self.refuted", "udp.blocked")
_ALIVE = ("member.joined", "member.recovered")
_NOT_ALIVE = ("member.suspect", "member.dead", "member.left")


def parse(path: Path) -> list[tuple[float, str, dict[str, str]]]:
    """(unix time, event, fields) for each structured line of a daemon log."""
    return log_events(path.read_text(errors="replace"))


def first_convergence(logs: list[list[tuple[float, str, dict[str, str]]]], n: int) -> float | None:
    """The first time at which every daemon sees the n-1 others alive, from the logs."""
    # Ties (one millisecond) keep each log's own order: sorting them by event name put
    # a "recovered" before the "suspected" logged just ahead of it, and missed the
    # convergence of a run whose every daemon ended seeing all alive.
    merged = sorted(
        (t, i, k, ev, f.get("id", ""))
        for i, log in enumerate(logs)
        for k, (t, ev, f) in enumerate(log)
    )
    alive: list[set[str]] = [set() for _ in logs]
    full = 0
    for t, i, _, ev, node_id in merged:
        before = len(alive[i]) == n - 1
        if ev in _ALIVE:
            alive[i].add(node_id)
        elif ev in _NOT_ALIVE:
            alive[i].discard(node_id)
        else:
            continue
        after = len(alive[i]) == n - 1
        full += after - before
        if full == len(logs):
            return t
    return None


def meshes(logs: list[list[tuple[float, str, dict[str, str]]]]) -> list[int]:
    """Sizes of the meshes the daemons form, from the logs (largest first): two daemons
    are in one mesh when either sees the other alive. One entry: one mesh."""
    own = [next((f.get("id", "") for _, ev, f in log if ev == "node.ready"), "") for log in logs]
    index = {node_id: i for i, node_id in enumerate(own) if node_id}
    parent = list(range(len(logs)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, log in enumerate(logs):
        alive: set[str] = set()
        for _, ev, f in log:
            if ev in _ALIVE:
                alive.add(f.get("id", ""))
            elif ev in _NOT_ALIVE:
                alive.discard(f.get("id", ""))
        for node_id in alive:
            if node_id in index:
                parent[root(i)] = root(index[node_id])
    sizes: dict[int, int] = {}
    for i in range(len(logs)):
        sizes[root(i)] = sizes.get(root(i), 0) + 1
    return sorted(sizes.values(), reverse=True)


class CpuSampler:
    """Samples the daemons' CPU seconds (user + system, from /proc) every `interval`, in
    a thread, so the report can say how busy they were between two moments."""

    def __init__(self, pids: list[int], interval: float = 0.25) -> None:
        self._pids = pids
        self._interval = interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _cpu(self) -> float:
        total = 0
        for pid in self._pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / CLOCK_TICKS

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.samples.append((time.time(), self._cpu()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> float:
        """CPU seconds the daemons used from `start` to `end` (nearest samples)."""

        def at(when: float) -> float:
            return min(self.samples, key=lambda s: abs(s[0] - when))[1]

        return at(end) - at(start) if self.samples else float("nan")


def _compile_sources() -> None:
    """Compile the repository's packages into their `__pycache__` (git ignores them)."""
    for package in ("swim", "overlay", "populi_p2p"):
        compileall.compile_dir(REPO / package, quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--preset", choices=("lan", "wan", "local"), default="lan")
    parser.add_argument("--base-port", type=int, default=27000)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--hold", type=float, default=15.0, help="seconds watched after")
    parser.add_argument(
        "--keep", type=Path, default=None, help="copy the daemons' logs into this directory"
    )
    parser.add_argument(
        "--trace", action="store_true", help="packet traces too, into --keep's directory"
    )
    args = parser.parse_args()
    if args.trace and args.keep is None:
        parser.error("--trace needs --keep DIR: the traces are kept there")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    port = [args.base_port + 2 * i for i in range(args.n)]
    seeds = [f"127.0.0.1:{port[i]}" for i in range(min(2, args.n))]
    with tempfile.TemporaryDirectory() as tmp:
        mesh = Mesh(Path(tmp))
        _compile_sources()
        if args.trace:
            env[TRACE_DIR_ENV] = str(Path(tmp) / "trace")
        states = [mesh.prepare(f"n{i:03d}") for i in range(args.n)]
        procs: list[subprocess.Popen[bytes]] = []
        logs = [Path(tmp) / f"n{i:03d}.log" for i in range(args.n)]
        load_before = os.getloadavg()
        started = time.time()
        try:
            for i, state in enumerate(states):
                argv = [
                    sys.executable, "-m", "populi_p2p.cli", "up", "--state-dir", str(state),
                    "--name", f"n{i:03d}", "--bind", "127.0.0.1",
                    "--port", str(port[i]), "--peer-port", str(port[i] + 1),
                    "--overlay", "none", "--preset", args.preset,
                    *[x for s in seeds if s != f"127.0.0.1:{port[i]}"
                      for x in ("--bootstrap", s)],
                ]  # fmt: skip
                with logs[i].open("wb") as out:
                    procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=out))
            clients = [ApiClient(s / "api.sock", timeout=30.0) for s in states]
            sampler = CpuSampler([proc.pid for proc in procs])

            def check_running() -> None:
                for i, proc in enumerate(procs):
                    if proc.poll() is not None:
                        tail = logs[i].read_text(errors="replace")[-2000:]
                        raise SystemExit(f"n{i:03d} exited ({proc.returncode}):\n{tail}")

            def all_alive_now() -> bool:
                try:
                    return all(
                        c.get("/v1/status")["cluster"]["members"]["alive"] == args.n
                        for c in clients
                    )
                except ApiError:
                    return False

            converged: float | None = None
            ready: list[float] = []
            while converged is None:
                time.sleep(1.0)
                check_running()
                if time.time() - started > args.timeout:
                    parsed = [parse(log) for log in logs]
                    counts = ", ".join(
                        f"{what} {sum(1 for log in parsed for _, ev, _ in log if ev == what)}"
                        for what in COUNTED
                    )
                    raise SystemExit(
                        f"no convergence within {args.timeout:.0f} s; meshes (sizes) "
                        f"{meshes(parsed)}; {counts}; load {os.getloadavg()}"
                    )
                parsed = [parse(log) for log in logs]
                ready = [t for log in parsed for t, ev, _ in log if ev == "node.ready"]
                if len(ready) == args.n:
                    converged = first_convergence(parsed, args.n)
            # Every API answers (it did since node.ready); the state exchanges each
            # daemon answered and the join attempts each made, up to convergence.
            statuses = [client.get("/v1/status") for client in clients]
            exchanges = [st["swim"]["push_pulls_received"] for st in statuses]
            attempts = [st["bootstrap"]["attempts"] for st in statuses]
            end = max(time.time(), converged + args.hold)
            while time.time() < end:
                time.sleep(1.0)
                check_running()
            parsed = [parse(log) for log in logs]
            still = all_alive_now()
            load_after = os.getloadavg()
            sampler.stop()
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGKILL)
            for proc in procs:
                proc.wait()
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                for path in logs:
                    shutil.copy(path, args.keep / path.name)
                for path in sorted((Path(tmp) / "trace").glob("*.trace")):
                    shutil.copy(path, args.keep / path.name)
    apis = max(ready) - started
    after = converged - started
    print(f"daemons                        {args.n} ({args.preset})")
    print(f"every API answers after        {apis:.2f} s (node.ready lines)")
    print(f"all see {args.n} alive after        {after:.2f} s ({after - apis:.2f} s more)")
    busy = sampler.between(max(ready), converged)
    cores = os.cpu_count() or 1
    print(
        f"daemons' CPU meanwhile          {busy:.2f} s in {converged - max(ready):.2f} s"
        f" ({busy / max(converged - max(ready), 1e-9) / cores:.0%} of {cores} cores)"
    )
    steps = range(int(converged - max(ready)) + 2)
    print(
        "  per second after the last API   "
        + " ".join(f"{sampler.between(max(ready) + k, max(ready) + k + 1):.1f}" for k in steps)
    )
    print(f"{args.hold:.0f} s later, all see all alive {still}")
    print(f"meshes (sizes) at the end       {meshes(parsed)}")
    print(f"load average before, after    {load_before}, {load_after}")
    print("line                           whole run  after convergence")
    for what in COUNTED:
        total = sum(1 for log in parsed for _, ev, _ in log if ev == what)
        late = sum(1 for log in parsed for t, ev, _ in log if ev == what and t > converged)
        print(f"{what:<30} {total:>9}  {late:>17}")
    rest = sorted(exchanges[2:]) or [0]
    print(
        "state exchanges answered       seeds "
        + ", ".join(f"n{i:03d} {exchanges[i]}" for i in range(min(2, args.n)))
        + f"; others median {rest[len(rest) // 2]}, max {rest[-1]}"
    )
    print(f"join attempts                  {sum(attempts)} in all, at most {max(attempts)} by one")
    failed: dict[str, int] = {}
    for log in parsed:
        for _, ev, f in log:
            if ev == "member.dead":
                failed[f.get("name", "?")] = failed.get(f.get("name", "?"), 0) + 1
    worst = sorted(failed.items(), key=lambda kv: -kv[1])[:8]
    print("declared dead most often       " + ", ".join(f"{k} x{v}" for k, v in worst))


if __name__ == "__main__":
    main()
