"""The swim application channel in the simulator: a broadcast spreads through a cluster.

The simulated network has latency, loss and duplication, unlike the in-memory `Cluster`
of tests/swim, and the cores run on offset clocks. An application that re-broadcasts
what is new to it (as the lease table will) must reach every member.
"""

from __future__ import annotations

import random

import attrs

from simulations import Network, NetworkConfig, NodeStatus, Simulator, child_rng
from swim import Address, AppMessage, Event, Membership, SwimConfig

CONFIG = attrs.evolve(SwimConfig.lan(), app_channel_enabled=True, check_invariants=True)


class Echo:
    """The application on every node: dedupe by key, re-broadcast once."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.seen: dict[int, set[str]] = {}

    def originate(self, node: int, key: str, payload: bytes) -> None:
        self.seen.setdefault(node, set()).add(key)
        core = self.sim.cores[node]
        assert isinstance(core, Membership)
        core.broadcast_app(key, payload, self.sim.local_time(node))

    def on_event(self, now: float, node: int, event: Event) -> None:
        if isinstance(event, AppMessage) and event.key not in self.seen.setdefault(node, set()):
            self.originate(node, event.key, event.payload)

    def on_status(self, now: float, node: int, old: NodeStatus, new: NodeStatus) -> None:
        pass


def test_an_app_broadcast_spreads_through_a_simulated_cluster() -> None:
    def factory(
        name: str, address: Address, rng: random.Random, now: float, incarnation: int
    ) -> Membership:
        return Membership(CONFIG, name, address, rng, now, incarnation=incarnation)

    seed = 7
    net = Network(NetworkConfig(loss=0.02, duplicate=0.01), child_rng(seed, "network"))
    sim = Simulator(seed=seed, network=net, core_factory=factory)
    echo = Echo(sim)
    sim.add_observer(echo)
    n = 40
    for _ in range(n):
        sim.add_node()
    sim.start(0)
    for node in range(1, n):
        sim.start(node, seeds=[0])
    sim.run_until(10.0)
    for node in range(1, n):  # a lost join datagram: the driver retries (item 4's job)
        core = sim.cores[node]
        if isinstance(core, Membership) and core.num_alive() == 1:
            sim.rejoin(node, [0])
    start = 20.0  # a rumor that missed a member waits for a push-pull: allow a few
    while start < 120.0:
        sim.run_until(start)
        if all(isinstance(c, Membership) and c.num_alive() == n for c in sim.cores):
            break
        start += 10.0
    assert all(isinstance(core, Membership) and core.num_alive() == n for core in sim.cores), (
        "the cluster did not converge before the broadcast"
    )
    sim.call_at(start, lambda _: echo.originate(13, "lease/1", b"owner=m13 epoch=1"))
    sim.run_until(start + 20.0)
    assert all(echo.seen.get(node) == {"lease/1"} for node in range(n)), sorted(
        node for node in range(n) if echo.seen.get(node) != {"lease/1"}
    )
