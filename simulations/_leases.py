"""One `LeaseAgent` in every simulated node: the daemon's lease logic, virtual time.

Theory of operation
-------------------
Each simulated node life runs one `populi_p2p.leases.agent.LeaseAgent`, the sans-IO
object that holds all of a node's lease logic (the daemon's `LeaseService` drives the
same object). This module is a driver, as `tests/leases/agent_harness.py` is, but over
the real swim cores and the simulated network; it decides nothing about ownership:

- **Messages.** `SendTo` goes through the node's swim core (`Membership.send_app`), so
  the network's loss, delays and partitions and the nodes' stalls apply to it; the
  receiving core yields an `AppMessage`. Payloads start with a one-byte kind, as the
  daemon's `app_channel` frames them: `TABLE_KIND` (1, `AppKind.LEASES`) for a
  lease-table delta and `AGENT_KIND` (4, `AppKind.LEASE_AGENT`) for an agent message.
- **Table.** `Gossip` goes out by `Membership.broadcast_app` under the agent's key; a
  node whose table a delta changed re-broadcasts it under the same key (the core does
  not re-gossip). The table is the core's `AppState` (digest, one-way state, merge),
  so push-pull repairs what gossip lost.
- **Execution.** `StartTask` starts a simulated process: it exits by itself after the
  task's drawn duration (`task_exited` with its result), at `StopTask`, or when the
  node's clock reaches its deadline (`StartTask.deadline`, moved by `FenceTask`): the
  executor's own fence, checked on the node's clock. A crash kills the node's
  processes at once. A graceful leave hands every lease back first (`handoff`).
- **Clocks.** The agent's `now` is the node's monotonic clock (the engine's random
  offset) times a rate drawn per node in ``1 +- clock_drift``: clocks run apart.
- **Restarts.** A node's grant records and table entries persist to a per-name "disk"
  (dicts standing in for SQLite). A restarted node's new agent `load`s them and stays
  `ready = False` until its core sees another member alive (checked from
  `READY_AFTER` on); then `release_held`.
- **Stalls.** A stalled or sleeping node's agent runs nothing (its ticks, exits and
  messages wait) while its processes run on.

The observer (`LeaseHistory`) records every execution and checks the invariants I1 to
I4 of docs/leases.md; see `_lease_history.py`. At the end, after the run's liveness
phase, a drain phase runs (bounded) until every acknowledged task is finished and
alike in every live table, and then I3 and I4 are checked.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from typing import Any, Final

import attrs

from populi_p2p.leases import (
    LeaseConfig,
    LeaseTable,
    Requirements,
    TaskEntry,
    TaskKind,
    TaskResult,
    TaskSpec,
)
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
from populi_p2p.leases.grants import GrantRecord
from populi_p2p.leases.placement import Candidate, Gpu
from populi_p2p.leases.reliability import prior_reliability
from populi_p2p.presets import resolve_preset
from swim import Address, AppMessage, DecodeCache, Event, Membership, MemberState, SwimConfig

from ._engine import NodeStatus, Simulator
from ._lease_history import Execution, LeaseHistory
from ._rng import child_rng
from ._tasks import TasksSpec

__all__ = ["AGENT_KIND", "TABLE_KIND", "LeaseSim", "lease_swim_config"]

GIB: Final = 1 << 30
#: The first payload byte (the daemon's `app_channel.AppKind`): a lease-table delta...
TABLE_KIND: Final = 1
#: ... and a `LeaseAgent` message (`AppKind.LEASE_AGENT`).
AGENT_KIND: Final = 4
#: The `send_app` key of agent messages.
AGENT_KEY: Final = "lease-agent"
#: A (re)started node's agent proposes nothing before this, nor before its core sees
#: another member alive.
READY_AFTER: Final = 1.0
#: A stalled or sleeping node's agent is looked at again this often.
POLL: Final = 0.25
#: Each node's table checks its own consistency this often in safety mode.
CHECK_EVERY: Final = 5.0
#: A deadline checked this close to the clock counts as reached (float rounding of
#: the clock conversion; early is the safe side).
CLOCK_EPSILON: Final = 1e-6
#: Ed25519 signatures are 64 bytes; the simulated ones are too, so bytes are honest.
SIGNATURE_BYTES: Final = 64


def lease_swim_config(config: SwimConfig, tasks: TasksSpec) -> SwimConfig:
    """The scenario's `SwimConfig` with the application channel on.

    The lease table's digest is 4 bytes per bucket with at least 256 buckets (1 KiB and
    more), over the core's default `app_digest_size_max` of 256, so the limit is raised
    to 64 KiB. Anti-entropy (push-pull) runs at least every `lease_ttl / 2`, so a table
    delta that gossip happened to miss reaches every member soon after.
    """
    ttl = resolve_preset(tasks.lease_preset).lease.lease_ttl
    interval = config.push_pull_interval
    return attrs.evolve(
        config,
        app_channel_enabled=True,
        app_digest_size_max=64 * 1024,
        push_pull_interval=min(interval, ttl / 2) if interval > 0 else ttl / 2,
    )


def lease_config(tasks: TasksSpec) -> LeaseConfig:
    """The preset, with finished entries kept through the run (no compaction), so
    every live table can be compared at the end."""
    preset = resolve_preset(tasks.lease_preset).lease
    return attrs.evolve(preset, finished_retention=1e6, tombstone_retention=2e6)


def _sign(node: str) -> Callable[[bytes], bytes]:
    """A deterministic stand-in signature of Ed25519's size (keyed BLAKE2b, not crypto)."""
    key = hashlib.blake2b(node.encode(), digest_size=32).digest()

    def sign(data: bytes) -> bytes:
        return hashlib.blake2b(data, key=key, digest_size=SIGNATURE_BYTES).digest()

    return sign


def _verify(node: str, data: bytes, signature: bytes) -> bool:
    return _sign(node)(data) == signature


@attrs.define(eq=False)
class _Run:
    """A simulated process: the history's record, and its deadline on the node's clock."""

    execution: Execution
    deadline: float


@attrs.define(eq=False)
class _Node:
    """One node life's lease service: its agent, clock, processes and wake-up."""

    index: int
    name: str
    life: int
    agent: LeaseAgent
    rate: float
    last_now: float = -math.inf
    wake_at: float = math.inf
    wake_token: int = 0
    checked: float = -math.inf
    runs: dict[tuple[str, int], _Run] = attrs.Factory(dict)


class _Section:
    """The lease table as the swim core's `AppState` delegate (one-way, digest first)."""

    def __init__(self, owner: LeaseSim, node: int) -> None:
        self._owner = owner
        self._node = node

    def digest(self) -> bytes:
        n = self._owner.node(self._node)
        if n is None:
            return b""
        data = n.agent.table.digest()
        self._owner.count_bytes(len(data), "sync")
        return data

    def state_for(self, remote_digest: bytes) -> bytes | None:
        n = self._owner.node(self._node)
        if n is None or not remote_digest:
            return None
        data = n.agent.table.state_for(remote_digest, direct=True)
        if data:
            self._owner.count_bytes(len(data), "sync")
        return data

    def merge(self, payload: bytes) -> None:
        n = self._owner.node(self._node)
        if n is not None:
            n.agent.table.merge_state(payload, self._owner.clock(n))


class LeaseSim:
    """Runs a `LeaseAgent` in every node of a `Simulator` and checks the history.

    Args:
        sim: the engine (its observer list gets this object).
        tasks: the scenario's `[tasks]` table.
        seed: the run's root seed (child seeds "tasks", "lease-node", "lease-clock").
        safety: each table runs its own `check_invariants()` every `CHECK_EVERY`.
    """

    def __init__(self, sim: Simulator, tasks: TasksSpec, seed: int, *, safety: bool) -> None:
        self.sim = sim
        self.spec = tasks
        self.seed = seed
        self.safety = safety
        self.config = lease_config(tasks)
        self.history = LeaseHistory()
        self._rng = child_rng(seed, "tasks")
        self._exit_rng = child_rng(seed, "lease-exits")
        self._nodes: dict[int, _Node] = {}
        self._grant_disks: dict[str, dict[str, GrantRecord]] = {}
        self._table_disks: dict[str, dict[str, TaskEntry]] = {}
        self._rates: dict[int, float] = {}
        self._window: tuple[float, float] | None = None
        self._bytes = {"table": 0, "agent": 0, "sync": 0}
        self._member_seconds = 0.0
        self._members_at = (0.0, 0)
        self.counters: dict[str, int] = {}
        self.drain_seconds: float | None = None
        self.drained = False
        self._gpus = tuple(
            Gpu(int(tasks.node_vram_gib * GIB), (8, 6)) for _ in range(tasks.node_gpus)
        )
        self._requirements = Requirements(
            gpu_count=tasks.gpus,
            vram_per_gpu=int(tasks.vram_gib * GIB),
            cpu_cores=tasks.cpu_cores,
        )
        sim.add_observer(self)

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    ####################################################################################
    # Nodes

    def core_factory(self, config: SwimConfig) -> Callable[..., Membership]:
        """A `CoreFactory` that gives each new node life a lease agent and a core whose
        `AppState` is that agent's table (the cores share a `DecodeCache`)."""
        cache = DecodeCache()

        def make(
            name: str, address: Address, rng: random.Random, now: float, incarnation: int
        ) -> Membership:
            node = self.sim.index_of(name)
            assert node is not None
            self._new_node(node, name)
            return Membership(
                config, name, address, rng, now, incarnation=incarnation,
                app_state=_Section(self, node), decode_cache=cache,
            )  # fmt: skip

        return make

    def _new_node(self, index: int, name: str) -> None:
        grants = self._grant_disks.setdefault(name, {})
        entries = self._table_disks.setdefault(name, {})
        table = LeaseTable(
            self.config, name, _sign(name), _verify,
            persist=lambda entry: entries.__setitem__(entry.task_id, entry),
            forget=lambda tid: _forget(entries, tid),
        )  # fmt: skip
        life = self.sim.life(index)  # the engine counts the new life before the factory
        if index not in self._rates:
            drift = self.spec.clock_drift
            self._rates[index] = child_rng(self.seed, "lease-clock", index).uniform(
                1.0 - drift, 1.0 + drift
            )
        agent = LeaseAgent(
            self.config, name, _sign(name), _verify,
            members=lambda: self._members(index),
            candidates=lambda spec, rel: self._candidates(index, rel),
            rng=child_rng(self.seed, "lease-node", index, life), table=table,
            persist_grant=lambda rec: self._persist(name, rec),
        )  # fmt: skip
        n = self._nodes[index] = _Node(index, name, life, agent, self._rates[index])
        agent.load([attrs.evolve(r) for r in grants.values()], list(entries.values()),
                   self.clock(n))  # fmt: skip
        agent.ready = False
        self.sim.call_at(self.sim.now + READY_AFTER, self._ready_check, (index, life))

    def node(self, index: int) -> _Node | None:
        """The running lease service of node `index`, or None when it is down."""
        return self._nodes.get(index)

    def _current(self, index: int, life: int) -> _Node | None:
        n = self._nodes.get(index)
        return n if n is not None and n.life == life else None

    def clock(self, n: _Node) -> float:
        """What the node's agent reads as `now` (never less than it read before)."""
        n.last_now = max(n.last_now, n.rate * self.sim.local_time(n.index))
        return n.last_now

    def _global(self, n: _Node, local: float) -> float:
        """The virtual time at which the node's clock reads `local` (if it runs on)."""
        return self.sim.now + max(0.0, (local - self.clock(n)) / n.rate)

    def _runnable(self, n: _Node) -> bool:
        """The daemon gets CPU: not stalled, not asleep."""
        status = self.sim.status(n.index)
        return status.is_member and status != NodeStatus.PAUSED and not self.sim.stalled(n.index)

    def _core(self, index: int) -> Membership | None:
        core = self.sim.cores[index]
        return core if isinstance(core, Membership) else None

    def _members(self, index: int) -> list[str]:
        """The node's core's alive and suspect members, itself included."""
        core = self._core(index)
        me = self.sim.names[index]
        if core is None:
            return [me]
        live = (MemberState.ALIVE, MemberState.SUSPECT)
        names = [m.name for m in core.members() if m.state in live]
        return names if me in names else [*names, me]

    def _candidates(self, index: int, reliability: dict[str, float] | Any) -> list[Candidate]:
        """The node's view as placement candidates: every live member offers the
        scenario's GPUs, cores and RAM."""
        core = self._core(index)
        if core is None:
            return []
        prior = prior_reliability(self.config)
        spec = self.spec
        return [
            Candidate(
                m.name,
                state="alive" if m.state == MemberState.ALIVE else "suspect",
                gpus=self._gpus,
                cpu_cores=spec.node_cpu_cores,
                ram=int(spec.node_ram_gib * GIB),
                rtt=None,  # the accepting node's RTTs are not everyone's: none, as before
                reliability=reliability.get(m.name, prior),
            )
            for m in core.members()
            if m.state in (MemberState.ALIVE, MemberState.SUSPECT)
        ]

    def _persist(self, name: str, rec: GrantRecord) -> None:
        self._grant_disks.setdefault(name, {})[rec.task_id] = attrs.evolve(rec)
        self.history.persisted(rec, self._grant_disks, self.sim.now)

    def _ready_check(self, arg: tuple[int, int]) -> None:
        n = self._current(*arg)
        if n is None or n.agent.ready:
            return
        core = self._core(n.index)
        alone = core is None or not any(
            m.state == MemberState.ALIVE and m.name != n.name for m in core.members()
        )
        if alone or not self._runnable(n):
            self.sim.call_at(self.sim.now + 2 * POLL, self._ready_check, arg)
            return
        n.agent.ready = True
        self._do(n, n.agent.release_held(self.clock(n)))

    ####################################################################################
    # The agent's inputs and commands

    def _do(self, n: _Node, cmds: list[AgentCommand]) -> None:
        """Carry out the agent's commands, then schedule its next tick."""
        for cmd in cmds:
            if isinstance(cmd, SendTo):
                payload = bytes([AGENT_KIND]) + cmd.payload
                if not self.sim.send_app(n.index, cmd.node, AGENT_KEY, payload):
                    self._count("sends_refused")
            elif isinstance(cmd, Gossip):
                self._broadcast(n, cmd.key, bytes([TABLE_KIND]) + cmd.payload)
            elif isinstance(cmd, StartTask):
                self._start(n, cmd)
            elif isinstance(cmd, FenceTask):
                run = n.runs.get((cmd.task_id, cmd.epoch))
                if run is not None:
                    run.deadline = cmd.deadline
            elif isinstance(cmd, StopTask):
                self._stop(n, cmd.task_id, cmd.epoch, "stopped", None)
            elif isinstance(cmd, Acknowledged):
                self._acknowledged(n, cmd)
        self._reschedule(n)

    def _broadcast(self, n: _Node, key: str, payload: bytes) -> None:
        core = self._core(n.index)
        if core is None or core.has_left:
            return
        try:
            self.sim.broadcast_app(n.index, key, payload)
        except ValueError:
            self._count("broadcasts_refused")

    def _acknowledged(self, n: _Node, cmd: Acknowledged) -> None:
        if cmd.refusal is not None:
            self._count(f"{cmd.what}_refused")
            return
        if cmd.what == "submit":
            known = n.agent.spec_of(cmd.task_id)
            replicas = known[0].replicas if known is not None else ()
            self.history.acknowledged(cmd.task_id, replicas, self.sim.now)

    def on_event(self, now: float, node: int, event: Event) -> None:
        """An `AppMessage` reached a node's core: handed to its agent just after the
        core call (so the agent's sends are not issued from inside it)."""
        if event.__class__ is not AppMessage:
            return
        assert isinstance(event, AppMessage)
        n = self._nodes.get(node)
        if n is None or not event.payload:
            return
        kind = event.payload[0]
        self.count_bytes(len(event.payload), "agent" if kind == AGENT_KIND else "table")
        self.sim.call_at(now, self._deliver, (node, n.life, event))

    def _deliver(self, arg: tuple[int, int, AppMessage]) -> None:
        index, life, event = arg
        n = self._current(index, life)
        if n is None:
            return
        kind, body = event.payload[0], event.payload[1:]
        if kind == AGENT_KIND:
            self._do(n, n.agent.receive(body, self.clock(n), event.source))
        elif kind == TABLE_KIND:
            changed, cmds = n.agent.apply_delta(body, self.clock(n))
            if changed:  # re-gossip what was new to us (the core does not)
                self._broadcast(n, event.key, event.payload)
            self._do(n, cmds)
        else:
            self._count("unknown_kind")

    def on_status(self, now: float, node: int, old: NodeStatus, new: NodeStatus) -> None:
        self._count_members(now)
        n = self._nodes.get(node)
        if n is None:
            return
        if new == NodeStatus.LEAVING:
            # The daemon drains before it leaves: hand every lease back, while its core
            # can still send (the leave is announced right after this).
            n.agent.draining = True
            clock = self.clock(n)
            for cmd in n.agent.handoff():
                assert isinstance(cmd, StopTask)
                if self._stop(n, cmd.task_id, cmd.epoch, "stopped", None, report=False):
                    self._do(n, n.agent.task_exited(cmd.task_id, cmd.epoch, None, clock))
        elif new == NodeStatus.DOWN:
            del self._nodes[node]
            for run in n.runs.values():  # processes die with their daemon
                self.history.ended(run.execution, now, "crashed")
            n.runs.clear()

    ####################################################################################
    # Time

    def _reschedule(self, n: _Node) -> None:
        due = n.agent.next_deadline()
        if due is None:
            return
        at = self._global(n, due)
        if at < n.wake_at:
            n.wake_at = at
            n.wake_token += 1
            self.sim.call_at(at, self._tick, (n, n.wake_token, due))

    def _tick(self, arg: tuple[_Node, int, float]) -> None:
        n, token, due = arg
        if token != n.wake_token or self._nodes.get(n.index) is not n:
            return
        n.wake_at = math.inf
        if not self._runnable(n):
            n.wake_at = self.sim.now + POLL
            n.wake_token += 1
            self.sim.call_at(n.wake_at, self._tick, (n, n.wake_token, due))
            return
        # The conversion back to the node's clock may round just below `due`.
        n.last_now = max(self.clock(n), due)
        self._do(n, n.agent.tick(n.last_now))
        if self.safety and self.sim.now >= n.checked + CHECK_EVERY:
            n.checked = self.sim.now
            n.agent.table.check_invariants()

    ####################################################################################
    # Executions

    def _start(self, n: _Node, cmd: StartTask) -> None:
        tid, epoch = cmd.task_id, cmd.epoch
        execution = self.history.started(tid, epoch, n.name, self.sim.now)
        run = n.runs[(tid, epoch)] = _Run(execution, cmd.deadline)
        self.sim.note("lease-start", f"{n.name} {tid[:12]} {epoch}")
        task = self.history.tasks.get(tid)
        duration = task.duration if task is not None else self.spec.duration_min
        self.sim.call_at(self.sim.now + duration, self._exited, (n, run))
        self.sim.call_at(self._global(n, cmd.deadline), self._fence, (n, run))

    def _exited(self, arg: tuple[_Node, _Run]) -> None:
        """The process finished its work (if it still runs)."""
        n, run = arg
        e = run.execution
        if e.end is not None:
            return
        failed = self._exit_rng.random() < self.spec.failure_rate
        result = TaskResult(1 if failed else 0, f"{n.name} e{e.epoch}".encode(), 0.0)
        self._stop(n, e.task, e.epoch, "exited", result)

    def _fence(self, arg: tuple[_Node, _Run]) -> None:
        """The executor's own fence: kill the process when the node's clock reaches
        its deadline, unless a `FenceTask` moved the deadline on."""
        n, run = arg
        if run.execution.end is not None:
            return
        if self.clock(n) + CLOCK_EPSILON >= run.deadline:
            self._stop(n, run.execution.task, run.execution.epoch, "fenced", None)
        else:
            self.sim.call_at(self._global(n, run.deadline), self._fence, arg)

    def _stop(
        self, n: _Node, tid: str, epoch: int, how: str, result: TaskResult | None,
        *, report: bool = True,
    ) -> bool:  # fmt: skip
        """End a process now; its exit reaches the agent when the daemon next runs."""
        run = n.runs.pop((tid, epoch), None)
        if run is None:
            return False
        self.history.ended(run.execution, self.sim.now, how)
        if report:
            self.sim.call_at(self.sim.now, self._report_exit, (n, tid, epoch, result))
        return True

    def _report_exit(self, arg: tuple[_Node, str, int, TaskResult | None]) -> None:
        n, tid, epoch, result = arg
        if self._nodes.get(n.index) is not n:
            return  # the daemon died meanwhile
        if not self._runnable(n):
            self.sim.call_at(self.sim.now + POLL, self._report_exit, arg)
            return
        self._do(n, n.agent.task_exited(tid, epoch, result, self.clock(n)))

    ####################################################################################
    # Submissions and cancels

    def begin(self, t0: float, end: float) -> None:
        """Schedule the submissions over the timeline `[t0, end]` and open the window."""
        self._window = (t0, end)
        self._count_members(t0)
        spec = self.spec
        stop = spec.stop if spec.stop is not None else end - t0
        when = t0 + spec.start
        number = 0
        while spec.rate > 0:
            when += self._rng.expovariate(spec.rate)
            if when > t0 + stop or (spec.count_max and number >= spec.count_max):
                break
            self.sim.call_at(when, self._submit, number)
            number += 1

    def _ready_nodes(self) -> list[_Node]:
        return [n for _, n in sorted(self._nodes.items()) if n.agent.ready and self._runnable(n)]

    def _submit(self, number: int) -> None:
        duration = self.spec.draw_duration(self._rng)
        ready = self._ready_nodes()
        if not ready:
            self._count("submits_nowhere")
            return
        n = self._rng.choice(ready)
        spec = TaskSpec(
            kind=TaskKind.BATCH,
            requirements=self._requirements,
            command=("sim-task", str(number)),  # type: ignore[arg-type]
            retry_limit=self.spec.retry_limit,
            submitted_by=n.name,
            submitted_at=self.sim.now,
        )
        tid, cmds = n.agent.submit(spec, self.clock(n))
        self.history.submitted(tid, number, self.sim.now, duration)
        self.sim.note("lease-submit", f"{n.name} {tid[:12]}")
        if self._rng.random() < self.spec.cancel_fraction:
            at = self.sim.now + self._rng.uniform(0.0, 2.0 * duration)
            self.sim.call_at(at, self._cancel, (tid, n.name))
        self._do(n, cmds)

    def _cancel(self, task: tuple[str, str]) -> None:
        """The user cancels the task where it was submitted (only the accepting node may
        cancel without an operator key); not while that node is down."""
        tid, accepting = task
        n = next((m for m in self._ready_nodes() if m.name == accepting), None)
        if n is None:
            self._count("cancels_accepting_down")
            return
        try:
            cmds = n.agent.cancel(tid, self.clock(n))
        except KeyError:
            self._count("cancels_unknown_here")
            return
        self._count("cancels")
        self._do(n, cmds)

    ####################################################################################
    # Traffic

    def count_bytes(self, size: int, kind: str) -> None:
        window = self._window
        if window is not None and window[0] <= self.sim.now <= window[1]:
            self._bytes[kind] += size

    def _count_members(self, now: float) -> None:
        since, count = self._members_at
        window = self._window
        if window is not None:
            lo, hi = max(since, window[0]), min(now, window[1])
            if hi > lo:
                self._member_seconds += (hi - lo) * count
        members = len(self.sim.nodes_with(NodeStatus.UP, NodeStatus.SLOW))
        self._members_at = (now, members)

    ####################################################################################
    # The end: drain, check, summarize

    def _live(self) -> dict[str, _Node]:
        nodes = self.sim.nodes_with(NodeStatus.UP, NodeStatus.SLOW)
        return {self._nodes[i].name: self._nodes[i] for i in nodes if i in self._nodes}

    def settled(self) -> bool:
        """Every acknowledged task (with a live majority of replicas) finished, alike,
        in every live table."""
        live = self._live()
        tables = [n.agent.table for n in live.values()]
        for tid, task in self.history.tasks.items():
            if task.acked is None:
                continue
            if sum(1 for r in task.replicas if r in live) * 2 <= len(task.replicas):
                continue
            entries = [t.get(tid) for t in tables]
            if any(e is None or not e.finished() for e in entries):
                return False
            if len({(e.phase, e.epoch) for e in entries if e is not None}) > 1:
                return False
        return True

    def drain(self) -> None:
        """Run on (bounded by `drain_bound`) until `settled()`."""
        sim = self.sim
        start = sim.now
        self.drained = True
        while not self.settled():
            if sim.now - start >= self.spec.drain_bound:
                return
            sim.run_until(sim.now + 1.0)
        self.drain_seconds = sim.now - start

    def summary(self) -> dict[str, Any]:
        """The lease measures of the run (plain data, for the report and `--json`)."""
        live = self._live()
        tables = {name: n.agent.table for name, n in live.items()}
        if self.drained:  # I3 and I4 hold only once healed and drained
            self.history.check_end(tables, set(live))
        outcomes: dict[str, int] = {}
        pending: dict[str, int] = {}
        for tid in self.history.tasks:
            entries = [e for t in tables.values() if (e := t.get(tid)) is not None]
            phase = entries[0].phase.name.lower() if entries else "unknown"
            bucket = outcomes if entries and entries[0].finished() else pending
            bucket[phase] = bucket.get(phase, 0) + 1
        self._count_members(self.sim.now)
        total = sum(self._bytes.values())
        agents: dict[str, int] = {}
        for n in live.values():
            for name, value in n.agent.statistics().items():
                agents[name] = agents.get(name, 0) + value
        return {
            "submitted": len(self.history.tasks),
            **self.history.summary(),
            "outcomes": outcomes,
            "pending": pending,
            "stranded": self.history.stranded(set(live)),
            "checked_end": self.drained,
            "drain_seconds": self.drain_seconds,
            "lease_bytes_per_member_second": (
                total / self._member_seconds if self._member_seconds > 0 else None
            ),
            "lease_table_bytes": self._bytes["table"],
            "lease_agent_bytes": self._bytes["agent"],
            "lease_sync_bytes": self._bytes["sync"],
            "driver": dict(sorted(self.counters.items())),
            "agents": dict(sorted(agents.items())),
        }


def _forget(disk: dict[str, TaskEntry], tid: str) -> None:
    disk.pop(tid, None)
