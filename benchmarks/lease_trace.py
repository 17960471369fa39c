"""Where a task's time goes from submit to start: the stages of the lease path, per task.

Reads the daemons' lease traces (``POPULI_LEASE_TRACE=DIR``, see
``populi_p2p/leases/driver/trace.py``) and the probe's start lines of one run, and
prints, over the tasks of the run, each stage's median / p90 / max in milliseconds:

========== ========================================================================
client     the submit call began (client) -> the service's submit began (API, HTTP)
accept     -> the spec placed, signed, stored and offered (the agent's `submit`)
offer      -> a majority of the replicas has it on disk (`acked`)
reply      -> the client's call returned (the API's answer)
propose    acked -> the first `GrantRequest` left the proposer
grant      -> the proposer's `Own` left (a majority granted, each after an fsync)
own        -> the `Own` arrived at the owner
renew      -> the owner's first renewal with the task left
start      -> `StartTask` handed to the executor (a majority renewed)
exec       -> the probe's start line (wrapper and probe interpreters start)
========== ========================================================================

Plus the store's group commits (count, rows, duration) and the driver's late or long
wake-ups. ``ownership_bench.py --trace DIR`` prints this
after its report; ``python benchmarks/lease_trace.py DIR RUNS_DIR`` reads a kept lab.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

STAGES = ("client", "accept", "offer", "reply", "propose", "grant", "own", "renew", "start",
          "exec")  # fmt: skip


def load_trace(directory: Path) -> list[dict[str, Any]]:
    lines = []
    for path in sorted(directory.glob("*.jsonl")):
        for raw in path.read_text().splitlines():
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError:
                continue  # a line cut by a kill -9
    return sorted(lines, key=lambda e: e["t"])


def first_starts(runs_dir: Path) -> dict[str, float]:
    """Each task's first probe start (time.time())."""
    out: dict[str, float] = {}
    for path in runs_dir.glob("*.log"):
        for raw in path.read_text().splitlines():
            try:
                e = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if e.get("event") == "start":
                out[e["task"]] = min(out.get(e["task"], e["time"]), e["time"])
    return out


def _first(lines: Iterable[dict[str, Any]], **match: Any) -> dict[str, float]:
    """task -> the time of the first line matching `match`."""
    out: dict[str, float] = {}
    for e in lines:
        if all(e.get(k) == v for k, v in match.items()) and "task" in e:
            out.setdefault(e["task"], e["t"])
    return out


def stage_times(
    lines: list[dict[str, Any]],
    starts: Mapping[str, float],
    sent: Mapping[str, float],
    returned: Mapping[str, float],
) -> dict[str, list[float]]:
    """Per stage, the seconds each task spent there (tasks missing a mark are skipped)."""
    offered = _first(lines, ev="offered")
    submit_at: dict[str, float] = {}
    pending: dict[str, float] = {}  # node -> its last "submit" without a task yet
    for e in lines:  # "submit" precedes the task id; pair it with the node's "offered"
        if e["ev"] == "submit":
            pending[e["node"]] = e["t"]
        elif e["ev"] == "offered" and e["node"] in pending:
            submit_at.setdefault(e["task"], pending.pop(e["node"]))
    acked = _first(lines, ev="acked")
    asked = {t: v for t, v in _first([e for e in lines if e.get("epoch") == 1],
                                      ev="out", kind="GrantRequest").items()}  # fmt: skip
    own_out = _first([e for e in lines if e.get("epoch") == 1], ev="out", kind="Own")
    own_in = _first([e for e in lines if e.get("epoch") == 1], ev="in", kind="Own")
    renew_out: dict[str, float] = {}
    for e in lines:
        if e["ev"] == "out" and e.get("kind") == "Renew":
            for tid in e.get("leases", []):
                renew_out.setdefault(tid, e["t"])
    started = _first(lines, ev="start")
    # The owner's own node may be the proposer: `Own` then never leaves; take its time.
    for tid, t in started.items():
        own_out.setdefault(tid, own_in.get(tid, renew_out.get(tid, t)))
        own_in.setdefault(tid, own_out[tid])
    marks = [sent, submit_at, offered, acked, returned, asked, own_out, own_in, renew_out,
             started, starts]  # fmt: skip
    out: dict[str, list[float]] = {s: [] for s in STAGES}
    for tid in returned:
        at = [m.get(tid) for m in marks]
        for name, (a, b) in zip(STAGES, _pairs(at), strict=True):
            if a is not None and b is not None:
                out[name].append(b - a)
    return out


def _pairs(at: list[float | None]) -> list[tuple[float | None, float | None]]:
    """The stages' (from, to) marks: `reply` runs from acked to returned, `propose`
    from acked again."""
    sent, submit, offered, acked, returned, asked, own_out, own_in, renew, start, probe = at
    return [(sent, submit), (submit, offered), (offered, acked), (acked, returned),
            (acked, asked), (asked, own_out), (own_out, own_in), (own_in, renew),
            (renew, start), (start, probe)]  # fmt: skip


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(lines: list[dict[str, Any]], stages: dict[str, list[float]]) -> list[str]:
    out = ["  stage      tasks   p50 ms   p90 ms   max ms"]
    for name in STAGES:
        v = stages[name]
        if v:
            out.append(f"  {name:<9} {len(v):>6} {_q(v, 0.5) * 1000:>8.0f} "
                       f"{_q(v, 0.9) * 1000:>8.0f} {max(v) * 1000:>8.0f}")  # fmt: skip
    commits = [e for e in lines if e["ev"] == "commit"]
    if commits:
        ms, rows = [e["ms"] for e in commits], [e["rows"] for e in commits]
        per_node: dict[str, float] = defaultdict(float)
        for e in commits:
            per_node[e["node"]] += e["ms"]
        busiest = max(per_node.values())
        synced = [e["ms"] for e in commits if e.get("fsync", True)]
        out.append(f"  group commits: {len(commits)} of {sum(rows)} rows (at most {max(rows)}"
                   f" a commit), p50 {_q(ms, 0.5):.1f} ms, p90 {_q(ms, 0.9):.1f} ms, max"
                   f" {max(ms):.1f} ms; {busiest:.0f} ms at most on one node")  # fmt: skip
        if synced:
            out.append(f"  fsynced commits: {len(synced)}, p50 {_q(synced, 0.5):.1f} ms,"
                       f" p90 {_q(synced, 0.9):.1f} ms")  # fmt: skip
    steps = [e for e in lines if e["ev"] == "step"]
    if steps:
        late = [e["late_ms"] for e in steps if e["late_ms"] > 20]
        long = [e["ms"] for e in steps if e["ms"] > 20]
        out.append(f"  driver wake-ups late > 20 ms: {len(late)} (max {max(late, default=0)} ms);"
                   f" steps > 20 ms: {len(long)} (max {max(long, default=0)} ms)")  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: lease_trace.py TRACE_DIR RUNS_DIR", file=sys.stderr)
        return 2
    lines = load_trace(Path(argv[1]))
    starts = first_starts(Path(argv[2]))
    submit = {e["task"]: e["t"] for e in lines if e["ev"] == "offered"}
    for row in summary(lines, stage_times(lines, starts, {}, submit)):
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
