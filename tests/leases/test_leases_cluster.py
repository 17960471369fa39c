"""A small discrete-event cluster driving the real lease API end to end.

Five nodes gossip every delta over a network that loses, delays and duplicates, run
periodic anti-entropy, elect owners with `place` + `should_claim` + settle, renew, and
re-place after a crash. This is the shape the simulator integration will take; here it
checks the guarantees on a few fixed seeds: no task lost, one accepted result per task,
every replica agrees, and no result from a superseded epoch is ever accepted.
"""

from __future__ import annotations

import heapq
import random

import attrs
import pytest

from populi_p2p.leases import LeaseConfig, LeaseExpired, TaskPhase, TaskResult
from populi_p2p.leases.election import (
    claim_stands,
    must_stop,
    replacement_epoch,
    should_claim,
    start_time,
)
from populi_p2p.leases.placement import Candidate, Gpu, committed_resources, failed_nodes, place

from .helpers import spec, table

GIB = 1 << 30
CFG = LeaseConfig.local()
NAMES = [f"n{i}" for i in range(5)]
DETECTION = 1.0  # SWIM declares a crashed node dead this long after the crash


@attrs.define
class Node:
    name: str
    table: object
    rng: random.Random
    starting: dict[str, tuple[int, float]] = attrs.Factory(dict)
    running: dict[str, tuple[int, float, float]] = attrs.Factory(dict)  # epoch, end, renew


class Cluster:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.nodes = {n: Node(n, table(n, CFG), random.Random(f"{seed}-{n}")) for n in NAMES}
        self.crashed: dict[str, float] = {}
        self.net: list[tuple[float, int, str, bytes]] = []
        self.seq = 0
        self.now = 0.0
        self.starts: dict[str, list[tuple[str, int]]] = {}
        self.stops = 0

    def send(self, src: str, delta: bytes) -> None:
        for dst in NAMES:
            if dst == src or self.rng.random() < 0.2:  # 20 % loss
                continue
            copies = 2 if self.rng.random() < 0.1 else 1  # 10 % duplication
            for _ in range(copies):
                self.seq += 1
                at = self.now + self.rng.uniform(0.01, 0.4)  # reordering
                heapq.heappush(self.net, (at, self.seq, dst, delta))

    def gone(self) -> set[str]:
        return {n for n, t in self.crashed.items() if self.now - t >= DETECTION}

    def candidates(self, gone: set[str]) -> list[Candidate]:
        return [
            Candidate(
                n,
                gpus=(Gpu(48 * GIB, (8, 6)),),
                cpu_cores=16,
                ram=64 * GIB,
                rtt=0.01,
                reliability=0.5,
            )
            for n in NAMES
            if n not in gone
        ]

    def step(self, dt: float = 0.05) -> None:
        self.now += dt
        while self.net and self.net[0][0] <= self.now:
            _, _, dst, delta = heapq.heappop(self.net)
            if dst not in self.crashed:
                self.nodes[dst].table.apply(delta, self.now)
        gone = self.gone()
        for node in self.nodes.values():
            if node.name not in self.crashed:
                self._run_node(node, gone)
        if self.rng.random() < dt:  # about one anti-entropy exchange a second
            live = [n for n in NAMES if n not in self.crashed]
            x, y = self.rng.sample(live, 2)
            from .helpers import anti_entropy

            anti_entropy(self.nodes[x].table, self.nodes[y].table, self.now)

    def _run_node(self, node: Node, gone: set[str]) -> None:
        t, me, now = node.table, node.name, self.now
        expired = {e.task_id: e for e in t.tick(now, gone) if isinstance(e, LeaseExpired)}
        cands = self.candidates(gone)
        committed = committed_resources(list(t))
        for entry in list(t):
            if entry.spec is None or entry.task_id in node.starting:
                continue
            epoch = None
            exclude: set[str] = set()
            if entry.task_id in expired:
                epoch = replacement_epoch(entry, expired[entry.task_id])
                exclude = {expired[entry.task_id].owner}
            elif entry.needs_owner():
                epoch = entry.epoch + 1
            if epoch is None:
                continue
            p = place(
                entry.spec,
                cands,
                config=CFG,
                rng=node.rng,
                committed=committed,
                failed_on=failed_nodes(entry),
                exclude=exclude,
            )
            if p.chosen != me or (not exclude and should_claim(entry, me, p) != epoch):
                continue
            self.send(me, t.claim(entry.task_id, epoch, p.rank_of(me), p.explain(), now))
            node.starting[entry.task_id] = (epoch, start_time(now, CFG))
        for tid, (epoch, at) in list(node.starting.items()):
            entry = t.get(tid)
            if not claim_stands(entry, me, epoch):
                del node.starting[tid]
            elif now >= at:
                del node.starting[tid]
                self.send(me, t.mark_running(tid, now))
                self.starts.setdefault(tid, []).append((me, epoch))
                node.running[tid] = (epoch, now + node.rng.uniform(1.0, 3.0), now)
            elif now - at > 0:
                pass
        for tid, (epoch, end, renewed) in list(node.running.items()):
            entry = t.get(tid)
            if entry is None or must_stop(entry, me, epoch):
                del node.running[tid]
                self.stops += 1
            elif now >= end:
                del node.running[tid]
                self.send(me, t.post_result(tid, TaskResult(0, me.encode(), 1.0), now))
            elif now - renewed >= CFG.lease_renew_interval:
                self.send(me, t.renew(tid, now))
                node.running[tid] = (epoch, end, now)


def _same(x, y) -> bool:
    return {e.task_id: e for e in x} == {e.task_id: e for e in y}


@pytest.mark.parametrize("seed", range(1, 9))
def test_cluster_runs_every_task_once_accepted_through_a_crash(seed: int) -> None:
    c = Cluster(seed)
    tids = []
    for i in range(8):
        by = NAMES[i % len(NAMES)]
        tid, delta = c.nodes[by].table.submit(spec(100 + i, by=by), 0.0)
        c.send(by, delta)
        tids.append(tid)
    victim = None
    while c.now < 120:
        c.step()
        if victim is None and c.now > 1.0:
            owners = [n for n in NAMES for _ in c.nodes[n].running]
            if owners:
                victim = owners[0]
                c.crashed[victim] = c.now
                c.nodes[victim].running.clear()
        live = [c.nodes[n].table for n in NAMES if n not in c.crashed]
        for tb in live:
            tb.check_invariants()
        if (
            victim
            and all(
                (e := tb.get(tid)) is not None and e.phase is TaskPhase.SUCCEEDED
                for tb in live
                for tid in tids
            )
            and not c.net
            and all(_same(tb, live[0]) for tb in live)
        ):
            break
    assert victim is not None
    live = [c.nodes[n].table for n in NAMES if n not in c.crashed]
    for tid in tids:
        entries = [tb.get(tid) for tb in live]
        assert all(e == entries[0] for e in entries), "replicas disagree"
        e = entries[0]
        assert e.phase is TaskPhase.SUCCEEDED, f"task lost: {e}"
        assert e.accepted_result is not None and e.owner != victim
        assert e.accepted_result.output_tail == e.owner.encode()  # the current owner's
    # nobody is still running anything: every duplicate start was stopped
    assert all(not c.nodes[n].running for n in NAMES)
    duplicates = sum(len(v) - 1 for v in c.starts.values())
    assert c.stops <= duplicates
    # the victim's task was re-placed at a later epoch and ran elsewhere
    assert any(e.epoch >= 2 for e in (live[0].get(t) for t in tids))
