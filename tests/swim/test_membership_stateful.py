"""Hypothesis state machine: real cores under an adversarial in-memory network.

Invariants checked at every step: no incarnation ever goes down, in anybody's view.
After every run: once faults stop, all live members converge to one view. Separately:
a member reachable in a lossless network (however reordered or duplicated) is never
suspected, let alone declared dead.
"""

from __future__ import annotations

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from swim import MemberFailed, MemberSuspected

from .helpers import TEST_CONFIG, Cluster, Network

# Dead members are remembered longer than any run's faults last: a member forgotten by
# every other side can only come back through its driver re-joining (as Serf's reconnect
# does), which is outside the core.
CONFIG = attrs.evolve(TEST_CONFIG, push_pull_interval=5.0, dead_retention=300.0)
SETTLE = 120.0  # simulated seconds without faults before convergence is demanded


class AdversarialNetwork(RuleBasedStateMachine):
    cluster: Cluster

    @initialize(seed=st.integers(0, 2**32 - 1), size=st.integers(3, 5))
    def start(self, seed: int, size: int) -> None:
        self.cluster = Cluster(size, config=CONFIG, seed=seed)
        self.cluster.join_all()
        self.cluster.run(3.0)  # they must have met before faults can be judged
        assert self.cluster.converged()
        self.seen: dict[tuple[str, str], int] = {}
        self.crashed = False

    @rule(
        loss=st.floats(0.0, 0.5),
        duplicate=st.floats(0.0, 0.5),
        jitter=st.floats(0.0, 0.8),
    )
    def set_faults(self, loss: float, duplicate: float, jitter: float) -> None:
        net = self.cluster.network
        net.loss, net.duplicate, net.jitter = loss, duplicate, jitter

    @rule(a=st.integers(0, 4), b=st.integers(0, 4))
    def cut_link(self, a: int, b: int) -> None:
        names = list(self.cluster.nodes)
        self.cluster.network.blocked.add((names[a % len(names)], names[b % len(names)]))

    @precondition(lambda self: not self.crashed)
    @rule(which=st.integers(0, 4))
    def crash(self, which: int) -> None:
        names = list(self.cluster.nodes)
        self.cluster.crash(names[which % len(names)])
        self.crashed = True

    @rule(dt=st.floats(0.05, 8.0))
    def advance(self, dt: float) -> None:
        self.cluster.run(dt)

    @invariant()
    def incarnations_never_go_down(self) -> None:
        for observer, core in self.cluster.nodes.items():
            present = set()
            for member in core.members():
                key = (observer, member.name)
                present.add(key)
                previous = self.seen.get(key, 0)
                assert member.incarnation >= previous, (key, previous, member.incarnation)
                self.seen[key] = member.incarnation
            # A reaped member is forgotten; if it comes back, we start over.
            for key in [k for k in self.seen if k[0] == observer and k not in present]:
                del self.seen[key]

    def teardown(self) -> None:
        cluster = getattr(self, "cluster", None)
        if cluster is None:
            return
        net = cluster.network
        net.loss = net.duplicate = net.jitter = 0.0
        net.blocked.clear()
        cluster.run(SETTLE)
        assert cluster.converged(), {name: cluster.view(name) for name in cluster.live()}


TestAdversarialNetwork = AdversarialNetwork.TestCase
TestAdversarialNetwork.settings = settings(
    max_examples=30,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.integers(2, 6),
    duplicate=st.floats(0.0, 0.5),
    jitter=st.floats(0.0, 0.4),
)
def test_reachable_members_are_never_suspected_in_a_lossless_network(
    seed: int, size: int, duplicate: float, jitter: float
) -> None:
    # Duplication and reordering, but no loss: round trips stay under the probe
    # timeout plus the late-ack window, so no probe may ever fail.
    cluster = Cluster(
        size, config=CONFIG, seed=seed, network=Network(duplicate=duplicate, jitter=jitter)
    )
    cluster.join_all()
    cluster.run(60.0)
    assert cluster.converged()
    assert not cluster.events_of(MemberSuspected)
    assert not cluster.events_of(MemberFailed)
