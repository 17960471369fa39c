"""Ownership benchmark (issue 17): does each task have one owner, measured from outside?

Real `populi-node up` daemons on loopback (`--preset local`) run probe tasks
(`tests/history/probe.py`: each run logs its start and end, and an overlap when it finds
its task's lock held by another live run). The history (runs, the client's submits and
acks, every live daemon's final table, each killed daemon's task process groups) goes
through `tests/history/checker.py`. Printed, never asserted:

* the load average at start and end (the machine is shared: read the figures with it);
* violations by invariant (I1 overlapping runs, I2 a start after success or cancel was
  acknowledged, I3 an acknowledged task not finished, I4 nodes disagree, I5 a task
  process outlived its killed daemon by more than 1 s), and the first few of them;
* total starts against tasks (one start per task is the promise; a killed owner's task
  starts once more), and starts at an epoch already run (two owners of one lease);
* submit acknowledgement (each submit call's duration) p50/p99/max, and submit-to-start
  (first start of a task minus its submit's return) p50/p99;
* churn: failover, from kill -9 of a running task's owner to the task's next start;
* scale: bytes/s sent per member (the status `traffic.bytes_out` counter) while idle and
  while holding the leases of many running tasks (the difference is lease traffic), and
  CPU per daemon (/proc/PID/stat) in each window.

Scenarios::

    python benchmarks/ownership_bench.py --scenario burst --daemons 20 --tasks 50 --submitters 8
    python benchmarks/ownership_bench.py --scenario churn --daemons 10 --tasks 100 --kills 7
    python benchmarks/ownership_bench.py --scenario churn --daemons 10 --tasks 100 --kills 7 \
        --partition 30 --minority 3     # as root: daemons in network namespaces
    python benchmarks/ownership_bench.py --scenario scale --daemons 20 --tasks 1000

burst: every task submitted at once from `--submitters` threads. churn: tasks submitted
over the run while owners of running tasks are killed with SIGKILL and restarted, one
at a time, each after the mesh converged again; with `--partition S`, halfway through
the kills `--minority` daemons (the owners of running tasks first) are cut off from the
rest for S seconds (every packet dropped both ways, tests/history/partition.py), then
healed, and each task running on the cut-off side is timed from the cut to its next
start. scale: long tasks, all held at once
(each probe is a Python process of about 8 MiB: 1000 tasks need about 8 GiB), then
cancelled. Submits go through the control API as the CLI does (`--via cli` runs the CLI
itself, a Python start per submit). Waits poll with deadlines; a wait that runs out is
printed and the history is checked as it stands. Everything lives in a temporary
directory, removed at the end (`--keep` keeps it); every daemon and probe is killed.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import lease_trace  # noqa: E402
from populi_p2p.api import ApiError  # noqa: E402
from populi_p2p.leases.driver.trace import ENV as TRACE_ENV  # noqa: E402
from populi_p2p.presets import resolve_preset  # noqa: E402
from tests.history.partition import (  # noqa: E402
    NetnsLab,
    drop_between,
    load_netns,
    netns_missing,
)
from tests.history.scenario import Lab, percentile, poll  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def ms(values: list[float], *qs: float) -> str:
    if not values:
        return "none"
    return ", ".join(f"p{round(q * 100)} {percentile(values, q) * 1000:.0f} ms" for q in qs)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


####
# Scenarios


def burst(lab: Lab, args: argparse.Namespace) -> dict[str, Any]:
    tids = lab.burst(args.tasks, args.submitters, args.seconds, args.via)
    settled = lab.settle(tids, timeout=args.timeout)
    return {"settled": settled}


def churn(lab: Lab, args: argparse.Namespace) -> dict[str, Any]:
    """Submit `tasks` over the run from the submitters while the main thread kills a
    running task's owner, restarts it, waits for convergence, `kills` times."""
    tids: list[str] = []
    lock = threading.Lock()
    gap = args.spread / max(1, args.tasks)

    def submitter(k: int) -> None:
        t0 = time.monotonic()
        for i in range(k, args.tasks, args.submitters):
            delay = t0 + i * gap - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing the submits, not synchronisation
            tid = lab.submit(i, args.seconds, args.via)
            if tid is not None:
                with lock:
                    tids.append(tid)

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(args.submitters)]
    for t in threads:
        t.start()

    def submitted() -> list[str]:
        with lock:
            return list(tids)

    missed = 0
    cut: dict[str, Any] = {}
    for k in range(args.kills):
        if args.partition and k == args.kills // 2:
            cut = partition(lab, submitted(), args)
        killed = None
        if poll(lambda: lab.live_runs(submitted()), 30, 0.1):
            killed = lab.kill_owner(submitted(), restart=True)
        if killed is None:
            missed += 1
            continue
        if not poll(lab.converged, 60, 0.5):
            print("  (the mesh did not converge within 60 s after a restart)")
    for t in threads:
        t.join()
    settled = lab.settle(tids, timeout=args.timeout, interval=0.5)
    return {"settled": settled, "kills_missed": missed, **cut}


def partition(lab: Lab, tids: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Cut `--minority` daemons (the owners of running tasks first) off from the rest
    for `--partition` seconds, then heal and wait for the mesh to converge. Returns the
    cut's failovers: for each task running on the minority side at the cut, the seconds
    from the cut to its next start (nan: none before the heal)."""
    assert isinstance(lab, NetnsLab)
    poll(lambda: lab.live_runs(tids), 30, 0.1)
    runs = lab.live_runs(tids)
    owners = sorted({str(e.node) for e in runs if e.node in lab.live})
    rest = [d for d in sorted(lab.live) if d not in owners]
    minority = (owners + rest)[: args.minority]
    majority = [d for d in sorted(lab.live) if d not in minority]
    sides = (lab.namespaces(minority), lab.namespaces(majority))
    cut_off = [e for e in runs if e.node in minority]
    at = time.time()
    drop_between(lab.net, sides, "-I")
    time.sleep(args.partition)  # the partition's length: the fault, not synchronisation
    drop_between(lab.net, sides, "-D")
    healed = poll(lab.converged, 120, 0.5)
    starts = [e for e in lab.events() if e.event == "start" and e.time > at]
    failovers = []
    for e in cut_off:
        later = [s.time - at for s in starts if s.task == e.task]
        failovers.append(min(later) if later else float("nan"))
    return {
        "cut": f"{len(minority)} vs {len(majority)} for {args.partition:g} s"
        f" ({len(cut_off)} task(s) running on the minority; healed: {healed})",
        "cut_failovers": failovers,
    }


#: scale: how often a cancel that timed out is asked again.
CANCEL_TRIES = 5


def window(lab: Lab, seconds: float) -> tuple[float, float, float, dict[str, float]]:
    """Per member over `seconds`: bytes/s sent, mean and max CPU (% of one core), and
    each status counter's change per member per second (which kind of traffic it was)."""

    def sample() -> dict[str, tuple[float, float, dict[str, float]]]:
        out = {}
        for d in lab.live.values():
            status = d.status()
            counters = flat_counters(status)
            out[d.name] = (status["traffic"]["bytes_out"], cpu_seconds(d.proc.pid), counters)
        return out

    before, t0 = sample(), time.monotonic()
    time.sleep(seconds)  # a measuring window, not a wait for an event
    after, elapsed = sample(), time.monotonic() - t0
    names = [n for n in before if n in after]
    sent = sum(after[n][0] - before[n][0] for n in names) / elapsed / len(names)
    cpu = [(after[n][1] - before[n][1]) / elapsed * 100 for n in names]
    rates: dict[str, float] = {}
    for n in names:
        for key, value in after[n][2].items():
            rates[key] = rates.get(key, 0.0) + value - before[n][2].get(key, 0.0)
    rates = {k: v / elapsed / len(names) for k, v in rates.items() if v}
    return sent, sum(cpu) / len(cpu), max(cpu), rates


def flat_counters(status: dict[str, Any]) -> dict[str, float]:
    """The status's numeric counters by dotted path (traffic, swim, driver, tasks)."""
    out: dict[str, float] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        elif isinstance(node, int | float) and not isinstance(node, bool):
            out[prefix] = float(node)

    for section in ("traffic", "swim", "driver", "tasks"):
        walk(section, status.get(section, {}))
    return out


def scale(lab: Lab, args: argparse.Namespace) -> dict[str, Any]:
    """Idle window, then `tasks` long probes all held at once, a loaded window, then
    cancel them all (acknowledged cancels: I2 checks nothing starts after)."""
    r: dict[str, Any] = {"idle": window(lab, args.window)}
    print(f"  idle: {r['idle'][0]:.0f} B/s sent per member", flush=True)
    tids = lab.burst(args.tasks, args.submitters, args.seconds, args.via)
    r["all_running"] = poll(
        lambda: len({e.task for e in lab.live_runs(tids)}) == len(tids), args.timeout, 1.0
    )
    r["running"] = len({e.task for e in lab.live_runs(tids)})
    running_at = time.monotonic()
    # The starts' table deltas are broadcast again for `lease_ttl` after each start:
    # burst traffic, not the steady cost of holding the leases, so measure after it.
    ttl = resolve_preset(args.preset).lease.lease_ttl
    time.sleep(args.settle if args.settle is not None else 2 * ttl)  # a measuring delay
    # Back to back, each printed as it ends: the burst's drain, then the steady cost.
    for i in range(args.windows):
        r["loaded"] = w = window(lab, args.window)
        print(
            f"  window {i + 1}/{args.windows}, ending {time.monotonic() - running_at:.0f} s"
            f" after all ran: {w[0]:.0f} B/s sent per member ({w[0] - r['idle'][0]:.0f} over"
            f" idle), CPU per daemon mean {w[1]:.1f}% (load {os.getloadavg()[0]:.1f})",
            flush=True,
        )

    def cancel(tid: str) -> None:
        # As a user would: a cancel the loaded daemon did not answer in time is asked
        # again (it is idempotent); a refusal is final.
        for attempt in range(CANCEL_TRIES):
            try:
                lab.cancel(tid)
                return
            except ApiError as exc:
                if "did not answer" not in str(exc) or attempt == CANCEL_TRIES - 1:
                    print(f"  cancel {tid[:12]}: {exc}")
                    return

    with ThreadPoolExecutor(args.submitters) as pool:
        list(pool.map(cancel, tids))
    r["settled"] = lab.settle(tids, timeout=args.timeout, interval=2.0)
    return r


SCENARIOS = {"burst": burst, "churn": churn, "scale": scale}


####
# Report


def report(lab: Lab, args: argparse.Namespace, r: dict[str, Any]) -> None:
    rep = lab.report()
    tasks = len({s.task for s in lab.submits if s.task})
    unacked = sum(1 for s in lab.submits if not s.acknowledged)
    print(f"  settled (finished and agreed on every live daemon): {r.get('settled')}")
    print("  violations: " + ", ".join(f"{k} {n}" for k, n in rep.by_invariant().items()))
    for line in rep.lines(limit=args.show)[1:]:
        print("  " + line)
    print(
        f"  starts {rep.runs} for {tasks} tasks ({rep.extra_runs} beyond one per task,"
        f" {len(lab.killed)} owners killed; {rep.same_epoch_runs} at an epoch already run;"
        f" {rep.overlap_records} found their task's lock held)"
    )
    print(
        f"  submit ack: {ms(lab.submit_s, 0.5, 0.99)}, max {max(lab.submit_s) * 1000:.0f} ms"
        f" ({len(lab.submits)} submits, {unacked} not acknowledged)"
    )
    print(f"  submit -> start: {ms(lab.submit_to_start(), 0.5, 0.99)}")
    if lab.failovers:
        fo = lab.failover_times()
        print(f"  failover (kill -9 -> next start): {', '.join(f'{x:.2f}' for x in fo)} s")
    if "cut" in r:
        fo = r["cut_failovers"]
        print(f"  partition {r['cut']}: cut -> next start {', '.join(f'{x:.2f}' for x in fo)} s")
    if r.get("kills_missed"):
        print(f"  kills skipped (no running task on a live daemon in 30 s): {r['kills_missed']}")
    if "idle" in r:
        for name in ("idle", "loaded"):
            sent, mean, peak, rates = r[name]
            print(
                f"  {name:>6}: {sent:.0f} B/s sent per member, CPU per daemon mean"
                f" {mean:.1f}% max {peak:.1f}% of a core"
            )
            top = sorted(rates.items(), key=lambda kv: -abs(kv[1]))[: args.show]
            print("          per member per s: " + ", ".join(f"{k} {v:.1f}" for k, v in top))
        print(f"  lease traffic: {r['loaded'][0] - r['idle'][0]:.0f} B/s per member with"
              f" {r['running']} tasks running (all running: {r['all_running']})")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="burst")
    parser.add_argument("--daemons", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--submitters", type=int, default=8)
    parser.add_argument("--kills", type=int, default=7, help="churn: owners killed")
    parser.add_argument("--seconds", type=float, help="each task's run time (default:"
                        " burst 2, churn 10, scale 600)")  # fmt: skip
    parser.add_argument("--spread", type=float, help="churn: submits spread over this (s)")
    parser.add_argument("--partition", type=float, default=0.0, help="churn: cut the mesh"
                        " this long halfway through the kills (root: namespaces)")  # fmt: skip
    parser.add_argument("--minority", type=int, default=3, help="churn: daemons cut off")
    parser.add_argument("--window", type=float, default=10.0, help="scale: window (s)")
    parser.add_argument("--windows", type=int, default=1, help="scale: loaded windows,"
                        " back to back, each printed (the last is reported)")
    parser.add_argument("--settle", type=float, default=None,
                        help="scale: seconds between all running and the loaded window"
                        " (default: twice the preset's lease_ttl)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=180.0, help="each wait's deadline")
    parser.add_argument("--via", choices=("api", "cli"), default="api")
    parser.add_argument("--preset", choices=("lan", "wan", "local"), default="local")
    parser.add_argument("--show", type=int, default=10, help="violations printed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--trace", type=Path, help="the daemons' lease traces go here; the"
                        " stages of submit -> start are printed (lease_trace.py)")  # fmt: skip
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = {"burst": 2.0, "churn": 10.0, "scale": 600.0}[args.scenario]
    if args.spread is None:
        args.spread = 8.0 * args.kills
    print(
        f"ownership_bench {args.scenario}: {args.daemons} daemons, {args.tasks} tasks of"
        f" {args.seconds:g} s, {args.submitters} submitters via {args.via}, preset"
        f" {args.preset}; {os.cpu_count()} cpus; load average {load()}",
        flush=True,
    )
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)
        os.environ[TRACE_ENV] = str(args.trace)  # the daemons inherit it
    net = None
    if args.partition:
        missing = netns_missing()
        if missing:
            print(f"  --partition needs network namespaces: {missing}")
            return 2
        net = load_netns().NetnsLab(args.daemons, wireguard=False)
        net.__enter__()
        lab: Lab = NetnsLab(
            args.daemons, preset=args.preset, seed=args.seed, nodes=net.nodes, net=net
        )
    else:
        lab = Lab(args.daemons, preset=args.preset, seed=args.seed)
    try:
        print(f"  mesh up in {lab.start():.1f} s", flush=True)
        r = SCENARIOS[args.scenario](lab, args)
        report(lab, args, r)
        if args.trace:
            lines = lease_trace.load_trace(args.trace)
            starts = lease_trace.first_starts(lab.logdir)
            stages = lease_trace.stage_times(lines, starts, lab.sent, lab.returned)
            print("\n".join(lease_trace.summary(lines, stages)))
    except (TimeoutError, RuntimeError, ApiError, AssertionError) as exc:
        print(f"  FAILED: {exc} (lab in {lab.root})")
        args.keep = True
    finally:
        lab.stop(keep=args.keep)
        if net is not None:
            net.__exit__(None, None, None)
    print(f"  load average at the end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
