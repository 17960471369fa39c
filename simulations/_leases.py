"""The lease table inside every simulated node: the same code, virtual time and network.

Theory of operation
-------------------
Each simulated node runs one `populi_p2p.leases.LeaseTable` and the package's own
placement and election helpers; this module only models time, the network and the
execution of tasks, and never re-implements a protocol rule:

- **Replication.** Every local operation's delta rides the swim core's application
  channel (`Membership.broadcast_app`), keyed by task and epoch so a newer delta of the
  same claim replaces a queued older one. The core does not re-gossip, so a node that
  learns something from a delta (the table reports `TaskChanged`) re-broadcasts it under
  the same key, as Serf does. The table is the core's `AppState` delegate: swim's sync
  carries `digest()` and the one-way `state_for(digest, direct=True)` answer, so lost
  broadcasts are repaired by anti-entropy.
- **Membership.** Each node's `gone` set (members its core holds dead or left) feeds
  `LeaseTable.tick`, and its alive and suspect members become placement `Candidate`s
  with the node's own RTT and earned reliability; `lease_ttl` expiry is measured on the
  node's own (offset) clock.
- **Election.** As `election`'s docstring says: place, `should_claim`, claim, wait
  `settle_time`, start only if `claim_stands`; a running owner renews every
  `lease_renew_interval`, posts its result when its virtual run time is over, and
  stops at once when `must_stop`. `LeaseExpired` re-places at `replacement_epoch`
  with the old owner excluded.
- **Durability.** Each node's table persists to a per-name "disk" (a dict standing in
  for the SQLite file): a crashed node that restarts reloads it (`LeaseTable.load`),
  as after kill -9. A crash stops the node's executions; a graceful leave releases its
  leases first.

The observer side is ground truth the nodes never see: which nodes are executing which
task (duplicate starts, and whether the two owners could reach each other), when an
owner crashed (failover time), and every replica's changes (safety invariants: at most
one accepted result per task and epoch, epochs never decrease on any replica). At the
end, after the run's liveness phase, a drain phase runs until every task is finished
everywhere (bounded) and every submitted task is classified: finished, pending with a
reason, or lost.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable
from typing import Any

import attrs

from populi_p2p.leases import (
    LeaseConfig,
    LeaseEvent,
    LeaseExpired,
    LeaseTable,
    Requirements,
    TableStalled,
    TaskChanged,
    TaskEntry,
    TaskKind,
    TaskPhase,
    TaskResult,
    TaskSpec,
)
from populi_p2p.leases.election import (
    claim_stands,
    claim_wait,
    must_stop,
    replacement_epoch,
    should_claim,
    start_time,
)
from populi_p2p.leases.placement import (
    Candidate,
    Gpu,
    committed_resources,
    failed_nodes,
    place,
)
from populi_p2p.leases.reliability import Outcome, earned_reliability, prior_reliability
from swim import (
    Address,
    AppMessage,
    DecodeCache,
    Event,
    MemberFailed,
    MemberLeft,
    Membership,
    MemberState,
    SwimConfig,
)

from ._engine import InvariantViolation, NodeStatus, Simulator
from ._rng import child_rng
from ._tasks import TasksSpec

__all__ = ["LeaseSim", "lease_swim_config"]

GIB = 1 << 30
#: A node's lease loop runs at most this often (it batches what arrived meanwhile).
STEP_MIN = 0.05
#: And at least this often, as the daemon's periodic loop does (placement retries).
STEP_MAX = 5.0
#: Each node's table checks its own consistency (`check_invariants`, O(table)) this
#: often in safety mode; the lease invariants themselves are checked on every change.
CHECK_EVERY = 5.0
#: Ed25519 signatures are 64 bytes; the simulated ones are too, so bytes are honest.
SIGNATURE_BYTES = 64
_LIVE_PHASES = (TaskPhase.CLAIMED, TaskPhase.RUNNING)
_PRESETS: dict[str, Callable[[], LeaseConfig]] = {
    "lan": LeaseConfig.lan,
    "wan": LeaseConfig.wan,
    "local": LeaseConfig.local,
}


def lease_swim_config(config: SwimConfig, tasks: TasksSpec) -> SwimConfig:
    """The scenario's `SwimConfig` with the application channel on.

    The lease table's digest is 4 bytes per bucket with at least 256 buckets (1 KiB and
    more), over the core's default `app_digest_size_max` of 256, so the limit is raised
    to 64 KiB. Anti-entropy (push-pull) runs at least every `lease_ttl / 2`: a final
    delta (the result) that gossip happened to miss at one member must reach it before
    that member's `lease_ttl` runs out, or it re-places a finished task (a sequential
    re-run; the later epoch's result then wins). With the lan preset's 30 s push-pull
    and a 10 s ttl, that happened to about one task in 25 on small clusters.
    """
    ttl = _PRESETS[tasks.lease_preset]().lease_ttl
    interval = config.push_pull_interval
    return attrs.evolve(
        config,
        app_channel_enabled=True,
        app_digest_size_max=64 * 1024,
        push_pull_interval=min(interval, ttl / 2) if interval > 0 else ttl / 2,
    )


def _sign(node: str) -> Callable[[bytes], bytes]:
    """A deterministic stand-in signature of Ed25519's size (keyed BLAKE2b, not crypto)."""
    key = hashlib.blake2b(node.encode(), digest_size=32).digest()

    def sign(data: bytes) -> bytes:
        return hashlib.blake2b(data, key=key, digest_size=SIGNATURE_BYTES).digest()

    return sign


def _verify(node: str, data: bytes, signature: bytes) -> bool:
    return _sign(node)(data) == signature


@attrs.define
class _Agent:
    """One node's lease service for one life of the node."""

    node: int
    name: str
    life: int
    table: LeaseTable
    rng: random.Random
    #: task -> (epoch, local time it may start): claimed, settling.
    starting: dict[str, tuple[int, float]] = attrs.Factory(dict)
    #: task -> (epoch, local end time, local time of the last renewal).
    running: dict[str, tuple[int, float, float]] = attrs.Factory(dict)
    #: (task, epoch) -> local time first seen unclaimed, while waiting to claim it.
    unclaimed: dict[tuple[str, int], float] = attrs.Factory(dict)
    wake_at: float = math.inf
    wake_token: int = 0
    last_step: float = -math.inf
    checked: float = -math.inf


class _Section:
    """The lease table as the swim core's `AppState` delegate (one-way, digest first)."""

    def __init__(self, owner: LeaseSim, node: int) -> None:
        self._owner = owner
        self._node = node

    def digest(self) -> bytes:
        agent = self._owner.agent(self._node)
        if agent is None:
            return b""
        data = agent.table.digest()
        self._owner.count_bytes(len(data), "sync")
        return data

    def state_for(self, remote_digest: bytes) -> bytes | None:
        agent = self._owner.agent(self._node)
        if agent is None or not remote_digest:
            return None
        data = agent.table.state_for(remote_digest, direct=True)
        if data:
            self._owner.count_bytes(len(data), "sync")
        return data

    def merge(self, payload: bytes) -> None:
        self._owner.merge_state(self._node, payload)


@attrs.define
class _Task:
    """Ground truth about one submitted task (the nodes never see this)."""

    number: int
    submitted: float  # virtual time
    duration: float
    agreed: float | None = None  # virtual time every live member first agreed on an owner
    first_start: float | None = None
    #: node -> epoch: who is executing it right now.
    executing: dict[int, int] = attrs.Factory(dict)
    #: (virtual crash time, epoch) of an owner crash not yet followed by a start elsewhere.
    crashed: tuple[float, int] | None = None
    #: The greatest epoch any replica has applied from a remote delta or sync.
    max_epoch: int = 0
    #: epoch -> signature of the result some replica accepted for it.
    accepted: dict[int, bytes] = attrs.Factory(dict)
    finished: str | None = None  # phase name, once any replica saw it finished
    #: Starts that happened after some replica had seen the task succeed.
    reruns: int = 0
    starts: int = 0


class LeaseSim:
    """Runs the lease table in every node of a `Simulator` and measures it.

    Args:
        sim: the engine (its observer list gets this object).
        tasks: the scenario's `[tasks]` table.
        seed: the run's root seed (child seeds "tasks" and "lease-node").
        safety: check the lease invariants on every change (raises
            `InvariantViolation`).
    """

    def __init__(self, sim: Simulator, tasks: TasksSpec, seed: int, *, safety: bool) -> None:
        self.sim = sim
        self.spec = tasks
        self.seed = seed
        self.safety = safety
        self.config = _PRESETS[tasks.lease_preset]()
        self._rng = child_rng(seed, "tasks")
        self._agents: dict[int, _Agent] = {}
        self._disks: dict[str, dict[str, TaskEntry]] = {}
        self._tasks: dict[str, _Task] = {}
        self._epochs: dict[tuple[int, str], int] = {}
        self._window: tuple[float, float] | None = None
        self._window_bytes = {"broadcast": 0, "sync": 0}
        self._window_messages = {"broadcast": 0, "sync": 0}
        self._member_seconds = 0.0
        self._members_at = (0.0, 0)
        self.duplicate_starts = 0
        self.duplicate_starts_partitioned = 0
        self.failovers: list[float] = []
        self.stops = 0
        self.relays_refused = 0
        self.drain_seconds: float | None = None
        self._gpus = tuple(
            Gpu(int(tasks.node_vram_gib * GIB), (8, 6)) for _ in range(tasks.node_gpus)
        )
        self._requirements = Requirements(
            gpu_count=tasks.gpus,
            vram_per_gpu=int(tasks.vram_gib * GIB),
            cpu_cores=tasks.cpu_cores,
        )
        sim.add_observer(self)

    ####################################################################################
    # Nodes
    ####################################################################################

    def core_factory(self, config: SwimConfig) -> Callable[..., Membership]:
        """A `CoreFactory` that gives each new node life a lease agent and a core whose
        `AppState` is that agent's table (the cores share a `DecodeCache`, as in
        `swim_factory`)."""
        cache = DecodeCache()

        def make(
            name: str, address: Address, rng: random.Random, now: float, incarnation: int
        ) -> Membership:
            node = self.sim.index_of(name)
            assert node is not None
            self._new_agent(node, name, now)
            return Membership(
                config,
                name,
                address,
                rng,
                now,
                incarnation=incarnation,
                app_state=_Section(self, node),
                decode_cache=cache,
            )

        return make

    def _new_agent(self, node: int, name: str, now: float) -> None:
        disk = self._disks.setdefault(name, {})
        table = LeaseTable(
            self.config,
            name,
            _sign(name),
            _verify,
            persist=lambda entry: disk.__setitem__(entry.task_id, entry),
            forget=lambda tid: _forget(disk, tid),
        )
        if disk:
            table.load(list(disk.values()), now)
        life = self.sim.life(node)  # the engine counts the new life before the factory
        agent = _Agent(node, name, life, table, child_rng(self.seed, "lease-node", node, life))
        self._agents[node] = agent
        for entry in table:
            self._epochs[(node, entry.task_id)] = max(
                self._epochs.get((node, entry.task_id), 0), entry.epoch
            )
        self.sim.call_at(self.sim.now, self._first_wake, (node, life))

    def _first_wake(self, arg: tuple[int, int]) -> None:
        agent = self._agents.get(arg[0])
        if agent is not None and agent.life == arg[1]:
            self._wake(agent, self.sim.now)

    def agent(self, node: int) -> _Agent | None:
        """The running lease agent of `node`, or None when it is down."""
        return self._agents.get(node)

    ####################################################################################
    # Observer: app messages in, status changes
    ####################################################################################

    def on_event(self, now: float, node: int, event: Event) -> None:
        agent = self._agents.get(node)
        if agent is None:
            return
        if event.__class__ is AppMessage:
            assert isinstance(event, AppMessage)
            self.count_bytes(len(event.payload), "broadcast")
            local = self.sim.local_time(node)
            events = agent.table.apply(event.payload, local)
            if any(e.__class__ is TaskChanged for e in events):
                core = self.sim.cores[node]
                if isinstance(core, Membership) and not core.has_left:
                    try:  # re-gossip what was new to us (the core does not)
                        core.broadcast_app(event.key, event.payload, local)
                    except ValueError:
                        self.relays_refused += 1
            self._absorb(agent, events, remote=True)
        elif isinstance(event, MemberFailed | MemberLeft):
            self._wake(agent, now)

    def on_status(self, now: float, node: int, old: NodeStatus, new: NodeStatus) -> None:
        self._count_members(now)
        agent = self._agents.get(node)
        if agent is None:
            return
        if new == NodeStatus.LEAVING:
            # The daemon drains before it leaves: hand every lease back.
            local = self.sim.local_time(node)
            for tid in list(agent.running) + list(agent.starting):
                entry = agent.table.get(tid)
                if entry is not None and entry.owner == agent.name:
                    epoch = entry.epoch
                    if claim_stands(entry, agent.name, epoch):
                        self._send(agent, tid, epoch, agent.table.release(tid, local))
                self._stopped(agent, tid)
            agent.starting.clear()
            agent.running.clear()
        elif new == NodeStatus.DOWN:
            del self._agents[node]
            for tid, (epoch, _, _) in agent.running.items():
                task = self._tasks.get(tid)
                if task is not None:
                    task.executing.pop(node, None)
                    if task.crashed is None:
                        task.crashed = (now, epoch)
            for tid, (epoch, _) in agent.starting.items():
                task = self._tasks.get(tid)
                if task is not None and task.crashed is None:
                    task.crashed = (now, epoch)

    ####################################################################################
    # Anti-entropy and bookkeeping
    ####################################################################################

    def merge_state(self, node: int, payload: bytes) -> None:
        """`AppState.merge` of `node`: merge a peer's one-way answer."""
        agent = self._agents.get(node)
        if agent is None:
            return
        merged = agent.table.merge_state(payload, self.sim.local_time(node))
        self._absorb(agent, merged.events, remote=True)

    def count_bytes(self, size: int, kind: str) -> None:
        window = self._window
        if window is not None and window[0] <= self.sim.now <= window[1]:
            self._window_bytes[kind] += size
            self._window_messages[kind] += 1

    def _count_members(self, now: float) -> None:
        since, count = self._members_at
        window = self._window
        if window is not None:
            lo, hi = max(since, window[0]), min(now, window[1])
            if hi > lo:
                self._member_seconds += (hi - lo) * count
        members = len(self.sim.nodes_with(NodeStatus.UP, NodeStatus.SLOW))
        self._members_at = (now, members)

    def _absorb(self, agent: _Agent, events: list[LeaseEvent], *, remote: bool) -> None:
        """Check the invariants on what changed, update ground truth, wake the node."""
        changed = False
        for event in events:
            if event.__class__ is not TaskChanged:
                continue
            assert isinstance(event, TaskChanged)
            changed = True
            tid = event.task_id
            key = (agent.node, tid)
            last = self._epochs.get(key, 0)
            if event.epoch < last:
                raise InvariantViolation(
                    f"t={self.sim.now:.3f} {agent.name}: epoch of {tid[:12]} went from "
                    f"{last} back to {event.epoch}"
                )
            self._epochs[key] = event.epoch
            task = self._tasks.get(tid)
            if task is None:
                continue
            if remote:
                task.max_epoch = max(task.max_epoch, event.epoch)
            entry = event.entry
            result = entry.accepted_result
            if result is not None:
                seen = task.accepted.setdefault(entry.epoch, result.signature)
                if seen != result.signature and self.safety:
                    raise InvariantViolation(
                        f"t={self.sim.now:.3f} {agent.name}: two accepted results for "
                        f"epoch {entry.epoch} of {tid[:12]}"
                    )
            if entry.finished():
                task.finished = entry.phase.name.lower()
            if task.agreed is None and event.owner is not None:
                self._check_agreement(tid, task)
        if changed:
            self._wake(agent, self.sim.now)

    def _check_agreement(self, tid: str, task: _Task) -> None:
        """Every live member holds the task with one and the same (epoch, owner)."""
        lease: tuple[int, str | None] | None = None
        for node in self.sim.nodes_with(NodeStatus.UP, NodeStatus.SLOW):
            agent = self._agents.get(node)
            entry = None if agent is None else agent.table.get(tid)
            if entry is None or entry.owner is None:
                return
            if lease is None:
                lease = (entry.epoch, entry.owner)
            elif lease != (entry.epoch, entry.owner):
                return
        if lease is not None:
            task.agreed = self.sim.now

    ####################################################################################
    # Submissions
    ####################################################################################

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

    def _submit(self, number: int) -> None:
        # A slow member (its receive queue lags) still accepts submissions.
        up = self.sim.nodes_with(NodeStatus.UP, NodeStatus.SLOW)
        members = [n for n in up if n in self._agents]
        duration = self.spec.draw_duration(self._rng)
        if not members:
            return
        node = self._rng.choice(members)
        agent = self._agents[node]
        local = self.sim.local_time(node)
        spec = TaskSpec(
            kind=TaskKind.BATCH,
            requirements=self._requirements,
            command=("sim-task", str(number)),  # type: ignore[arg-type]
            retry_limit=self.spec.retry_limit,
            submitted_by=agent.name,
            submitted_at=self.sim.now,
        )
        tid, delta = agent.table.submit(spec, local)
        self._tasks[tid] = _Task(number, self.sim.now, duration)
        self._epochs[(node, tid)] = 0
        self.sim.note("lease-submit", f"{agent.name} {tid[:12]}")
        self._broadcast(agent, f"{tid}/s", delta)
        self._wake(agent, self.sim.now)

    ####################################################################################
    # A node's lease loop
    ####################################################################################

    def _wake(self, agent: _Agent, at: float) -> None:
        at = max(at, agent.last_step + STEP_MIN)
        if at >= agent.wake_at:
            return
        agent.wake_at = at
        agent.wake_token += 1
        self.sim.call_at(at, self._step_call, (agent, agent.wake_token))

    def _step_call(self, arg: tuple[_Agent, int]) -> None:
        agent, token = arg
        if token != agent.wake_token or self._agents.get(agent.node) is not agent:
            return
        agent.wake_at = math.inf
        if self.sim.status(agent.node) == NodeStatus.PAUSED:
            # Asleep: the loop runs again when the node wakes (its clock stopped).
            self._wake(agent, self.sim.now + STEP_MAX)
            return
        agent.last_step = self.sim.now
        self._step(agent)
        self._wake(agent, self._next_wake(agent))

    def _gone(self, agent: _Agent) -> set[str]:
        """The members this node's core holds dead or left."""
        core = self.sim.cores[agent.node]
        assert isinstance(core, Membership)
        return {m.name for m in core.members() if m.state in (MemberState.DEAD, MemberState.LEFT)}

    def _candidates(self, agent: _Agent, outcomes: list[Outcome]) -> list[Candidate]:
        """This node's view as placement candidates (built only when placing)."""
        core = self.sim.cores[agent.node]
        assert isinstance(core, Membership)
        alive = [m for m in core.members() if m.state in (MemberState.ALIVE, MemberState.SUSPECT)]
        local = self.sim.local_time(agent.node)
        earned = earned_reliability(outcomes, local, self.config)
        prior = prior_reliability(self.config)
        spec = self.spec
        candidates = [
            Candidate(
                m.name,
                state="alive" if m.state == MemberState.ALIVE else "suspect",
                gpus=self._gpus,
                cpu_cores=spec.node_cpu_cores,
                ram=int(spec.node_ram_gib * GIB),
                # The ranker wants RTT from the accepting node, which no other member
                # knows; each member's own RTTs would rank itself first (RTT 0) and
                # split the views, so the simulated candidates carry none.
                rtt=None,
                reliability=earned.get(m.name, prior),
            )
            for m in alive
        ]
        return candidates

    def _step(self, agent: _Agent) -> None:
        table, me = agent.table, agent.name
        now = self.sim.local_time(agent.node)
        expired: dict[str, LeaseExpired] = {}
        for e in table.tick(now, self._gone(agent)):
            if isinstance(e, LeaseExpired):
                expired[e.task_id] = e
            elif isinstance(e, TableStalled):  # starved: hold every settling claim too
                agent.starting = {
                    t: (epoch, max(at, e.until)) for t, (epoch, at) in agent.starting.items()
                }
        committed: dict[str, Any] | None = None
        candidates: list[Candidate] | None = None
        waited, agent.unclaimed = agent.unclaimed, {}
        for entry in list(table):
            tid = entry.task_id
            if entry.spec is None or tid in agent.starting or tid in agent.running:
                continue
            epoch: int | None = None
            exclude: frozenset[str] = frozenset()
            lapsed = expired.get(tid)
            if lapsed is not None:
                epoch = replacement_epoch(entry, lapsed)
                exclude = frozenset({lapsed.owner})
            elif entry.needs_owner():
                epoch = entry.epoch + 1
            if epoch is None:
                continue
            if committed is None or candidates is None:
                view, outcomes = table.placement_view(now)
                committed = committed_resources(view)
                candidates = self._candidates(agent, outcomes)
            placement = place(
                entry.spec,
                candidates,
                config=self.config,
                rng=agent.rng,
                committed=committed,
                failed_on=failed_nodes(entry),
                exclude=exclude,
            )
            fresh = None
            if placement.chosen != me and table.hides(now):
                fresh = place(
                    entry.spec,
                    self._candidates(agent, table.outcomes()),
                    config=self.config,
                    rng=agent.rng,
                    committed=committed_resources(list(table)),
                    failed_on=failed_nodes(entry),
                    exclude=exclude,
                )
            wait = claim_wait(me, placement, fresh, self.config)
            if wait is None:
                continue
            ambiguous = fresh is not None and fresh.chosen == me
            if ambiguous:
                assert fresh is not None
                placement = fresh
            if not exclude and should_claim(entry, me, placement) != epoch:
                continue
            since = waited.get((tid, epoch), now)
            if now - since < wait:
                agent.unclaimed[(tid, epoch)] = since
                continue
            delta = table.claim(tid, epoch, placement.rank_of(me), placement.explain(), now)
            self._send(agent, tid, epoch, delta)
            delayed = now > since and not ambiguous  # see `LeaseClaims.try_claim`
            agent.starting[tid] = (epoch, start_time(now, self.config, waited=delayed))
            committed = None
        for tid, (epoch, at) in list(agent.starting.items()):
            held = table.get(tid)
            if held is None or not claim_stands(held, me, epoch):
                del agent.starting[tid]
            elif now >= at:
                del agent.starting[tid]
                self._send(agent, tid, epoch, table.mark_running(tid, now))
                task = self._tasks.get(tid)
                duration = task.duration if task is not None else self.spec.duration_min
                agent.running[tid] = (epoch, now + duration, now)
                self._started(agent, tid, epoch)
        for tid, (epoch, end, renewed) in list(agent.running.items()):
            held = table.get(tid)
            if held is None or must_stop(held, me, epoch):
                del agent.running[tid]
                self._stopped(agent, tid)
                self.stops += 1
            elif now >= end:
                del agent.running[tid]
                self._stopped(agent, tid)
                failed = agent.rng.random() < self.spec.failure_rate
                result = TaskResult(1 if failed else 0, f"{me} e{epoch}".encode(), end - renewed)
                self._send(agent, tid, epoch, table.post_result(tid, result, now))
                self.sim.note("lease-result", f"{me} {tid[:12]} {epoch} {int(failed)}")
            elif now - renewed >= self.config.lease_renew_interval:
                self._send(agent, tid, epoch, table.renew(tid, now))
                agent.running[tid] = (epoch, end, now)
        if self.safety and self.sim.now >= agent.checked + CHECK_EVERY:
            agent.checked = self.sim.now
            table.check_invariants()

    def _next_wake(self, agent: _Agent) -> float:
        """The virtual time of the next thing this node's loop must do."""
        offset = self.sim.local_time(agent.node) - self.sim.now
        times = [self.sim.now + STEP_MAX]
        times += [at - offset for _, at in agent.starting.values()]
        if agent.unclaimed:
            wait = self.config.self_view_lag  # `claim_wait` of a node first when fresh
            times += [since + wait - offset for since in agent.unclaimed.values()]
        interval = self.config.lease_renew_interval
        for _, end, renewed in agent.running.values():
            times.append(min(end, renewed + interval) - offset)
        deadline = agent.table.next_deadline()
        if deadline is not None:
            times.append(deadline - offset)
        return max(self.sim.now, min(times))

    def _send(self, agent: _Agent, tid: str, epoch: int, delta: bytes) -> None:
        self._broadcast(agent, f"{tid}/{epoch}/{agent.name}", delta)

    def _broadcast(self, agent: _Agent, key: str, delta: bytes) -> None:
        core = self.sim.cores[agent.node]
        if isinstance(core, Membership) and not core.has_left:
            self.sim.broadcast_app(agent.node, key, delta)

    def _started(self, agent: _Agent, tid: str, epoch: int) -> None:
        self.sim.note("lease-start", f"{agent.name} {tid[:12]} {epoch}")
        task = self._tasks.get(tid)
        if task is None:
            return
        task.starts += 1
        if task.finished == "succeeded":
            task.reruns += 1
        if task.first_start is None:
            task.first_start = self.sim.now
        others = [n for n in task.executing if n != agent.node]
        if others:
            self.duplicate_starts += 1
            network = self.sim.network
            if any(
                not network.reachable(agent.node, n) or not network.reachable(n, agent.node)
                for n in others
            ):
                self.duplicate_starts_partitioned += 1
        task.executing[agent.node] = epoch
        if task.crashed is not None and epoch > task.crashed[1]:
            self.failovers.append(self.sim.now - task.crashed[0])
            task.crashed = None

    def _stopped(self, agent: _Agent, tid: str) -> None:
        task = self._tasks.get(tid)
        if task is not None:
            task.executing.pop(agent.node, None)

    ####################################################################################
    # The end: drain, classify, summarize
    ####################################################################################

    def _live_tables(self) -> list[LeaseTable]:
        nodes = self.sim.nodes_with(NodeStatus.UP, NodeStatus.SLOW)
        return [self._agents[n].table for n in nodes if n in self._agents]

    def settled(self) -> bool:
        """Every task finished on every live replica, and the replicas agree."""
        tables = self._live_tables()
        for tid in self._tasks:
            held = [t.get(tid) for t in tables]
            first = held[0] if held else None
            if first is None or not first.finished():
                if first is None and self._tasks[tid].finished is not None:
                    continue  # compacted everywhere after it finished
                return False
            if any(e != first for e in held):
                return False
        return True

    def drain(self) -> None:
        """Run on (bounded by `drain_bound`) until `settled()`."""
        sim = self.sim
        start = sim.now
        while not self.settled():
            if sim.now - start >= self.spec.drain_bound:
                return
            sim.run_until(sim.now + 1.0)
        self.drain_seconds = sim.now - start

    def summary(self) -> dict[str, Any]:
        """The lease measures of the run (plain data, for the report and `--json`)."""
        tables = self._live_tables()
        outcomes: dict[str, int] = {}
        pending: dict[str, int] = {}
        lost = 0
        stale = 0
        disagree = 0
        for tid, task in self._tasks.items():
            entries = [e for t in tables if (e := t.get(tid)) is not None]
            if not entries:
                if task.finished is not None:
                    outcomes[task.finished] = outcomes.get(task.finished, 0) + 1
                else:
                    lost += 1
                continue
            head = entries[0]
            if any(e != head for e in entries) or len(entries) != len(tables):
                disagree += 1
            if head.finished():
                name = head.phase.name.lower()
                outcomes[name] = outcomes.get(name, 0) + 1
                if head.accepted_result is not None and head.epoch < task.max_epoch:
                    stale += 1
            else:
                reason = (
                    f"{head.phase.name.lower()} by an owner"
                    if head.phase in _LIVE_PHASES
                    else "waiting for a feasible owner"
                )
                pending[reason] = pending.get(reason, 0) + 1
        tasks = list(self._tasks.values())
        agree = [t.agreed - t.submitted for t in tasks if t.agreed is not None]
        first = [t.first_start - t.submitted for t in tasks if t.first_start is not None]
        self._count_members(self.sim.now)
        member_seconds = self._member_seconds
        total = sum(self._window_bytes.values())
        stats: dict[str, int] = {}
        for table in tables:
            for name, value in attrs.asdict(table.statistics()).items():
                stats[name] = stats.get(name, 0) + value
        return {
            "submitted": len(tasks),
            "outcomes": outcomes,
            "pending": pending,
            "lost": lost,
            "accepted_stale_results": stale,
            "replicas_disagree": disagree,
            "agreement_mean": _mean(agree),
            "agreement_max": max(agree, default=None),
            "agreed": len(agree),
            "first_start_mean": _mean(first),
            "duplicate_starts": self.duplicate_starts,
            "duplicate_starts_partitioned": self.duplicate_starts_partitioned,
            "duplicate_starts_connected": self.duplicate_starts - self.duplicate_starts_partitioned,
            "stops": self.stops,
            "failovers": len(self.failovers),
            "failover_mean": _mean(self.failovers),
            "failover_max": max(self.failovers, default=None),
            "crashed_owners_not_failed_over": sum(1 for t in tasks if t.crashed is not None),
            "reruns_after_success": sum(t.reruns for t in tasks),
            "starts_per_task": (sum(t.starts for t in tasks) / len(tasks)) if tasks else None,
            "lease_bytes_per_member_second": (
                total / member_seconds if member_seconds > 0 else None
            ),
            "lease_broadcast_bytes": self._window_bytes["broadcast"],
            "lease_sync_bytes": self._window_bytes["sync"],
            "lease_delta_bytes_mean": (
                self._window_bytes["broadcast"] / self._window_messages["broadcast"]
                if self._window_messages["broadcast"]
                else None
            ),
            "relays_refused": self.relays_refused,
            "drain_seconds": self.drain_seconds,
            "table": stats,
        }


def _forget(disk: dict[str, TaskEntry], tid: str) -> None:
    disk.pop(tid, None)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
