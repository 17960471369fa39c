"""One owner per task across a partition, on real daemons in network namespaces (issue 17).

Five `populi-node up` daemons (`--preset local`), each in a network namespace of its own
on one bridge (tests/netns/lab.py, without WireGuard), run probe tasks
(`probe.py`) submitted through the control API (`scenario.Lab`). The owner of a running
task and one other node are cut off from the other three: every packet between the
sides is dropped where it arrives, in both directions (an iptables rule in each
namespace's INPUT chain naming the other side's addresses), so senders see no error,
as in a real partition (an OUTPUT rule would fail their sendto with EPERM instead).

The two cut-off nodes are a minority of each task's five replicas: the owner can no
longer renew, its task's wrapper stops the run at the lease's deadline, and only then
do the three grant the next epoch. Read from the probe's log and /proc, never from the
daemons' tables:

* the minority's run dies (SIGTERM, then SIGKILL, from its wrapper: its daemon lives
  on, nobody cancelled it, it wrote no `end` line) before the majority's run of the
  next epoch starts, and that run took the task's lock (no `overlap` line);
* the majority starts it within `bound_s` of the cut, derived from the config;
* tasks owned on the majority side keep their one run.

Then the cut heals, every daemon counts five alive, every task ends on every daemon
exactly once, and the whole history goes through `checker.check` (I1-I5, no violation).

The control runs the same cut with daemons that do not fence (`no_fence/
sitecustomize.py`): the cut-off run is still alive when the next epoch starts, and the
probe's lock and the checker see the overlap.

Needs root, `ip` and `iptables`; skipped with the reason elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import pytest

from populi_p2p.leases.config import LeaseConfig
from tests.history.checker import ProbeEvent, check_overlaps, runs_from
from tests.history.partition import NetnsLab, drop_between, load_netns, netns_missing, process_alive
from tests.history.scenario import poll
from tests.node.harness import REPO, Daemon

pytestmark = [pytest.mark.root, pytest.mark.slow]

#: Each probe sleeps this long: past the cut's fence (at most `lease_ttl` after the
#: cut) with room to spare, and short enough that the next epoch's run ends soon.
SECONDS = 15.0
#: Added to each derived bound for a loaded 2-core box (daemons stalled, slow forks).
SLACK_S = 4.0
#: How often the dying run is looked for in /proc (its death time is known to this).
POLL_S = 0.05
CONFIG = LeaseConfig.local()
NO_FENCE = Path(__file__).resolve().parents[1] / "history" / "no_fence"


def _skip_unless_lab() -> ModuleType:
    reason = netns_missing()
    if reason:
        pytest.skip(reason)
    return load_netns()


def bound_s(replicas: Sequence[str], majority: set[str]) -> float:
    """Cut to the majority's start, at most. The granters wait `lease_ttl *
    clock_margin` after the last renewal they heard (before the cut). The first live
    replica proposes then, the k-th live one only after k x `lease_ttl` more (the cut-off
    replicas ranked before the first of the majority count while its SWIM view holds
    them alive or suspect). That claim may be lost, once, for at most another
    `lease_ttl * clock_margin`: a granter that heard the last renewal a little later
    refuses, and the proposal waits for the cut-off granters until it gives up
    (`lease_ttl`); or placement picks the other cut-off node, which SWIM has not yet
    declared dead (about 4 s at 5 members, local preset), and the granters wait out its
    lease. The new owner starts once a majority renewed (a renew interval, after the
    claim's settle time). Plus `SLACK_S`."""
    ahead = next(i for i, r in enumerate(replicas) if r in majority)
    waits = 2 * CONFIG.lease_ttl * CONFIG.clock_margin + ahead * CONFIG.lease_ttl
    return waits + CONFIG.settle_time + CONFIG.lease_renew_interval + SLACK_S


@attrs.define
class Fenced:
    """A minority owner's run, and what followed it."""

    run: ProbeEvent
    bound_s: float
    gone_at: float | None = None
    next_start: ProbeEvent | None = None


@attrs.define
class Cut:
    """A 2-vs-3 partition: the owner of a running task and one other node cut off."""

    minority: set[str]
    majority: set[str]
    sides: tuple[list[Any], list[Any]]  # the namespaces: minority, majority
    fenced: dict[str, Fenced]  # task -> its run on the minority side
    kept: list[ProbeEvent]  # runs on the majority side
    at: float = 0.0  # time.time() before the first rule
    took_s: float = 0.0  # to add every rule


def _plan_cut(lab: NetnsLab, tids: Sequence[str]) -> Cut:
    """Cut off the owner of a running task and a node running none (if any)."""
    runs = sorted(lab.live_runs(tids), key=lambda e: (str(e.node), e.task))
    owner = str(runs[0].node)
    idle = [n for n in sorted(lab.live) if n not in {e.node for e in runs}]
    buddy = idle[0] if idle else next(n for n in sorted(lab.live) if n != owner)
    minority = {owner, buddy}
    majority = set(lab.live) - minority
    names = {d.node_id: d.name for d in lab.live.values()}
    asked = lab.live[sorted(majority)[0]]
    fenced = {}
    for e in runs:
        if e.node in minority:
            spec = asked.client.get(f"/v1/tasks/{e.task}")["spec"]
            fenced[e.task] = Fenced(e, bound_s([names[r] for r in spec["replicas"]], majority))
    kept = [e for e in runs if e.node not in minority]
    side, other = lab.namespaces(sorted(minority)), lab.namespaces(sorted(majority))
    return Cut(minority, majority, (side, other), fenced, kept)


def _cut_and_watch(lab: NetnsLab, net: Any, cut: Cut, done: Callable[[Fenced], bool]) -> None:
    """Cut, then follow each minority run (when it dies, in /proc) and the next start of
    its task (in the log) until `done` holds for each, or past the largest bound."""
    cut.at = time.time()
    drop_between(net, cut.sides, "-I")
    cut.took_s = time.time() - cut.at
    deadline = time.monotonic() + max(f.bound_s for f in cut.fenced.values()) + 5.0
    while time.monotonic() < deadline:
        for f in cut.fenced.values():
            if f.gone_at is None and not process_alive(f.run.pid):
                f.gone_at = time.time()
                lab.seen_gone.setdefault(f.run.pid, f.gone_at)
        for e in lab.events():
            f = cut.fenced.get(e.task)
            if f is not None and f.next_start is None and e.event == "start" and e.time > cut.at:
                f.next_start = e
        if all(done(f) for f in cut.fenced.values()):
            return
        time.sleep(POLL_S)  # polling /proc and the log, bounded by the deadline


def _claims(daemons: Iterable[Daemon]) -> dict[str, dict[str, int]]:
    """Each daemon's claim counters, for a failure's message."""
    keys = ("proposals", "grants_won", "grants_lost", "fenced")
    return {d.name: {k: d.status()["tasks"]["agent"].get(k, 0) for k in keys} for d in daemons}


@pytest.fixture
def labs() -> Iterator[Callable[..., tuple[NetnsLab, Any]]]:
    """Make a lab of 5 daemons in 5 namespaces (keyword arguments go to `NetnsLab`)."""
    netns = _skip_unless_lab()
    made: list[tuple[NetnsLab, Any]] = []

    def make(**kwargs: Any) -> tuple[NetnsLab, Any]:
        net = netns.NetnsLab(5, wireguard=False)
        net.__enter__()
        made.append((NetnsLab(5, nodes=net.nodes, **kwargs), net))
        return made[-1]

    try:
        yield make
    finally:
        for lab, net in made:
            lab.stop()
            net.__exit__(None, None, None)


def test_a_cut_off_owner_stops_before_the_majority_starts_its_task(
    labs: Callable[..., tuple[NetnsLab, Any]],
) -> None:
    lab, net = labs()
    t0 = time.monotonic()
    lab.start(timeout=60)
    tids = lab.burst(tasks=3, submitters=1, seconds=SECONDS)
    assert len(tids) == 3, "a submit was not acknowledged"
    assert lab.wait_running(tids, timeout=20), "the tasks never all started"
    cut = _plan_cut(lab, tids)
    _cut_and_watch(lab, net, cut, lambda f: f.gone_at is not None and f.next_start is not None)

    events = lab.events()
    overlaps = [e for e in events if e.event == "overlap"]
    assert overlaps == [], f"a run started while another run of its task held the lock: {overlaps}"
    for tid, f in cut.fenced.items():
        ends = [e for e in events if e.event == "end" and e.pid == f.run.pid]
        assert ends == [], f"{tid}: the cut-off run ended by itself: make SECONDS longer"
        assert f.gone_at is not None, f"{tid}: the cut-off owner's run never stopped"
        assert f.gone_at - cut.at <= CONFIG.lease_ttl + SLACK_S, (
            f"{tid}: the fence took {f.gone_at - cut.at:.2f} s after the cut"
        )
        nxt = f.next_start
        assert nxt is not None, f"{tid}: the majority never started it"
        assert nxt.node in cut.majority and nxt.epoch > f.run.epoch and nxt.locked, nxt
        assert f.gone_at < nxt.time, (
            f"{tid}: the cut-off run was alive {f.gone_at - cut.at:.2f} s after the cut, "
            f"the next epoch started {nxt.time - cut.at:.2f} s after it"
        )
        assert nxt.time - cut.at <= f.bound_s, (
            f"{tid}: the majority started it {nxt.time - cut.at:.2f} s after the cut "
            f"(bound {f.bound_s:.2f} s); claims: {_claims(lab.live[d] for d in cut.majority)}"
        )

    healed_at = time.monotonic()
    drop_between(net, cut.sides, "-D")
    assert poll(lab.converged, 60, 0.2), "the mesh never healed"
    healed_s = time.monotonic() - healed_at
    settled = lab.settle(tids, timeout=SECONDS + 30)
    report = lab.report()
    assert report.ok, "\n".join(report.lines())
    assert settled, "the tasks never finished and agreed everywhere"
    events = lab.events()
    for tid in tids:
        assert len([e for e in events if e.event == "end" and e.task == tid]) == 1, tid
    for e in cut.kept:
        assert [s.pid for s in events if s.event == "start" and s.task == e.task] == [e.pid]
    assert report.runs == len(tids) + len(cut.fenced), report.summary()
    for tid, f in cut.fenced.items():
        assert f.gone_at is not None and f.next_start is not None
        print(  # what docs/performance.md reports (pytest -s shows it)
            f"partition {tid[:8]}: cut in {cut.took_s:.2f} s; run gone"
            f" {f.gone_at - cut.at:.2f} s after the cut; epoch {f.next_start.epoch} started"
            f" {f.next_start.time - cut.at:.2f} s after (bound {f.bound_s:.2f} s, gap"
            f" {f.next_start.time - f.gone_at:.2f} s); {len(cut.kept)} majority-side"
            f" task(s) kept; healed in {healed_s:.2f} s; wall {time.monotonic() - t0:.1f} s"
        )


def test_the_checks_catch_a_cut_off_owner_that_does_not_fence(
    labs: Callable[..., tuple[NetnsLab, Any]],
) -> None:
    """Control: the same cut with daemons that never fence (`no_fence/`): the cut-off
    run lives on past the next epoch's start, and the lock and the checker see it."""
    lab, net = labs(env={"PYTHONPATH": f"{NO_FENCE}:{REPO}"})
    lab.start(timeout=60)
    tids = lab.burst(tasks=1, submitters=1, seconds=SECONDS)
    assert len(tids) == 1, "the submit was not acknowledged"
    assert lab.wait_running(tids, timeout=20), "the task never started"
    cut = _plan_cut(lab, tids)
    _cut_and_watch(lab, net, cut, lambda f: f.next_start is not None)
    ((tid, f),) = cut.fenced.items()
    assert f.next_start is not None, "the majority never started it"
    assert f.gone_at is None, "the cut-off run stopped anyway: is the control's hook loaded?"
    overlaps = [e for e in lab.events() if e.event == "overlap" and e.task == tid]
    assert [e.pid for e in overlaps] == [f.next_start.pid]
    found = check_overlaps(runs_from(lab.events()))
    assert [v.invariant for v in found if v.task == tid] != [], found
    assert all(v.invariant == "I1" for v in found), found
    print(  # what docs/performance.md reports (pytest -s shows it)
        f"control {tid[:8]}: epoch {f.next_start.epoch} started"
        f" {f.next_start.time - cut.at:.2f} s after the cut beside the cut-off run: {found[0]}"
    )
