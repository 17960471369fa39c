"""A small discrete-event cluster of `LeaseAgent`s for the agent's own tests, like
tests/swim/helpers.py for the membership core: virtual time, a network that delays,
loses and partitions, clocks that run at different rates, crashes and restarts with
what was persisted, and task runs modelled as intervals of global time.

It records every run (task, epoch, node, start, end) and checks the invariants of
docs/leases.md with `tests/history`'s vocabulary: I1 no overlap, I2 nothing starts
after an acknowledged success or cancel, I3 every acknowledged submit ends final, I4
the tables agree once healed.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any

import attrs

from populi_p2p.leases import LeaseConfig, LeaseTable, Requirements, TaskKind, TaskResult, TaskSpec
from populi_p2p.leases._cancel import OperatorCheck, OperatorProof, no_operators
from populi_p2p.leases.agent import LeaseAgent
from populi_p2p.leases.agent_commands import (
    Acknowledged,
    AgentCommand,
    FenceTask,
    Gossip,
    SendTo,
    StartTask,
    StopTask,
)
from populi_p2p.leases.agent_wire import Renew, RenewDigest, decode
from populi_p2p.leases.grants import GrantRecord
from populi_p2p.leases.placement import Candidate
from populi_p2p.leases.quorum import is_quorum


def sign_as(node: str) -> Callable[[bytes], bytes]:
    import hashlib

    def sign(data: bytes) -> bytes:
        return hashlib.blake2b(node.encode() + data, digest_size=64).digest()

    return sign


def verify(node: str, data: bytes, sig: bytes) -> bool:
    return sign_as(node)(data) == sig


def node_id(i: int) -> str:
    """A node id of the daemon's shape (16 base32 characters) for node `i`, where the
    bytes on the wire matter (`Cluster(real_ids=True)`)."""
    import base64
    import hashlib

    digest = hashlib.blake2b(i.to_bytes(4, "big"), digest_size=10).digest()
    return base64.b32encode(digest).decode().lower()


@attrs.define
class Run:
    task: str
    epoch: int
    node: str
    start: float
    end: float | None = None
    code: int | None = None


@attrs.define
class Node:
    name: str
    agent: LeaseAgent
    rate: float
    offset: float
    up: bool = True
    disk_grants: dict[str, GrantRecord] = attrs.field(factory=dict)
    disk_table: dict[str, Any] = attrs.field(factory=dict)

    def local(self, t: float) -> float:
        return self.offset + self.rate * t

    def global_(self, local: float) -> float:
        return (local - self.offset) / self.rate


class Cluster:
    """`n` agents; call `run_until(t)`; faults by method; `check()` lists violations.

    Nodes are named ``n0``, ``n1``...; with `real_ids`, by `node_id(i)` instead."""

    def __init__(
        self,
        n: int,
        seed: int,
        *,
        config: LeaseConfig | None = None,
        loss: float = 0.0,
        delay: tuple[float, float] = (0.001, 0.02),
        drift: float = 0.05,
        check_operator: OperatorCheck = no_operators,
        real_ids: bool = False,
    ) -> None:
        self.check_operator = check_operator
        # Finished entries are kept through the run, so every table can be compared.
        self.config = config or attrs.evolve(
            LeaseConfig.local(), finished_retention=1e6, tombstone_retention=2e6
        )
        self.rng = random.Random(seed)
        self.loss, self.delay = loss, delay
        self.now = 0.0
        self._q: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self.cut: set[frozenset[str]] = set()  # pairs that cannot talk
        self.runs: dict[str, list[Run]] = {}
        self.durations: dict[str, tuple[float, int]] = {}
        self.unrunnable: set[str] = set()  # tasks whose command cannot run (final)
        self.acked: dict[str, float] = {}  # submit acknowledged at
        self.accepted_by: dict[str, str] = {}  # task -> the node it was submitted at
        self.answers: list[Acknowledged] = []  # every Acknowledged, in order
        self.final_at: dict[str, float] = {}  # success or cancel acknowledged at
        self.violations: list[str] = []
        self.sent_log: list[tuple[float, str, str, int]] = []  # (at, from, to, bytes) of SendTo
        self._payloads: list[bytes] = []
        #: Tasks a grant record was persisted for since `_observe` last looked.
        self._granted: set[str] = set()
        #: Crashed members others still list as live (SWIM has not declared them yet).
        self.ghosts: set[str] = set()
        self.nodes: dict[str, Node] = {}
        for i in range(n):
            name = node_id(i) if real_ids else f"n{i}"
            rate = 1.0 + self.rng.uniform(-drift, drift)
            self.nodes[name] = node = Node(name, None, rate, self.rng.uniform(0, 100))  # type: ignore[arg-type]
            node.agent = self._agent(node)

    def _agent(self, node: Node) -> LeaseAgent:
        name = node.name
        table = LeaseTable(
            self.config, name, sign_as(name), verify,
            persist=lambda e: node.disk_table.__setitem__(e.task_id, e),
            forget=lambda t: node.disk_table.pop(t, None), check_operator=self.check_operator,
        )  # fmt: skip
        return LeaseAgent(
            self.config, name, sign_as(name), verify,
            members=lambda: self.live_view(name),
            candidates=lambda spec, rel: [
                Candidate(m, cpu_cores=16.0, ram=1 << 36, reliability=rel.get(m, 0.25))
                for m in self.live_view(name)
            ],
            rng=random.Random(self.rng.random()), table=table,
            persist_grant=lambda r: self._persist_grant(node, r),
            check_operator=self.check_operator,
        )  # fmt: skip

    def _persist_grant(self, node: Node, record: GrantRecord) -> None:
        node.disk_grants[record.task_id] = attrs.evolve(record)
        self._granted.add(record.task_id)

    def live_view(self, name: str) -> list[str]:
        return [
            m for m, n in self.nodes.items()
            if (n.up or m in self.ghosts) and self.can_talk(name, m)
        ]  # fmt: skip

    def can_talk(self, a: str, b: str) -> bool:
        return a == b or frozenset((a, b)) not in self.cut

    ####################################################################################
    # Events

    def _push(self, at: float, kind: str, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self._q, (at, self._seq, kind, data))

    def submit(
        self, at_node: str, duration: float, code: int = 0, retries: int = 2,
        unrunnable: bool = False,
    ) -> str:  # fmt: skip
        node = self.nodes[at_node]
        command = ("work", str(len(self.durations)))
        spec = TaskSpec(
            TaskKind.BATCH, Requirements(cpu_cores=1.0), command,
            retry_limit=retries, submitted_by=at_node, submitted_at=self.now,
        )  # fmt: skip
        tid, cmds = node.agent.submit(spec, node.local(self.now))
        self.durations[tid] = (duration, code)
        self.accepted_by[tid] = at_node
        if unrunnable:
            self.unrunnable.add(tid)
        self.runs.setdefault(tid, [])
        self._apply(node, cmds)
        return tid

    def cancel(self, at_node: str, tid: str, operator: OperatorProof | None = None) -> None:
        node = self.nodes[at_node]
        self._apply(node, node.agent.cancel(tid, node.local(self.now), operator))

    def crash(self, name: str) -> None:
        node = self.nodes[name]
        node.up = False
        for runs in self.runs.values():
            for r in runs:
                if r.node == name and r.end is None:
                    r.end = self.now  # processes die with their daemon

    def restart(self, name: str, ready_after: float = 1.0) -> None:
        node = self.nodes[name]
        node.up = True
        node.agent = self._agent(node)
        node.agent.load([attrs.evolve(r) for r in node.disk_grants.values()],
                        list(node.disk_table.values()), node.local(self.now))  # fmt: skip
        node.agent.ready = False
        self._push(self.now + ready_after, "ready", name)
        self._apply(node, node.agent.release_held(node.local(self.now)))

    def partition(self, side: set[str]) -> None:
        other = set(self.nodes) - side
        self.cut = {frozenset((a, b)) for a in side for b in other}

    def heal(self) -> None:
        self.cut = set()

    ####################################################################################
    # Engine

    def _apply(self, node: Node, cmds: list[AgentCommand]) -> None:
        for cmd in cmds:
            match cmd:
                case SendTo(dst, payload):
                    self.sent_log.append((self.now, node.name, dst, len(payload)))
                    self._payloads.append(payload)
                    if self.rng.random() >= self.loss:
                        at = self.now + self.rng.uniform(*self.delay)
                        self._push(at, "msg", (node.name, dst, payload))
                case Gossip(_key, payload):
                    for other in self.nodes:
                        if other != node.name and self.rng.random() >= self.loss:
                            at = self.now + self.rng.uniform(*self.delay)
                            self._push(at, "delta", (node.name, other, payload))
                case StartTask(tid, epoch, _spec, deadline):
                    self._start(node, tid, epoch, deadline)
                case FenceTask() | Acknowledged():
                    self._ack(cmd)
                case StopTask(tid, epoch, _reason):
                    self._end(node.name, tid, epoch, None)

    def _ack(self, cmd: AgentCommand) -> None:
        if isinstance(cmd, Acknowledged):
            self.answers.append(cmd)
        if isinstance(cmd, Acknowledged) and cmd.refusal is None and cmd.what == "submit":
            self.acked.setdefault(cmd.task_id, self.now)

    def _start(self, node: Node, tid: str, epoch: int, deadline: float) -> None:
        finished = self.final_at.get(tid)
        if finished is not None:
            self.violations.append(
                f"I2 {tid}: started at {self.now:.3f} after final at {finished:.3f}"
            )
        self.runs[tid].append(Run(tid, epoch, node.name, self.now))
        duration, code = self.durations[tid]
        self._push(self.now + duration, "exit", (node.name, tid, epoch, code))
        self._push(node.global_(deadline), "deadline", (node.name, tid, epoch))

    def _end(self, name: str, tid: str, epoch: int, code: int | None) -> None:
        for r in self.runs[tid]:
            if r.node == name and r.epoch == epoch and r.end is None:
                r.end, r.code = self.now, code
                self.nodes[name]
                final = code is not None and tid in self.unrunnable
                result = TaskResult(code if code is not None else -9, b"", 0.0, final=final)
                self._push(self.now, "exited", (name, tid, epoch, result))

    def run_until(self, until: float) -> None:
        while True:
            due = [(n.global_(d), name, d) for name, n in self.nodes.items()
                   if n.up and (d := n.agent.next_deadline()) is not None]  # fmt: skip
            tick_at, tick_node, local = min(due) if due else (float("inf"), "", 0.0)
            q_at = self._q[0][0] if self._q else float("inf")
            at = min(tick_at, q_at)
            if at > until:
                self.now = until
                return
            self.now = max(self.now, at)
            if tick_at <= q_at:
                node = self.nodes[tick_node]
                # local(global_(d)) can round below d: tick at d itself
                self._apply(node, node.agent.tick(max(node.local(self.now), local)))
            else:
                _, _, kind, data = heapq.heappop(self._q)
                self._event(kind, data)
            self._observe()

    def _event(self, kind: str, data: Any) -> None:
        if kind == "msg" or kind == "delta":
            src, dst, payload = data
            node = self.nodes[dst]
            if not node.up or not self.can_talk(src, dst):
                return
            if kind == "msg":
                self._apply(node, node.agent.receive(payload, node.local(self.now), src))
            else:
                self._apply(node, node.agent.apply_delta(payload, node.local(self.now))[1])
        elif kind == "exit":
            name, tid, epoch, code = data
            if self.nodes[name].up:
                self._end(name, tid, epoch, code)
        elif kind == "deadline":
            name, tid, epoch = data  # the executor's own fence: kill at the deadline
            node = self.nodes[name]
            if node.up and node.agent.running().get(tid) != epoch:
                self._end(name, tid, epoch, None)
        elif kind == "exited":
            name, tid, epoch, result = data
            node = self.nodes[name]
            if node.up:
                self._apply(node, node.agent.task_exited(tid, epoch, result, node.local(self.now)))
        elif kind == "ready":
            node = self.nodes[data]
            node.agent.ready = True

    def _observe(self) -> None:
        """When a success or cancel became final at a majority of its replicas (looked
        at only for tasks whose grant records changed: each event touches a few)."""
        granted, self._granted = self._granted, set()
        for tid in sorted(granted):
            if tid in self.final_at or tid not in self.durations:
                continue
            records = [g for n in self.nodes.values() if (g := n.disk_grants.get(tid))]
            replicas = records[0].spec.replicas
            final = [r for r in replicas
                     if (g := self.nodes[r].disk_grants.get(tid)) is not None
                     and g.final and g.ended.name in ("SUCCEEDED", "CANCELLED")]  # fmt: skip
            if is_quorum(replicas, final):
                self.final_at[tid] = self.now

    ####################################################################################
    # Checks

    def heal_and_sync(self) -> None:
        """Heal, then exchange every table with every other (anti-entropy stands in)."""
        self.heal()
        from populi_p2p.leases.wire import encode_entries

        ups = [n for n in self.nodes.values() if n.up]
        for a in ups:
            data = encode_entries(list(a.agent.table))
            for b in ups:
                if a is not b:
                    b.agent.table.apply(data, b.local(self.now))

    def check(self) -> list[str]:
        out = list(self.violations)
        for tid, runs in self.runs.items():
            ordered = sorted(runs, key=lambda r: r.start)
            for a, b in itertools.pairwise(ordered):
                end = a.end if a.end is not None else float("inf")
                if end > b.start:
                    out.append(f"I1 {tid}: {a.node}@{a.epoch} [{a.start:.3f}, {end:.3f}] "
                               f"overlaps {b.node}@{b.epoch} from {b.start:.3f}")  # fmt: skip
        ups = [n for n in self.nodes.values() if n.up]
        for tid in self.acked:
            phases = {(n.agent.table.get(tid).phase.name if n.agent.table.get(tid) else None,  # type: ignore[union-attr]
                       n.agent.table.get(tid).epoch if n.agent.table.get(tid) else None)  # type: ignore[union-attr]
                      for n in ups}  # fmt: skip
            if len(phases) != 1:
                out.append(f"I4 {tid}: replicas differ: {sorted(map(str, phases))}")
            (phase, _), *_ = phases
            if phase not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                out.append(f"I3 {tid}: acknowledged but ended {phase}")
        return out

    def clear_sent(self) -> None:
        self.sent_log.clear()
        self._payloads.clear()

    def renewals(self) -> list[tuple[float, str, str, int]]:
        """The `sent` messages that are renewals (`Renew`, `RenewDigest`)."""
        return [
            m for m, payload in zip(self.sent_log, self._payloads, strict=True)
            if isinstance(decode(payload), Renew | RenewDigest)
        ]  # fmt: skip

    def starts(self) -> int:
        return sum(len(r) for r in self.runs.values())


def chaos(seed: int, *, nodes: int = 7, tasks: int = 30, faults: bool = True) -> Cluster:
    """Submissions over 20 s under crashes and restarts, a partition, loss and drifting
    clocks; then healed, drained and synced: ready for `check()`."""
    c = Cluster(nodes, seed, loss=0.05 if faults else 0.0, drift=0.1 if faults else 0.0)
    rng = random.Random(seed * 7919)
    names = sorted(c.nodes)
    plan: list[tuple[float, str, Any]] = []
    for _i in range(tasks):
        plan.append((rng.uniform(0, 20), "submit", (rng.choice(names), rng.uniform(0.5, 6))))
    if faults:
        for _ in range(3):
            at = rng.uniform(2, 30)
            victim = rng.choice(names)
            plan.append((at, "crash", victim))
            plan.append((at + rng.uniform(0.5, 15), "restart", victim))
        cut_at = rng.uniform(5, 25)
        side = set(rng.sample(names, nodes // 2))
        plan.append((cut_at, "partition", side))
        plan.append((cut_at + rng.uniform(3, 20), "heal", None))
        for _ in range(2):
            plan.append((rng.uniform(5, 30), "cancel", None))
    for at, what, arg in sorted(plan, key=lambda p: p[0]):
        c.run_until(at)
        if what == "submit" and c.nodes[arg[0]].up:
            c.submit(arg[0], arg[1], code=1 if rng.random() < 0.1 else 0)
        elif what == "crash":
            c.crash(arg)
        elif what == "restart" and not c.nodes[arg].up:
            c.restart(arg)
        elif what == "partition":
            c.partition(arg)
        elif what == "heal":
            c.heal()
        elif what == "cancel" and c.acked:
            up = [n for n in names if c.nodes[n].up]
            tid = rng.choice(sorted(c.acked))
            user_at = rng.choice(up)  # where the user happens to be: drawn, as before
            by = c.accepted_by[tid]  # but only the accepting node may cancel (no operator)
            try:  # at another node: refused there (or unknown to it)
                c.cancel(by if c.nodes[by].up else user_at, tid)
            except KeyError:
                pass
    c.heal()
    for name in names:
        if not c.nodes[name].up:
            c.restart(name)
    c.run_until(c.now + 150)
    c.heal_and_sync()
    return c
