"""The engine on its own, driven by a stand-in core (no swim protocol involved)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulations import Network, NetworkConfig, NodeStatus, Simulator, child_rng
from swim import Address

from .sim_fakes import ACK, PING, PingCore


def make_sim(
    n: int,
    *,
    seed: int = 1,
    network: NetworkConfig | None = None,
    reliable_pings: bool = False,
) -> tuple[Simulator, list[Address]]:
    peers: list[Address] = []

    def factory(
        name: str, address: Address, rng: random.Random, now: float, incarnation: int
    ) -> PingCore:
        return PingCore(name, address, rng, now, incarnation, peers, reliable_pings=reliable_pings)

    net = Network(network or NetworkConfig(), child_rng(seed, "network"))
    sim = Simulator(seed=seed, network=net, core_factory=factory)
    for _ in range(n):
        sim.add_node()
    peers.extend(sim.addresses)
    return sim, peers


def core(sim: Simulator, node: int) -> PingCore:
    c = sim.cores[node]
    assert isinstance(c, PingCore)
    return c


def test_ticks_fire_at_the_requested_local_deadline_despite_clock_offsets() -> None:
    sim, _ = make_sim(3)
    for node in range(3):
        sim.start(node)
    sim.run_until(10.0)
    for node in range(3):
        c = core(sim, node)
        # Ten pings each, every tick at or after the deadline it asked for, never early.
        assert len(c.ticks) == 10
        offset = sim.local_time(node) - sim.now
        assert offset >= 1.0e4  # a large random monotonic offset
        first = c.created
        assert all(t >= first for t in c.ticks)
        gaps = [later - earlier for earlier, later in zip(c.ticks, c.ticks[1:], strict=False)]
        assert gaps == pytest.approx([1.0] * 9)
    offsets = {sim.local_time(node) - sim.now for node in range(3)}
    assert len(offsets) == 3  # nodes disagree on `now`


def test_datagrams_arrive_after_latency_and_are_acked() -> None:
    config = NetworkConfig(latency_min=0.01, latency_mean=0.02)
    sim, peers = make_sim(2, network=config)
    sim.start(0)
    sim.start(1)
    sim.run_until(5.0)
    for node in range(2):
        c = core(sim, node)
        pings = [r for r in c.received if r[2][:1] == PING]
        acks = [r for r in c.received if r[2][:1] == ACK]
        assert len(pings) == 5 and len(acks) == 5
        assert {r[1] for r in c.received} == {peers[1 - node]}
    stats = sim.statistics()
    assert stats.messages_sent == 20
    assert stats.deliveries == 20


def test_same_seed_same_digest_different_seed_different_digest() -> None:
    def digest(seed: int) -> str:
        sim, _ = make_sim(20, seed=seed, network=NetworkConfig(loss=0.1, duplicate=0.05))
        for node in range(20):
            sim.start(node)
        sim.run_until(30.0)
        return sim.digest()

    assert digest(5) == digest(5)
    assert digest(5) != digest(6)


def test_loss_and_duplication_rates_follow_the_config() -> None:
    config = NetworkConfig(loss=0.2, duplicate=0.1)
    sim, _ = make_sim(50, network=config)
    for node in range(50):
        sim.start(node)
    sim.run_until(100.0)
    stats = sim.network.statistics()
    assert stats.routed > 8000
    assert stats.lost / stats.routed == pytest.approx(0.2, abs=0.02)
    delivered = stats.routed - stats.lost
    assert stats.duplicated / delivered == pytest.approx(0.1, abs=0.02)


def test_crash_stops_a_node_and_messages_to_it_are_dropped() -> None:
    sim, _ = make_sim(5)
    for node in range(5):
        sim.start(node)
    sim.run_until(5.0)
    crashed = core(sim, 2)
    received = len(crashed.received)
    sim.crash(2)
    assert sim.status(2) == NodeStatus.DOWN and sim.cores[2] is None
    sim.run_until(30.0)
    assert len(crashed.received) == received
    assert sim.statistics().dropped_at_down_node > 0
    # A restart is a fresh core with a higher incarnation and the same name/address.
    sim.start(2)
    assert core(sim, 2) is not crashed
    assert core(sim, 2).incarnation == crashed.incarnation + 1
    assert sim.life(2) == 2


def test_pause_receives_nothing_runs_no_timers_and_its_clock_stops() -> None:
    sim, _ = make_sim(4)
    for node in range(4):
        sim.start(node)
    sim.run_until(10.0)
    sleeper = core(sim, 1)
    local_before = sim.local_time(1)
    ticks, received = len(sleeper.ticks), len(sleeper.received)
    sim.pause(1, 20.0, clock_stops=True)
    sim.run_until(29.9)
    assert sim.status(1) == NodeStatus.PAUSED
    assert len(sleeper.ticks) == ticks and len(sleeper.received) == received
    sim.run_until(30.0)
    assert sim.status(1) == NodeStatus.UP
    # The sleeper woke with a tick, and its monotonic clock did not count the sleep.
    assert sleeper.ticks[-1] == pytest.approx(local_before, abs=1e-6)
    sim.run_until(40.0)
    assert len(sleeper.received) > received


def test_a_stalled_node_ticks_late_then_reads_what_waited() -> None:
    """A stall: no timers and no reads for its duration while the clock runs on; at
    its end one tick (everything overdue) comes first, then the queued packets, in
    arrival order."""
    sim, _ = make_sim(4, network=NetworkConfig(latency_min=0.001, latency_mean=0.001))
    for node in range(4):
        sim.start(node)
    sim.run_until(10.0)
    stalled = core(sim, 1)
    calls: list[tuple[str, float]] = []
    tick, receive = stalled.tick, stalled.receive

    def logged_tick(now: float) -> list[Any]:
        calls.append(("tick", now))
        return tick(now)

    def logged_receive(source: Address, payload: bytes, now: float, **kw: bool) -> list[Any]:
        calls.append(("receive", now))
        return receive(source, payload, now, **kw)

    stalled.tick = logged_tick  # type: ignore[method-assign]
    stalled.receive = logged_receive  # type: ignore[method-assign]
    sim.stall(1, 3.0)
    sim.run_until(12.999)
    assert sim.status(1) == NodeStatus.SLOW  # a member, not a failure
    assert calls == []
    sim.run_until(13.0)
    woke = sim.local_time(1)  # the clock kept counting through the stall
    assert sim.status(1) == NodeStatus.UP
    assert calls[0] == ("tick", woke)  # the overdue timers first ...
    assert calls[1] == ("receive", woke)  # ... then what waited, all of it now
    assert all(at == woke for _, at in calls)
    sim.run_until(20.0)
    assert calls[-1][1] > woke  # back to normal: ticks and reads as they come


def test_slow_node_handles_messages_late_and_in_order() -> None:
    config = NetworkConfig(latency_min=0.001, latency_mean=0.001)
    sim, _ = make_sim(6, network=config)
    for node in range(6):
        sim.start(node)
    sim.set_slow(0, 0.7)
    sim.run_until(20.0)
    slow = core(sim, 0)
    assert sim.status(0) == NodeStatus.SLOW
    offset = sim.local_time(0) - sim.now
    # Every ack to the slow node's own pings is handled >= 0.7 s after the ping left.
    pings_sent = slow.ticks
    acks = [r[0] for r in slow.received if r[2][:1] == ACK]
    assert acks
    for ack in acks:
        sent = max(t for t in pings_sent if t <= ack)
        assert ack - sent >= 0.7
    handled = [r[0] for r in slow.received]
    assert handled == sorted(handled)
    assert offset > 0
    sim.clear_slow(0)
    assert sim.status(0) == NodeStatus.UP


def test_a_slow_node_with_a_cost_handles_one_message_at_a_time() -> None:
    """`cost` and `cost_per_byte` make a slow node a CPU: each message holds it for its
    cost, so messages that arrive together are handled one cost apart, and a node
    that receives more than it can handle falls further behind (the start storm)."""
    config = NetworkConfig(latency_min=0.001, latency_mean=0.001)
    sim, _ = make_sim(6, network=config)
    for node in range(6):
        sim.start(node)
    sim.set_slow(0, 0.0, cost=0.05, cost_per_byte=0.001)
    sim.run_until(20.0)
    slow = core(sim, 0)
    handled = [r[0] for r in slow.received]
    assert handled == sorted(handled)
    # Each message costs 0.05 s plus 1 ms per byte: consecutive ones at least that apart.
    sizes = [len(r[2]) for r in slow.received]
    gaps = [b - a for a, b in itertools.pairwise(handled)]
    assert all(
        gap >= 0.05 + 0.001 * size - 1e-9 for gap, size in zip(gaps, sizes[1:], strict=False)
    )
    assert len(handled) < 20.0 / (0.05 + 0.001 * min(sizes)) + 1


def test_partition_blocks_datagrams_between_groups_only() -> None:
    sim, peers = make_sim(6)
    for node in range(6):
        sim.start(node)
    sim.network.partition([[0, 1, 2], [3, 4, 5]])
    sim.run_until(30.0)
    for node in range(6):
        side = {0, 1, 2} if node < 3 else {3, 4, 5}
        sources = {peers.index(r[1]) for r in core(sim, node).received}
        assert sources <= side
    assert sim.network.statistics().blocked > 0


def test_one_way_partition_lets_traffic_through_in_one_direction() -> None:
    sim, _ = make_sim(2)
    network = sim.network
    network.partition([[0], [1]], one_way=True)
    assert not network.reachable(0, 1)
    assert network.reachable(1, 0)
    network.heal()
    assert network.reachable(0, 1)


def test_stream_to_a_down_node_fails_after_the_connect_timeout() -> None:
    config = NetworkConfig(connect_timeout=2.5)
    sim, peers = make_sim(2, network=config, reliable_pings=True)
    sim.start(0)  # node 1 never starts: every reliable ping to it must fail
    sim.run_until(10.0)
    sender = core(sim, 0)
    assert sender.failed, "send_failed was never called"
    offset = sim.local_time(0) - sim.now
    for when, destination in sender.failed:
        assert destination == peers[1]
        # It failed connect_timeout after the tick that sent the ping, not at once.
        assert any(abs(when - 2.5 - sent) < 1e-6 for sent in sender.ticks)
        assert not any(abs(when - sent) < 1e-6 for sent in sender.ticks)
    assert offset > 0
    assert sim.statistics().stream_failures == len(sender.failed)


def test_streams_are_delivered_reliably_despite_datagram_loss() -> None:
    config = NetworkConfig(loss=0.5)
    sim, _ = make_sim(2, network=config, reliable_pings=True)
    sim.start(0)
    sim.start(1)
    sim.run_until(10.0)
    received = core(sim, 1).received
    streamed = [r for r in received if r[3]]
    assert len(streamed) == 10  # every reliable ping arrived, flagged reliable


def test_call_at_runs_in_time_then_insertion_order() -> None:
    sim, _ = make_sim(1)
    seen: list[str] = []
    sim.call_at(2.0, seen.append, "b")
    sim.call_at(1.0, seen.append, "a")
    sim.call_at(2.0, seen.append, "c")
    sim.run_until(5.0)
    assert seen == ["a", "b", "c"]
    assert sim.now == 5.0


def test_stop_returns_early() -> None:
    sim, _ = make_sim(1)
    sim.call_at(3.0, lambda _: sim.stop())
    assert sim.run_until(100.0) is True
    assert sim.now == 3.0


_ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(
            ["crash", "start", "pause", "wake", "slow", "unslow", "stall", "leave", "cut"]
        ),
        st.integers(0, 5),
        st.floats(0.0, 3.0),
    ),
    max_size=25,
)


def _replay(actions: list[tuple[str, int, float]], seed: int) -> tuple[str, list[NodeStatus]]:
    sim, _ = make_sim(6, seed=seed, network=NetworkConfig(loss=0.1, duplicate=0.1))
    for node in range(6):
        sim.start(node)
    t = 0.0
    for action, node, gap in actions:
        t += gap
        sim.run_until(t)
        status = sim.status(node)
        if action == "crash":
            sim.crash(node)
        elif action == "start" and status == NodeStatus.DOWN:
            sim.start(node, [0, 1])
        elif action == "pause":
            sim.pause(node, gap + 0.5, clock_stops=bool(node % 2))
        elif action == "wake":
            sim.wake(node)
        elif action == "slow":
            sim.set_slow(node, gap, jitter=0.1)
        elif action == "unslow":
            sim.clear_slow(node)
        elif action == "stall":
            sim.stall(node, gap + 0.5)
        elif action == "leave":
            sim.leave(node, linger=gap)
        elif action == "cut":
            sim.network.partition([[0, 1, 2], [3, 4, 5]], one_way=bool(node % 2))
    sim.run_until(t + 10.0)
    return sim.digest(), [sim.status(node) for node in range(6)]


@settings(max_examples=30, deadline=None)
@given(actions=_ACTIONS, seed=st.integers(0, 1000))
def test_any_fault_sequence_runs_and_replays_identically(
    actions: list[tuple[str, int, float]], seed: int
) -> None:
    first = _replay(actions, seed)
    assert first == _replay(actions, seed)
    # Local clocks only ever move forward, whatever happened.
    sim, _ = make_sim(1, seed=seed)
    sim.start(0)
    sim.pause(0, 5.0)
    before = sim.local_time(0)
    sim.run_until(10.0)
    assert sim.local_time(0) >= before
