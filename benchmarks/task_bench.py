"""Task benchmark: N real `populi-node up` daemons on loopback run submitted tasks.

Printed, not asserted. For each size it reports:

* submit -> start: from `POST /v1/tasks` returning (the task is stored and acknowledged)
  to the task's process starting, read from a timestamp file the task writes first
  (median and p90). Negative means the owner started it before the submitter had its
  acks back. Tasks are submitted one after another to random nodes.
* throughput, for trivial tasks (`true`): tasks per second accepted (submits returned,
  several submitters in parallel, spread over the nodes) and completed (all succeeded,
  from the first submit).
* failover: from kill -9 of a running task's owner until the task's process starts
  again on another node (its start file), against the target of the issue: the SWIM
  detection time of the preset plus 1 s (see `detection_time`).
* duplicate starts: start files beyond the expected ones (one per task; two for a task
  whose owner was killed). A start file is named TASK.EPOCH.PID, so two owners starting
  one task show up as two files. The trivial tasks write none, so the starts of every
  task are also counted from the daemons' `task.started` log lines.

Usage::

    python benchmarks/task_bench.py                       # 5 daemons, local preset
    python benchmarks/task_bench.py --sizes 5 20 50 --latency-tasks 20 --throughput-tasks 100

The daemons are started with `benchmarks/_mesh.py`'s `Mesh`, as `mesh_bench.py` starts
them (batches of 10, each joining through a member already up). Waits poll the control
API with deadlines; nothing sleeps for a guessed time. Everything lives in a temporary
directory, removed at the end; every daemon is killed on the way out. Wall-clock stamps
(the task's `date` and this script's `time.time()`) are compared on one machine, so
they share a clock. Under root, tasks run as nobody, so the start-file directory is
made world-writable (sticky) for them.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _mesh import Daemon, Mesh, wait_for  # noqa: E402

from populi_p2p.api import ApiClient, ApiError  # noqa: E402
from swim import SwimConfig  # noqa: E402
from swim._math import suspicion_timeout_min  # noqa: E402

#: The task's first act: a start file named TASK.EPOCH.PID holding the wall-clock time.
START = 'date +%s.%N > "{dir}/$POPULI_TASK_ID.$POPULI_TASK_EPOCH.$$"'

#: The daemon's answer when a task is stored but too few members acked it in time.
_STORED = re.compile(r"task ([0-9a-f]{32}) is stored on this node, but only")


def detection_time(preset: str, n: int) -> float:
    """Expected SWIM detection time: e/(e-1) probe periods to the first probe of the dead
    member, its probe timeout, then the suspicion timeout once Lifeguard's confirmations
    arrive (its minimum; see docs/configuration.md)."""
    config = getattr(SwimConfig, preset)()
    first_probe = math.e / (math.e - 1) * config.probe_interval
    suspicion = suspicion_timeout_min(config.suspicion_mult, n, config.probe_interval)
    return float(first_probe + config.probe_timeout + suspicion)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


class TaskBench:
    def __init__(self, root: Path, n: int, preset: str, seed: int) -> None:
        self.root = root
        self.mesh = Mesh(root, n, preset)
        self.n = n
        self.preset = preset
        self.rng = random.Random(seed)
        self.starts = root / "starts"
        self.starts.mkdir()
        if os.geteuid() == 0:  # tasks then run as nobody: let them reach the start files
            root.chmod(0o711)
            self.starts.chmod(0o1777)
        self.killed: set[str] = set()
        self.ack_shortfalls = 0
        self.submitted: list[str] = []

    def alive(self) -> list[Daemon]:
        return [d for d in self.mesh.daemons if d.name not in self.killed]

    def submit(self, d: Daemon, command: list[str], **spec: Any) -> str:
        """Submit through `d`; a shortfall of acks (the task is stored but too few
        members acknowledged it in time) is counted and its task id kept."""
        client = ApiClient(d.client.socket_path, timeout=30.0)
        try:
            tid = str(client.post("/v1/tasks", {"command": command, **spec})["id"])
        except ApiError as exc:
            stored = _STORED.search(str(exc))
            if stored is None:
                raise
            self.ack_shortfalls += 1
            tid = stored.group(1)
        self.submitted.append(tid)
        return tid

    def task(self, tid: str) -> dict[str, Any]:
        return self.alive()[0].client.get(f"/v1/tasks/{tid}")  # type: ignore[no-any-return]

    def start_files(self) -> dict[str, list[tuple[int, float]]]:
        """Task id -> (epoch, wall-clock stamp) of each of its starts, by stamp."""
        out: dict[str, list[tuple[int, float]]] = {}
        for path in self.starts.iterdir():
            try:
                task, epoch, _pid = path.name.split(".")
                stamp = float(path.read_text().strip())
            except ValueError:
                continue  # being written
            out.setdefault(task, []).append((int(epoch), stamp))
        return {k: sorted(v, key=lambda e: e[1]) for k, v in out.items()}

    def started(self, tid: str, after_epoch: int = 0) -> float | None:
        """The first start stamp of `tid` at an epoch above `after_epoch`."""
        stamps = [t for e, t in self.start_files().get(tid, []) if e > after_epoch]
        return stamps[0] if stamps else None

    def logged_starts(self) -> Counter[tuple[str, str]]:
        """(task, epoch) -> how many daemons logged `task.started` for it: every task,
        the trivial ones too (they write no start file)."""
        out: Counter[tuple[str, str]] = Counter()
        mine = set(self.submitted)
        for d in self.mesh.daemons:
            for _, ev, fields in self.mesh.events(d):
                if ev == "task.started" and fields.get("task") in mine:
                    out[(fields["task"], fields.get("epoch", ""))] += 1
        return out

    def phases(self, tids: list[str]) -> Counter[str]:
        rows = self.alive()[0].client.get("/v1/tasks")
        mine = set(tids)
        return Counter(r["phase"] for r in rows if r["id"] in mine)

    ####
    # The measures

    def latency(self, count: int) -> list[float]:
        out = []
        for _ in range(count):
            d = self.rng.choice(self.alive())
            tid = self.submit(d, ["sh", "-c", START.format(dir=self.starts)])
            returned = time.time()
            wait_for(functools.partial(self.started, tid), "a task to start", 60, 0.02)
            out.append((self.started(tid) or math.nan) - returned)
        return out

    def throughput(self, count: int, submitters: int) -> tuple[float, float, Counter[str]]:
        alive = self.alive()
        t0 = time.monotonic()
        with ThreadPoolExecutor(submitters) as pool:
            tids = list(pool.map(lambda i: self.submit(alive[i % len(alive)], ["true"]),
                                 range(count)))  # fmt: skip
        accepted = time.monotonic() - t0
        wait_for(lambda: self.phases(tids)["succeeded"] == count, "trivial tasks", 300, 0.2)
        completed = time.monotonic() - t0
        return count / accepted, count / completed, self.phases(tids)

    def failover(self) -> float:
        """Kill -9 a running task's owner; seconds until the task starts elsewhere."""
        script = f"{START.format(dir=self.starts)}; sleep 30"
        tid = self.submit(self.rng.choice(self.alive()), ["sh", "-c", script], retries=0)
        wait_for(lambda: self.started(tid), "the failover task to start", 60, 0.05)
        wait_for(lambda: self.task(tid)["phase"] == "running", "the task to run", 30, 0.05)
        task = self.task(tid)
        owner = next(d for d in self.alive() if d.node_id == task["owner"])
        killed = time.time()
        owner.proc.send_signal(signal.SIGKILL)
        owner.proc.wait(timeout=10)
        self.killed.add(owner.name)
        # The first start at a later epoch than the killed owner's (a start of that
        # later epoch before the kill would be a duplicate, counted separately).
        epoch = int(task["epoch"])
        wait_for(lambda: self.started(tid, epoch), "the task to start again", 120, 0.05)
        again = self.started(tid, epoch) or math.nan
        # The accepting daemon may be the one killed: cancel with an operator key.
        from populi_p2p.trust.operator import OperatorKey, proof_to_json

        operator, _ = OperatorKey.create(self.mesh.authority, now=time.time())
        proof = proof_to_json(operator.prove_cancel(tid, time.time()))
        self.alive()[0].client.post(f"/v1/tasks/{tid}/cancel", {"operator": proof})
        return again - killed

    def run(self, latency_tasks: int, throughput_tasks: int, kills: int) -> dict[str, Any]:
        r: dict[str, Any] = {"n": self.n, "preset": self.preset}
        t0 = time.monotonic()
        self.mesh.start_all()
        poll = max(0.2, self.n / 20)
        wait_for(lambda: self.mesh.converged(self.mesh.daemons), "convergence", 300, poll)
        r["start_s"] = time.monotonic() - t0
        r["latency"] = self.latency(latency_tasks)
        r["accepted_per_s"], r["completed_per_s"], r["phases"] = self.throughput(
            throughput_tasks, submitters=min(8, self.n)
        )
        r["failover"] = [self.failover() for _ in range(kills)]
        files = self.start_files()
        expected = latency_tasks + 2 * kills
        r["starts"] = sum(len(v) for v in files.values())
        r["duplicates"] = r["starts"] - expected
        # Two starts of one epoch: two owners at once for one lease (the worse kind);
        # the rest are re-placements at a later epoch of a task that was still running.
        r["same_epoch"] = sum(
            n - 1 for v in files.values() for n in Counter(e for e, _ in v).values() if n > 1
        )
        r["tasks_restarted"] = sum(1 for v in files.values() if len(v) > 1) - kills
        logged = self.logged_starts()
        r["logged_starts"] = sum(logged.values())
        r["logged_tasks"] = len(set(self.submitted))
        # One start per task, one more for each killed owner's task.
        r["logged_duplicates"] = r["logged_starts"] - r["logged_tasks"] - kills
        r["logged_same_epoch"] = sum(n - 1 for n in logged.values() if n > 1)
        r["detection_s"] = detection_time(self.preset, self.n)
        r["ack_shortfalls"] = self.ack_shortfalls
        return r

    def stop(self) -> None:
        self.mesh.stop()
        # A killed owner's task keeps running (its own process group, now orphaned):
        # end every group a start file names.
        for path in self.starts.iterdir():
            try:
                os.killpg(int(path.name.rsplit(".", 1)[1]), signal.SIGKILL)
            except (ValueError, ProcessLookupError, PermissionError):
                pass


def report(r: dict[str, Any]) -> None:
    lat = r["latency"]
    fo = r["failover"]
    target = r["detection_s"] + 1.0
    met = "met" if fo and max(fo) <= target else "MISSED"
    print(
        f"n={r['n']:>3} preset={r['preset']}: mesh up in {r['start_s']:.1f} s\n"
        f"       submit -> start: median {statistics.median(lat) * 1000:.0f} ms,"
        f" p90 {percentile(lat, 0.9) * 1000:.0f} ms ({len(lat)} tasks)\n"
        f"       trivial tasks: {r['accepted_per_s']:.1f}/s accepted,"
        f" {r['completed_per_s']:.1f}/s completed ({dict(r['phases'])})\n"
        f"       failover after kill -9 of the owner: "
        f"{', '.join(f'{x:.2f}' for x in fo)} s; target detection {r['detection_s']:.2f} s"
        f" + 1 s = {target:.2f} s: {met}\n"
        f"       starts {r['starts']}, duplicate starts {r['duplicates']}"
        f" ({r['same_epoch']} within one epoch, the rest at a later epoch;"
        f" {r['tasks_restarted']} tasks not killed started more than once);"
        f" submits answered 'too few acks in 10 s' (task stored): {r['ack_shortfalls']}\n"
        f"       every task, from the daemons' task.started lines: {r['logged_starts']} starts"
        f" of {r['logged_tasks']} tasks, {r['logged_duplicates']} duplicate starts"
        f" ({r['logged_same_epoch']} within one epoch)"
    )
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5])
    parser.add_argument("--preset", choices=("lan", "wan", "local"), default="local")
    parser.add_argument("--latency-tasks", type=int, default=20)
    parser.add_argument("--throughput-tasks", type=int, default=50)
    parser.add_argument("--kills", type=int, default=2, help="failover runs per size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    if min(args.sizes) < args.kills + 2:
        parser.error("each size must be at least --kills + 2 (someone must survive to rerun)")
    print(f"task_bench: {os.cpu_count()} cpus, python {sys.version.split()[0]}")
    for n in args.sizes:
        root = Path(tempfile.mkdtemp(prefix=f"populi-taskbench-{n}-"))
        bench = TaskBench(root, n, args.preset, args.seed)
        try:
            report(bench.run(args.latency_tasks, args.throughput_tasks, args.kills))
        except (TimeoutError, RuntimeError, ApiError) as exc:
            print(f"n={n:>3}: FAILED: {exc} (logs in {root})")
            args.keep = True
        finally:
            bench.stop()
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
