"""Mesh benchmark: N real `populi-node up` daemons on loopback, timed from the outside.

Printed, not asserted. For each size it reports:

* converge: from the last daemon answering its API until every member sees every other
  alive;
* kill -9: from SIGKILL of one daemon until all the others say it is dead;
* SIGTERM: from SIGTERM of another until all the others say it left (`--leaves K`: K
  daemons leave one after the other, each polled until every survivor shows it `left`
  or 120 s pass; the count seen by all is reported);
* start-up: daemons start in batches of 10, each joining through one random member
  already up; a batch starts once the previous one has joined (`--no-pace`: as soon as
  its APIs answer), and the `member.suspect` lines logged until convergence are
  counted;
* two quiet windows in which nobody polls the API, one right after convergence and one
  `--settle` seconds later (steady state, introductions over): CPU per
  daemon (utime + stime from /proc/PID/stat, as a percentage of one core), resident
  memory (VmRSS from /proc/PID/status), bytes sent per member per second (sealed bytes
  on the wire, from each daemon's status before and after the window), and how many
  suspicions were raised and `udp.blocked` warnings logged (a healthy idle mesh on
  loopback has neither).

Usage::

    python benchmarks/mesh_bench.py                      # 10 and 50 daemons, LAN preset
    python benchmarks/mesh_bench.py --sizes 10 50 100 --preset lan --idle 30
    python benchmarks/mesh_bench.py --sizes 10 --idle 60 --settle 30    # a later window too
    python benchmarks/mesh_bench.py --sizes 100 --leaves 20   # 20 leaves in sequence

Waits poll the daemons' control API with deadlines; nothing sleeps for a guessed time
except the measurement window itself (and `--settle`, before it). Everything lives in a
temporary directory, removed at the end; every daemon is killed on the way out.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _mesh import Daemon, Mesh, wait_for


class Bench(Mesh):
    """The mesh benchmark's measures over a `Mesh`."""

    def last_event_time(self, daemons: list[Daemon], what: str, name: str) -> float:
        """Latest time at which one of `daemons` logged `what` about `name` (first per daemon)."""
        latest = 0.0
        for d in daemons:
            times = [t for t, ev, f in self.events(d) if ev == what and f.get("name") == name]
            latest = max(latest, min(times, default=float("nan")))
        return latest

    def converge_time_from_logs(self) -> float:
        """From the last `node.ready` to the moment every daemon had joined all others."""
        last_ready = 0.0
        done = 0.0
        for d in self.daemons:
            seen: set[str] = set()
            reached = None
            for t, ev, f in self.events(d):
                if ev == "node.ready":
                    last_ready = max(last_ready, t)
                elif ev in ("member.joined", "member.recovered"):
                    seen.add(f.get("id", ""))
                    if len(seen) >= self.n - 1 and reached is None:
                        reached = t
            done = max(done, reached or float("inf"))
        return done - last_ready

    def suspicions(self, line: str = "member.suspect") -> int:
        """`line` events logged so far by all daemons (also `udp.blocked`)."""
        total = 0
        for d in self.daemons:
            text = (self.root / f"{d.name}.log").read_text(errors="replace")
            total += text.count(line)
        return total

    def run(self, idle: float, settle: float = 0.0, leaves: int = 1) -> dict[str, Any]:
        result: dict[str, Any] = {"n": self.n, "preset": self.preset}
        t0 = time.monotonic()
        self.start_all()
        result["start_s"] = time.monotonic() - t0
        # Polling N APIs costs the daemons CPU on a 2-core machine: poll slower for big N.
        poll = max(0.2, self.n / 20)
        wait_for(lambda: self.converged(self.daemons), "convergence", 300, poll)
        result["converge_s"] = self.converge_time_from_logs()
        result["suspicions_start"] = self.suspicions()
        result["load_after_start"] = os.getloadavg()[0]
        # The first window starts right after convergence, while start-up traffic (the
        # last joins' gossip, certificate introductions) is still going; the steady one
        # after `settle` more seconds.
        result["first"] = self.window(idle)
        time.sleep(settle)
        result["steady"] = self.window(idle)
        result["settle_s"] = settle
        result.update(result["steady"])

        victim, leaver = self.daemons[1], self.daemons[2]
        others = [d for d in self.daemons if d not in (victim, leaver)]
        # Times come from the daemons' own log lines (millisecond stamps), so polling
        # 50 or 100 APIs does not blur them; the polls only say when to look.
        killed_at = time.time()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        wait_for(lambda: self.all_see([leaver, *others], victim.node_id, "dead"), "dead", 300, poll)
        failed = self.last_event_time([leaver, *others], "member.dead", victim.name)
        result["kill9_dead_s"] = failed - killed_at
        # Graceful leaves, one after the other: each must be seen as `left` by every
        # survivor (polled) within 120 s; a miss is counted, not fatal.
        leavers = [leaver, *others[: max(0, leaves - 1)]]
        survivors = [d for d in others if d not in leavers]
        times: list[float] = []
        codes: list[int | None] = []
        for i, d in enumerate(leavers):
            watching = [*survivors, *leavers[i + 1 :]]
            termed_at = time.time()
            d.proc.send_signal(signal.SIGTERM)
            try:
                seen = functools.partial(self.all_see, watching, d.node_id, "left")
                wait_for(seen, "left", 120, poll)
            except TimeoutError:
                codes.append(d.proc.wait(timeout=30))
                continue
            times.append(self.last_event_time(watching, "member.left", d.name) - termed_at)
            codes.append(d.proc.wait(timeout=30))
        result["leaves"] = len(leavers)
        result["leaves_seen"] = len(times)
        result["sigterm_left_s"] = statistics.median(times) if times else float("nan")
        result["sigterm_left_max_s"] = max(times, default=float("nan"))
        result["sigterm_exit_code"] = sorted(set(codes), key=str)
        return result

    def window(self, idle: float) -> dict[str, Any]:
        """Steady-state figures over `idle` seconds in which nobody polls the API."""
        suspicions_before = self.suspicions()
        blocked_before = self.suspicions("udp.blocked")
        traffic_before = {d.name: d.client.get("/v1/status")["traffic"] for d in self.daemons}
        cpu_before = {d.name: d.cpu_seconds() for d in self.daemons}
        start = time.monotonic()
        time.sleep(idle)
        elapsed = time.monotonic() - start
        cpu = [(d.cpu_seconds() - cpu_before[d.name]) / elapsed * 100 for d in self.daemons]
        rss = [d.rss_mib() for d in self.daemons]
        traffic_after = {d.name: d.client.get("/v1/status")["traffic"] for d in self.daemons}

        def delta(key: str) -> list[float]:
            return [
                traffic_after[d.name].get(key, 0) - traffic_before[d.name].get(key, 0)
                for d in self.daemons
            ]

        sent = [b / elapsed for b in delta("bytes_out")]
        frames = [b / elapsed for b in delta("frame_bytes_out")]
        with_cert = sum(delta("datagrams_with_certificate"))
        without_cert = sum(delta("datagrams_without_certificate"))
        return {
            "cpu_pct_mean": sum(cpu) / len(cpu),
            "cpu_pct_max": max(cpu),
            "rss_mib_mean": sum(rss) / len(rss),
            "rss_mib_max": max(rss),
            "bytes_out_per_s_mean": sum(sent) / len(sent),
            "frame_bytes_out_per_s_mean": sum(frames) / len(frames),
            "datagrams_per_s_mean": (with_cert + without_cert) / elapsed / len(self.daemons),
            "datagrams_with_certificate_pct": 100 * with_cert / max(1, with_cert + without_cert),
            "suspicions_idle": self.suspicions() - suspicions_before,
            "udp_blocked_idle": self.suspicions("udp.blocked") - blocked_before,
            "idle_s": elapsed,
            "load": os.getloadavg()[0],
        }


def report(r: dict[str, Any]) -> None:
    print(
        f"n={r['n']:>3} preset={r['preset']}: start {r['start_s']:.1f} s,"
        f" converge {r['converge_s']:.2f} s, kill -9 -> all dead {r['kill9_dead_s']:.2f} s,"
        f" SIGTERM -> all left {r['sigterm_left_s']:.2f} s median,"
        f" {r['sigterm_left_max_s']:.2f} s max, {r['leaves_seen']} of {r['leaves']} leaves"
        f" seen as left by all (exit codes {r['sigterm_exit_code']})"
    )
    for name, label in (("first", "right after convergence"), ("steady", "after settling")):
        w = r[name]
        if name == "steady":
            label = f"after {r['settle_s']:.0f} s more"
        print(
            f"       {w['idle_s']:.0f} s window {label}: cpu {w['cpu_pct_mean']:.2f} % of a"
            f" core (max {w['cpu_pct_max']:.2f} %), rss {w['rss_mib_mean']:.1f} MiB"
            f" (max {w['rss_mib_max']:.1f}), sent {w['bytes_out_per_s_mean']:.0f} B/s per"
            f" member ({w['frame_bytes_out_per_s_mean']:.0f} in TCP frames),"
            f" {w['datagrams_per_s_mean']:.1f} datagrams/s per member,"
            f" {w['datagrams_with_certificate_pct']:.1f} % with the certificate,"
            f" suspicions {w['suspicions_idle']}, udp.blocked {w['udp_blocked_idle']},"
            f" load {w['load']:.1f}"
        )
    print(
        f"       start-up: {r['suspicions_start']} member.suspect lines (all daemons) until"
        f" converged; load average {r['load_after_start']:.1f} then"
    )
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--preset", choices=("lan", "wan", "local"), default="lan")
    parser.add_argument("--idle", type=float, default=20.0, help="steady-state window, s")
    parser.add_argument(
        "--settle", type=float, default=0.0,
        help="seconds to wait after convergence before the steady-state window",
    )  # fmt: skip
    parser.add_argument(
        "--no-pace", action="store_true",
        help="start each batch as soon as the previous one answers its API (the old way)",
    )  # fmt: skip
    parser.add_argument(
        "--leaves", type=int, default=1,
        help="graceful leaves in sequence, each until every survivor sees it as left",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    print(f"mesh_bench: {os.cpu_count()} cpus, python {sys.version.split()[0]}")
    for n in args.sizes:
        root = Path(tempfile.mkdtemp(prefix=f"populi-bench-{n}-"))
        bench = Bench(root, n, args.preset, pace=not args.no_pace)
        try:
            report(bench.run(args.idle, args.settle, args.leaves))
        except (TimeoutError, RuntimeError) as exc:
            print(f"n={n:>3}: FAILED: {exc} (logs in {root})")
            args.keep = True
        finally:
            bench.stop()
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
