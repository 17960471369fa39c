"""Running a scenario: formation, the fault timeline, the liveness phase, the result.

A run has three phases, as TigerBeetle's VOPR does:

1. **Formation.** Members start at random times within a short window, each joining
   through a few members that started before it, and the run waits (bounded) until
   every member sees every other alive. Nothing is measured yet.
2. **Timeline (safety).** The scenario's faults, partitions, loss and churn happen at
   their times; in safety mode every core call and every event is checked against the
   invariants. Rates (messages per member per second, false positives per member per
   hour) are measured over this phase only.
3. **Liveness.** Everything heals at once: partitions and loss go away, slow members
   recover, sleepers wake, churn stops. The cluster must converge (every member sees
   exactly the members alive) within `liveness_bound` virtual seconds, or the run
   fails.

A failed run says what broke and ends with "reproduce with --seed N".

Random choices come from child generators (`formation`, `faults`, `churn`), so a
scenario's network and nodes see the same numbers whatever the fault schedule does.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable
from typing import Any

import attrs

from populi_p2p.presets import resolve_preset
from swim import (
    DecodeCache,
    Event,
    Member,
    MemberFailed,
    Membership,
    MemberState,
    SharedView,
    SwimConfig,
)
from swim.rejoin import RejoinConfig, RejoinPolicy, failed_targets

from ._engine import CoreFactory, InvariantViolation, NodeStatus, Simulator
from ._envelope import EnvelopeModel
from ._invariants import IncarnationCheck
from ._leases import LeaseSim, lease_swim_config
from ._metrics import Metrics, Sample
from ._network import Network
from ._rng import child_rng
from ._scenario import FaultSpec, LossSpec, PartitionSpec, Scenario, ScenarioError

__all__ = ["RunResult", "run_once", "run_scenario", "swim_config", "swim_factory"]


@attrs.frozen
class RunResult:
    """The outcome of one run: its parameters, measures, digest, and any failure."""

    scenario: str
    seed: int
    members: int
    lifeguard: bool
    loss: float
    duration: float
    probe_interval: float
    ok: bool
    failure: str | None
    digest: str
    wall_seconds: float
    #: Wall time spent forming the cluster, within `wall_seconds`.
    formation_wall_seconds: float
    virtual_seconds: float
    formation_seconds: float | None
    liveness_seconds: float | None
    measures: dict[str, Any]
    engine: dict[str, Any]
    #: The `SwimConfig` the members ran, as a dict.
    config: dict[str, Any] = attrs.field(factory=dict)
    samples: tuple[Sample, ...] = ()

    def as_dict(self, *, samples: bool = True) -> dict[str, Any]:
        """Plain JSON-able data (samples as parallel lists, to keep files small)."""
        data = attrs.asdict(self, recurse=False)
        data.pop("samples")
        if samples:
            data["samples"] = {
                field.name: [getattr(s, field.name) for s in self.samples]
                for field in attrs.fields(Sample)
            }
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """Rebuild a result from `as_dict()` output (a JSON file), for re-plotting."""
        fields = {f.name for f in attrs.fields(cls)} - {"samples"}
        kwargs = {name: data[name] for name in fields if name in data}
        kwargs.setdefault("formation_wall_seconds", 0.0)
        columns = data.get("samples") or {}
        names = [f.name for f in attrs.fields(Sample)]
        rows = zip(*(columns.get(name, []) for name in names), strict=True) if columns else []
        return cls(**kwargs, samples=tuple(Sample(*row) for row in rows))


def swim_config(scenario: Scenario) -> SwimConfig:
    """The `SwimConfig` a scenario asks for: preset, Lifeguard switch, then overrides.

    Raises:
        ScenarioError: an unknown or invalid `[swim]` field.
    """
    config = resolve_preset(scenario.preset).swim.with_lifeguard(scenario.lifeguard)
    known = {field.name for field in attrs.fields(SwimConfig)}
    for key in scenario.swim:
        if key not in known:
            raise ScenarioError(f"{scenario.name}: [swim] has no field {key!r}")
    try:
        config = attrs.evolve(config, **scenario.swim)
        if scenario.core_invariants:
            config = attrs.evolve(config, check_invariants=True)
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"{scenario.name}: [swim] {exc}") from None
    return config


def swim_factory(config: SwimConfig) -> CoreFactory:
    """Build each node's core as a `swim.Membership` with `config`.

    The cores share one `DecodeCache`: a sync opening goes out as the same bytes to
    several peers, and in one process it is then decoded once, not once per peer.
    """
    cache = DecodeCache()

    def make(
        name: str, address: tuple[str, int], rng: random.Random, now: float, incarnation: int
    ) -> Membership:
        return Membership(
            config, name, address, rng, now, incarnation=incarnation, decode_cache=cache
        )

    return make


#: Allocations between two collections of the youngest generation during a run.
_GC_YOUNG = 20_000


class _Run:
    """One scenario variant, from formation to result."""

    def __init__(self, scenario: Scenario, core_factory: CoreFactory | None) -> None:
        self.scenario = scenario
        self.config = swim_config(scenario)
        seed = scenario.seed
        network = Network(scenario.network, child_rng(seed, "network"))
        factory = core_factory or swim_factory(self.config)
        #: The lease table in every node, when the scenario has `[tasks]`.
        self.leases: LeaseSim | None = None
        if scenario.tasks is not None and core_factory is None:
            self.config = lease_swim_config(self.config, scenario.tasks)

            def factory(*args: Any) -> Membership:
                assert self.leases is not None
                return self.leases.core_factory(self.config)(*args)

        self.sim = Simulator(seed=seed, network=network, core_factory=factory)
        self._index_of = self.sim.name_index.get  # `index_of` without a call per event
        if scenario.tasks is not None and core_factory is None:
            self.leases = LeaseSim(self.sim, scenario.tasks, seed, safety=scenario.safety)
        self.metrics = Metrics(self.sim, capacity=scenario.members)
        self.sim.add_observer(self.metrics)
        if scenario.envelope is not None:
            envelope = EnvelopeModel(scenario.envelope, self.sim, self.metrics)
            self.sim.add_observer(envelope)
            self.sim.set_envelope(envelope.overhead)
            self.metrics.sealed = True
        self.reconnect_rng = child_rng(seed, "reconnect")
        self.failed: dict[int, dict[int, float]] = {}
        # The daemon's join and reconnect policy (swim.RejoinPolicy), one per node life.
        self.rejoin_config = RejoinConfig.for_probe_interval(
            self.config.probe_interval, failed_memory=scenario.reconnect_timeout
        )
        #: How long the daemon waits for a join to take before calling it failed.
        self.join_wait = max(1.0, 5.0 * self.config.probe_interval)
        #: Joins awaiting their verdict: node -> (life, attempt). The daemon's
        #: `_try_join` returns at the first member a lone node holds, or after the wait.
        self.joining: dict[int, tuple[int, int]] = {}
        self.join_attempts = 0
        self.policies: dict[int, RejoinPolicy] = {}
        self.bootstrap: dict[int, list[int]] = {}
        if scenario.reconnect_interval > 0:
            self.sim.add_observer(self)
        if scenario.safety:
            self.sim.add_invariant(IncarnationCheck(self.sim))
        self.formation_rng = child_rng(seed, "formation")
        self.fault_rng = child_rng(seed, "faults")
        self.churn_rng = child_rng(seed, "churn")
        self.started: list[int] = []
        self.healing = False
        self.t0 = 0.0
        self.updates = 0
        self.setup_seconds = 0.0

    ####################################################################################
    # Phases
    ####################################################################################

    def run(self) -> RunResult:
        wall = time.perf_counter()
        scenario = self.scenario
        formation, liveness, failure = self._phases(wall)
        if failure is not None:
            failure += f"; reproduce with --seed {scenario.seed}"
        sim = self.sim
        measures = self.metrics.summary(sim.now, self.config.probe_interval)
        if self.leases is not None:
            leases = measures["leases"] = self.leases.summary()
            if failure is None and leases["violations"]:
                counts = ", ".join(f"{k} {v}" for k, v in leases["invariants"].items() if v)
                failure = (
                    f"leases: {leases['violations']} invariant violations ({counts}): "
                    f"{leases['violation_examples'][0]}; reproduce with --seed {scenario.seed}"
                )
        engine = attrs.asdict(sim.statistics())
        engine["network"] = attrs.asdict(sim.network.statistics())
        return RunResult(
            scenario=scenario.name,
            seed=scenario.seed,
            members=scenario.members,
            lifeguard=scenario.lifeguard,
            loss=scenario.network.loss,
            duration=scenario.duration,
            probe_interval=self.config.probe_interval,
            ok=failure is None,
            failure=failure,
            digest=sim.digest(),
            wall_seconds=time.perf_counter() - wall,
            formation_wall_seconds=self.setup_seconds,
            virtual_seconds=sim.now,
            formation_seconds=formation,
            liveness_seconds=liveness,
            measures=measures,
            engine=engine,
            config=attrs.asdict(self.config),
            samples=tuple(self.metrics.samples),
        )

    def _phases(self, wall: float) -> tuple[float | None, float | None, str | None]:
        """Formation, the timeline, healing until convergence (when the scenario
        checks liveness) and the leases' drain: (formation time, liveness time, what
        failed).

        Formation builds n^2 member records, all of which live for the whole run, and
        almost no cyclic garbage (347 objects at 1,000 members): each time the heap
        grew by a quarter, a full collection walked all of it again (5 s of the
        1,000-member demo), and one more after formation took 1.8 s to find those
        few. So the collector is off while the cluster forms, and what it built is
        frozen uncollected. Both undone in `finally`.
        """
        scenario = self.scenario
        failure: str | None = None
        formation: float | None = None
        liveness: float | None = None
        collecting = gc.isenabled()
        thresholds = gc.get_threshold()
        gc.disable()
        try:
            formation = self._form()
            self.setup_seconds = time.perf_counter() - wall
            # Everything built so far (n cores of n members) lives for the whole run.
            # Without this, every full garbage collection would walk all of it again:
            # at 4,000 members that doubled the run time.
            gc.freeze()
            # Then collect young objects in batches 30 times larger than the default:
            # nearly everything a packet allocates dies by reference counting, and each
            # young collection has a fixed cost (3 s of the 1,000-member demo).
            gc.set_threshold(_GC_YOUNG, *thresholds[1:])
            if collecting:
                gc.enable()
            if formation is None:
                failure = (
                    f"formation: {scenario.members} members did not converge within "
                    f"{scenario.formation.timeout:g}s ({self.metrics.wrong} wrong beliefs)"
                )
            else:
                self._timeline()
                if scenario.liveness:
                    liveness = self._liveness()
                    if liveness is None:
                        failure = (
                            f"liveness: no convergence within {scenario.liveness_bound:g}s "
                            f"after healing ({self.metrics.wrong} wrong beliefs left)"
                        )
                if self.leases is not None and failure is None:
                    self.leases.drain()
        except InvariantViolation as exc:
            failure = f"safety: {exc}"
        finally:
            gc.unfreeze()
            gc.set_threshold(*thresholds)
            if collecting:
                gc.enable()
        return formation, liveness, failure

    def _form(self) -> float | None:
        """Start every member and wait until they all see each other; returns the time."""
        sim = self.sim
        spec = self.scenario.formation
        rng = self.formation_rng
        for _ in range(self.scenario.members):
            sim.add_node()
        if spec.mode == "prime":
            return self._form_primed()
        sim.call_at(0.0, self._start, 0)
        for node in range(1, self.scenario.members):
            sim.call_at(rng.uniform(0.0, spec.window), self._start, node)
        sim.run_until(spec.window)
        self.metrics.expect_convergence(sim.now, "formation", stop=True)
        if not self.metrics.converged:
            sim.run_until(spec.window + spec.timeout)
        if not self.metrics.converged:
            return None
        formed = sim.now
        sim.run_until(formed + spec.settle)
        return formed

    def _form_primed(self) -> float:
        sim = self.sim
        nodes = range(self.scenario.members)
        for node in nodes:
            sim.start(node)
        # One shared, copy-on-write view for every core: 10,000 cores of 10,000 members
        # would otherwise be 100 million member records.
        roster = SharedView(
            [Member(sim.names[node], sim.addresses[node], MemberState.ALIVE, 0) for node in nodes],
            sim.now,
        )
        for node in nodes:
            sim.prime(node, roster)
        if self.scenario.reconnect_interval > 0:
            for node in nodes:
                self._start_policy(node, [], attempted=False)
        self.metrics.assume_converged()
        sim.run_until(self.scenario.formation.settle)
        return 0.0

    def _start(self, node: int) -> None:
        k = min(self.scenario.formation.seeds, len(self.started))
        self._join(node, self.formation_rng.sample(self.started, k))
        self.started.append(node)

    def _join(self, node: int, seeds: list[int]) -> None:
        """Start `node` through `seeds` (its bootstrap list), then run the daemon's
        join and reconnect policy for it: the start is its first attempt, sent (as the
        daemon does) to `first_targets(seeds)`, one of them; a retry tries them all."""
        policy = self._new_policy(node)
        self.sim.start(node, policy.first_targets(seeds))
        self._start_policy(node, seeds, attempted=bool(seeds), policy=policy)

    def _new_policy(self, node: int) -> RejoinPolicy:
        return RejoinPolicy(
            self.rejoin_config, child_rng(self.scenario.seed, f"rejoin-{node}"), self.sim.now
        )

    def _start_policy(
        self, node: int, seeds: list[int], *, attempted: bool, policy: RejoinPolicy | None = None
    ) -> None:
        """A fresh `RejoinPolicy` for the node's new life (or `policy`, made for it just
        before its start); `attempted`: the start sent a join, whose verdict comes after
        the daemon's join wait."""
        sim = self.sim
        self.bootstrap[node] = list(seeds)
        if policy is None:
            policy = self._new_policy(node)
        self.policies[node] = policy
        arg = (node, sim.life(node))
        if attempted:
            self._await_join(arg)
        else:
            policy.on_not_needed(sim.now)
            sim.call_at(policy.next_deadline(), self._rejoin_check, arg)

    def _await_join(self, arg: tuple[int, int]) -> None:
        """A join was sent: its verdict comes after the daemon's join wait or, for a
        node alone until then, at the first member it holds (`on_event`): the daemon's
        `_try_join` returns then. (A node that is not alone gets its verdict at once
        in the daemon; here, as before, after the wait.)"""
        self.join_attempts += 1
        node, life = arg
        attempt = 0  # not watched: decided by the wait alone
        if self.metrics.alive_count(node) == 0:
            attempt = self.join_attempts
            self.joining[node] = (life, attempt)
        self.sim.call_at(self.sim.now + self.join_wait, self._join_waited, (node, life, attempt))

    def _join_waited(self, arg: tuple[int, int, int]) -> None:
        node, life, attempt = arg
        if not attempt or self.joining.get(node) == (life, attempt):
            self._join_result((node, life))  # else decided already, at its first member

    def _join_result(self, arg: tuple[int, int]) -> None:
        """The daemon's `_try_join` verdict: joined when it sees another live member."""
        node, life = arg
        self.joining.pop(node, None)
        sim = self.sim
        if sim.life(node) != life or not sim.status(node).is_member:
            return
        policy = self.policies[node]
        policy.on_result(sim.now, self.metrics.alive_count(node) > 0)
        sim.call_at(policy.next_deadline(), self._rejoin_check, arg)

    def _rejoin_check(self, arg: tuple[int, int]) -> None:
        """`RejoinPolicy`'s check, as the daemon's Bootstrapper runs it: join when alone
        (through the bootstrap list), when members seen failing are still not back
        (through them, as Serf's reconnect does, and the bootstrap list), or when a
        bootstrap peer is not held (through it, `RejoinPolicy.bootstrap_targets`)."""
        node, life = arg
        sim = self.sim
        if sim.life(node) != life or not sim.status(node).is_member:
            return
        policy = self.policies[node]
        alone = self.metrics.alive_count(node) == 0
        failed: list[int] = []
        if self.scenario.reconnect_interval > 0 and node in self.failed:
            failed = failed_targets(self.failed[node], sim.now, policy.config.failed_memory)
        missing: list[int] = []
        if not alone and self.scenario.reconnect_interval > 0:
            # Bootstrap peers it does not hold: a few more joins, backed off, as the
            # daemon's Bootstrapper does (two seeds joined by disjoint joiners would
            # otherwise stay two meshes).
            holds = self.metrics.holds
            missing = policy.bootstrap_targets(
                sim.now, [b for b in self.bootstrap[node] if b != node and not holds(node, b)]
            )
        if not alone and not failed and not missing:
            policy.on_not_needed(sim.now)
            sim.call_at(policy.next_deadline(), self._rejoin_check, arg)
            return
        known = self.bootstrap[node]
        if alone:
            # The daemon also tries the members it remembers (its store): any k here.
            members = sim.nodes_with(NodeStatus.UP, NodeStatus.SLOW)
            k = min(self.scenario.formation.seeds, len(members))
            known = known + self.reconnect_rng.sample(members, k)
        targets = [
            t
            for t in dict.fromkeys([*policy.targets(failed, known, alone=alone), *missing])
            if t != node
        ]
        if not targets:
            policy.on_result(sim.now, False)
            sim.call_at(policy.next_deadline(), self._rejoin_check, arg)
            return
        sim.rejoin(node, targets)
        self._await_join(arg)

    def _timeline(self) -> None:
        sim = self.sim
        scenario = self.scenario
        self.t0 = t0 = sim.now
        end = t0 + scenario.duration
        self.metrics.open_window(t0)
        self._sample(None)
        for fault in scenario.faults:
            when = fault.at
            until = scenario.duration
            if fault.until is not None:
                until = min(fault.until, until)
            while when <= until:
                sim.call_at(t0 + when, self._fault, fault)
                if fault.every is None:
                    break
                when += fault.every
        for number, partition in enumerate(scenario.partitions):
            sim.call_at(t0 + partition.at, self._partition, partition)
            heal = partition.heal if partition.heal is not None else scenario.duration
            sim.call_at(t0 + heal, self._heal_partition, number)
        for lossy in scenario.lossy:
            sim.call_at(t0 + lossy.at, self._lossy, lossy)
        churn = scenario.churn
        if churn is not None:
            for kind, rate in (
                ("join", churn.joins_per_minute),
                ("leave", churn.leaves_per_minute),
                ("crash", churn.crashes_per_minute),
            ):
                if rate > 0:
                    self._next_churn(kind, t0 + churn.start)
        if self.leases is not None:
            self.leases.begin(t0, end)
        sim.run_until(end)
        self.metrics.close_window(sim.now)

    def _liveness(self) -> float | None:
        """Heal everything; returns how long convergence took, or None past the bound."""
        sim = self.sim
        self.healing = True
        sim.note("heal-all", "liveness")
        sim.network.heal()
        sim.network.heal_loss()
        for node in sim.nodes_with(NodeStatus.SLOW):
            sim.clear_slow(node)
        for node in sim.nodes_with(NodeStatus.PAUSED):
            sim.wake(node)
        start = sim.now
        self.metrics.expect_convergence(start, "liveness", stop=True)
        if not self.metrics.converged:
            sim.run_until(start + self.scenario.liveness_bound)
        if not self.metrics.converged:
            return None
        return sim.now - start

    ####################################################################################
    # Timeline actions
    ####################################################################################

    def _members(self) -> list[int]:
        return self.sim.nodes_with(NodeStatus.UP)

    def _targets(self, explicit: tuple[int, ...], count: int) -> list[int]:
        if explicit:
            return list(explicit)
        candidates = self._members()
        return self.fault_rng.sample(candidates, min(count, len(candidates)))

    def _fault(self, fault: FaultSpec) -> None:
        if self.healing:
            return
        sim = self.sim
        for node in self._targets(fault.members, fault.count):
            status = sim.status(node)
            if fault.kind == "crash":
                sim.crash(node)
                if fault.restart_after is not None:
                    sim.call_at(sim.now + fault.restart_after, self._restart, node)
            elif fault.kind == "restart":
                self._restart(node)
            elif fault.kind == "leave":
                sim.leave(node, fault.linger)
            elif fault.kind == "pause":
                assert fault.duration is not None
                if status.is_member:
                    sim.pause(node, fault.duration, clock_stops=fault.clock_stops)
                    # Queued after the engine's own wake-up call, so it runs just after it.
                    sim.call_at(sim.now + fault.duration, self._woke, node)
            elif fault.kind == "stall":
                assert fault.duration is not None
                if status.is_member:
                    sim.stall(node, fault.duration)
            elif fault.kind == "slow":
                if status.is_member:
                    sim.set_slow(node, fault.delay, jitter=fault.jitter)
                    if fault.duration is not None:
                        sim.call_at(sim.now + fault.duration, self._unslow, node)
            elif fault.kind == "update" and status.is_member:
                self.updates += 1
                meta = f"update-{self.updates}".encode()
                self.metrics.note_update(sim.now, node, meta)
                sim.set_meta(node, meta)

    def _restart(self, node: int) -> None:
        sim = self.sim
        if sim.status(node) != NodeStatus.DOWN:
            return
        members = [m for m in sim.nodes_with(NodeStatus.UP, NodeStatus.SLOW) if m != node]
        k = min(self.scenario.formation.seeds, len(members))
        self._join(node, self.fault_rng.sample(members, k))

    def _woke(self, node: int) -> None:
        if self.sim.status(node).is_member:
            self.metrics.expect_convergence(self.sim.now, f"{self.sim.names[node]} woke")

    def _unslow(self, node: int) -> None:
        if self.sim.status(node) == NodeStatus.SLOW:
            self.sim.clear_slow(node)

    def _partition(self, partition: PartitionSpec) -> None:
        if self.healing:
            return
        sim = self.sim
        if partition.members:
            groups = [list(g) for g in partition.members]
        else:
            nodes = list(range(len(sim.names)))
            self.fault_rng.shuffle(nodes)
            total = sum(partition.groups)
            groups, start = [], 0
            for number, share in enumerate(partition.groups):
                last = number == len(partition.groups) - 1
                stop = len(nodes) if last else start + round(len(nodes) * share / total)
                groups.append(sorted(nodes[start:stop]))
                start = stop
        sim.note("partition", [len(g) for g in groups])
        sim.network.partition(groups, one_way=partition.one_way)

    def _heal_partition(self, number: int) -> None:
        if self.healing:
            return
        sim = self.sim
        sim.note("heal", number)
        sim.network.heal()
        self.metrics.expect_convergence(sim.now, f"partition {number + 1} healed")

    def _lossy(self, lossy: LossSpec) -> None:
        if self.healing:
            return
        sim = self.sim
        nodes = self._targets(lossy.members, lossy.count)
        sim.note("lossy", nodes)
        for node in nodes:
            sim.network.set_node_loss(node, ingress=lossy.ingress, egress=lossy.egress)
        if lossy.until is not None:
            sim.call_at(self.t0 + lossy.until, self._lossless, nodes)

    def _lossless(self, nodes: list[int]) -> None:
        self.sim.note("lossless", nodes)
        for node in nodes:
            self.sim.network.set_node_loss(node)

    def _next_churn(self, kind: str, after: float) -> None:
        churn = self.scenario.churn
        assert churn is not None
        rate = {
            "join": churn.joins_per_minute,
            "leave": churn.leaves_per_minute,
            "crash": churn.crashes_per_minute,
        }[kind] / 60.0
        when = after + self.churn_rng.expovariate(rate)
        stop = churn.stop if churn.stop is not None else self.scenario.duration
        if when <= self.t0 + stop:
            self.sim.call_at(when, self._churn, kind)

    def _churn(self, kind: str) -> None:
        if self.healing:
            return
        sim = self.sim
        churn = self.scenario.churn
        assert churn is not None
        members = self._members()
        if kind == "join":
            node = sim.add_node()
            k = min(self.scenario.formation.seeds, len(members))
            self._join(node, self.churn_rng.sample(members, k))
        elif len(members) > churn.min_members:
            node = self.churn_rng.choice(members)
            if kind == "leave":
                sim.leave(node)
            else:
                sim.crash(node)
                if churn.restart_after is not None:
                    sim.call_at(sim.now + churn.restart_after, self._restart, node)
        self._next_churn(kind, sim.now)

    ####################################################################################
    # The driver's reconnect loop
    ####################################################################################

    def on_event(self, now: float, node: int, event: Event) -> None:
        """Remember which members each node saw fail, for the reconnect loop."""
        member = getattr(event, "member", None)
        if member is None:
            return
        joining = self.joining.get(node)
        if (
            joining is not None
            and member.state == MemberState.ALIVE
            and self.metrics.alive_count(node) > 0
        ):
            # The daemon's join returns at its first member: decide now (scheduled, so
            # the verdict does not run inside the core call that emitted the event).
            del self.joining[node]
            self.sim.call_at(self.sim.now, self._join_result, (node, joining[0]))
        if event.__class__ is MemberFailed:
            subject = self._index_of(member.name)
            if subject is not None:
                self.failed.setdefault(node, {})[subject] = now
        elif member.state != MemberState.DEAD:
            failed = self.failed.get(node)
            if failed:  # most events (a cluster forming) find nothing to forget
                subject = self._index_of(member.name)
                if subject is not None:
                    failed.pop(subject, None)

    def on_status(self, now: float, node: int, old: NodeStatus, new: NodeStatus) -> None:
        if old == NodeStatus.DOWN:
            self.failed.pop(node, None)  # a fresh core remembers nobody

    def _sample(self, _: object) -> None:
        self.metrics.sample(self.sim.now - self.t0)
        self.sim.call_at(self.sim.now + self.scenario.sample_interval, self._sample)


def run_once(scenario: Scenario, *, core_factory: CoreFactory | None = None) -> RunResult:
    """Run one scenario (ignoring its sweep) and return the result.

    Args:
        core_factory: build cores some other way than `swim.Membership` (tests use
            this to drive the engine with a stand-in core).

    Raises:
        ScenarioError: the scenario's `[swim]` table is invalid.
    """
    return _Run(scenario, core_factory).run()


def run_scenario(
    scenario: Scenario,
    *,
    core_factory: CoreFactory | None = None,
    progress: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Run every variant of `scenario` (one, or each point of its sweep), in order."""
    results = []
    for variant in scenario.variants():
        result = run_once(variant, core_factory=core_factory)
        if progress is not None:
            progress(result)
        results.append(result)
    return results
