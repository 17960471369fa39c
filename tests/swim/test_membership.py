"""The core end to end: N real cores through the in-memory `Cluster`."""

from __future__ import annotations

import random

import attrs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from swim import (
    DecodeError,
    Member,
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberRecovered,
    Membership,
    MemberState,
    MemberSuspected,
    MemberUpdated,
    SelfRefuted,
    Send,
    SharedView,
    SwimConfig,
)
from swim._math import retransmit_limit
from swim.wire import (
    Ack,
    Alive,
    IndirectPing,
    Left,
    Nack,
    Ping,
    PushPull,
    Suspect,
    Sync,
    decode_packet,
    encode,
)

from .helpers import TEST_CONFIG, Cluster, Network

ALIVE, SUSPECT, DEAD, LEFT = (
    MemberState.ALIVE,
    MemberState.SUSPECT,
    MemberState.DEAD,
    MemberState.LEFT,
)


def joined(n: int, *, config: SwimConfig = TEST_CONFIG, seed: int = 0, **net: object) -> Cluster:
    cluster = Cluster(n, config=config, seed=seed, network=Network(**net))  # type: ignore[arg-type]
    cluster.join_all()
    cluster.run(3.0)
    assert cluster.converged()
    return cluster


def seen(cluster: Cluster, observer: str, subject: str) -> Member:
    member = cluster.member(observer, subject)
    assert member is not None, f"{observer} does not know {subject}"
    return member


def decoded(send: Send) -> list[object]:
    return list(decode_packet(send.payload))


####################################################################################
# Joining and failure detection
####################################################################################


def test_join_converges_and_announces_everyone() -> None:
    cluster = joined(5)
    for name in cluster.nodes:
        assert cluster.nodes[name].num_alive() == 5
        assert cluster.nodes[name].num_members() == 5
        announced = {o for at, o in cluster.events_of(MemberJoined) if o == name}
        assert announced == {name}
    assert len(cluster.events_of(MemberJoined)) == 5 * 4
    assert not cluster.events_of(MemberSuspected)


def test_crash_is_detected_by_everyone_and_nobody_else_is_suspected() -> None:
    cluster = joined(6)
    cluster.crash("node-4")
    crashed_at = cluster.now
    cluster.run(30.0)
    assert cluster.everyone_sees("node-4", DEAD)
    failures = cluster.failures_of("node-4")
    assert {observer for _, observer in failures} == set(cluster.live())
    # Bound: a probe reaches it within 2 rounds of 5 members, then the suspicion
    # (max = 6 * 4 * log10(7) s, shortened by confirmations) runs out.
    assert max(at for at, _ in failures) - crashed_at < 2 * 5 + 6 * 4 * 0.85
    assert {e.member.name for _, _, e in cluster.events if isinstance(e, MemberFailed)} == {
        "node-4"
    }


def test_late_ack_still_counts() -> None:
    # RTT 0.6 s: every ack lands after the 0.5 s probe timeout, inside the 1 s period.
    config = attrs.evolve(TEST_CONFIG, reliable_probe_enabled=False, indirect_checks=0)
    cluster = Cluster(2, config=config, network=Network(latency=0.3))
    cluster.join_all()
    cluster.run(20.0)
    assert cluster.converged()
    assert not cluster.events_of(MemberSuspected)
    assert all(core.statistics().probes_acked_late > 5 for core in cluster.nodes.values())


def test_rtt_is_the_smoothed_round_trip_of_direct_probes() -> None:
    cluster = joined(3)  # 2 ms each way
    cluster.run(3.0)
    for name, core in cluster.nodes.items():
        assert core.rtt(name) is None  # never ourselves
        for other in cluster.nodes:
            if other != name:
                assert core.rtt(other) == pytest.approx(0.004)
                assert seen(cluster, name, other).rtt == core.rtt(other)
    assert {m.name: m.rtt for m in cluster.nodes["node-1"].members()} == {
        "node-1": None,
        "node-2": cluster.nodes["node-1"].rtt("node-2"),
        "node-3": cluster.nodes["node-1"].rtt("node-3"),
    }
    # The path slows down to 20 ms: the estimate follows, an eighth per sample.
    cluster.network.latency = 0.010
    cluster.run(30.0)
    for name, core in cluster.nodes.items():
        for other in cluster.nodes:
            if other != name:
                rtt = core.rtt(other)
                assert rtt is not None and 0.015 < rtt < 0.020


def tick_to_ping(core: Membership) -> tuple[float, Ping]:
    """Tick a core until it starts a probe; the time and the ping it sent."""
    while True:
        deadline = core.next_deadline()
        assert deadline is not None
        for out in core.tick(deadline):
            if isinstance(out, Send) and not out.reliable:
                message = decoded(out)[0]
                if isinstance(message, Ping):
                    return deadline, message


def test_rtt_samples_only_acks_that_come_before_the_probe_timeout() -> None:
    core = lone_core(members=1)
    for sample in (0.030, 0.010):
        started, ping = tick_to_ping(core)
        core.receive(("10.0.1.0", 1), encode(Ack(ping.seq)), started + sample)
    assert core.rtt("m0") == pytest.approx(0.030 + (0.010 - 0.030) / 8)
    assert [m.rtt for m in core.members()] == [None, core.rtt("m0")]  # ourselves first
    # An ack after the direct phase may come through a helper: it is no sample.
    started, ping = tick_to_ping(core)
    core.tick(started + 0.6)  # past probe_timeout (0.5 s): the indirect phase
    core.receive(("10.0.1.0", 1), encode(Ack(ping.seq)), started + 0.7)
    assert core.statistics().probes_acked_late == 1
    assert core.rtt("m0") == pytest.approx(0.0275)


def test_indirect_probe_saves_a_member_we_cannot_reach_directly() -> None:
    config = attrs.evolve(TEST_CONFIG, reliable_probe_enabled=False)
    cluster = joined(3, config=config)
    cluster.network.datagram_blocked |= {("node-1", "node-2"), ("node-2", "node-1")}
    cluster.run(20.0)
    assert not cluster.events_of(MemberSuspected)
    stats = cluster.nodes["node-1"].statistics()
    assert stats.indirect_probes_sent > 0
    assert stats.probes_acked_late > 0  # answered through node-3, after the timeout


def test_reliable_fallback_probe_saves_a_member_behind_a_udp_block() -> None:
    config = attrs.evolve(TEST_CONFIG, indirect_checks=0)
    cluster = joined(2, config=config)
    cluster.network.datagram_blocked |= {("node-1", "node-2"), ("node-2", "node-1")}
    cluster.run(15.0)
    assert not cluster.events_of(MemberSuspected)
    reliable_pings = [
        send
        for _, name, send in cluster.sent
        if name == "node-1" and send.reliable and isinstance(decoded(send)[0], Ping)
    ]
    assert reliable_pings
    assert all(send.destination == cluster.nodes["node-2"].address for send in reliable_pings)
    # The ack to a ping that came over a stream goes back over a stream.
    assert any(
        send.reliable and isinstance(decoded(send)[0], Ack)
        for _, name, send in cluster.sent
        if name == "node-2"
    )


def test_without_reliable_fallback_a_udp_block_means_suspicion() -> None:
    config = attrs.evolve(TEST_CONFIG, indirect_checks=0, reliable_probe_enabled=False)
    cluster = joined(2, config=config)
    cluster.network.datagram_blocked |= {("node-1", "node-2"), ("node-2", "node-1")}
    cluster.run(5.0)
    assert cluster.events_of(MemberSuspected)
    assert not any(
        send.reliable and isinstance(decoded(send)[0], Ping) for *_, send in cluster.sent
    )


####################################################################################
# Suspicion, refutation, leave, rejoin, reaping
####################################################################################


def test_suspected_member_refutes_and_stays_alive() -> None:
    cluster = joined(4)
    cluster.inject("node-1", Suspect("node-2", 0, "node-3"))
    cluster.run(5.0)
    assert cluster.nodes["node-2"].incarnation == 1
    assert any(
        isinstance(e, SelfRefuted) and e.incarnation == 1
        for _, name, e in cluster.events
        if name == "node-2"
    )
    assert cluster.converged()
    assert all(seen(cluster, o, "node-2").incarnation == 1 for o in cluster.live())
    assert not cluster.events_of(MemberFailed)
    recovered = cluster.events_of(MemberRecovered, "node-2")
    assert "node-1" in {o for _, o in recovered}


def test_graceful_leave_is_not_a_failure() -> None:
    cluster = joined(4)
    leaver = cluster.nodes["node-3"]
    cluster.apply("node-3", leaver.leave(cluster.now))
    assert leaver.has_left
    cluster.run(5.0)
    assert cluster.everyone_sees("node-3", LEFT)
    assert {o for _, o in cluster.events_of(MemberLeft, "node-3")} == {"node-1", "node-2", "node-4"}
    assert not cluster.events_of(MemberFailed)
    assert not cluster.events_of(MemberSuspected)
    # Once its news is out, the leaver has nothing left to do.
    assert leaver.next_deadline() is None
    with pytest.raises(ValueError, match="after leaving"):
        leaver.set_meta(b"x", cluster.now)


def test_a_member_that_missed_a_leave_is_reminded_when_it_suspects_the_leaver() -> None:
    """Every copy of a left rumor can miss one member; its suspicion of the leaver is then
    answered with the left, so it records `left`, not `dead` (tests/mesh/test_membership.py)."""
    cluster = joined(3)
    blocked = cluster.network.datagram_blocked
    blocked.update({("node-2", "node-1"), ("node-3", "node-1")})  # node-1 hears nothing
    leaver = cluster.nodes["node-3"]
    cluster.apply("node-3", leaver.leave(cluster.now))
    cluster.run(6.0)  # node-2's copies of the left rumor are all spent meanwhile
    assert cluster.states("node-2", "node-3") == LEFT
    assert cluster.states("node-1", "node-3") != LEFT  # it heard none of it
    cluster.crash("node-3")
    blocked.clear()
    for _ in range(400):  # bounded: at most 200 s of virtual time
        if cluster.states("node-1", "node-3") in (LEFT, DEAD):
            break
        cluster.run(0.5)
    assert cluster.states("node-1", "node-3") == LEFT
    assert cluster.nodes["node-2"].statistics().left_reminders >= 1
    assert not cluster.events_of(MemberFailed, "node-3")


def left_rumors_sent(cluster: Cluster, name: str) -> list[float]:
    """When `name` sent its own left rumor, one entry per copy."""
    return [
        at
        for at, sender, send in cluster.sent
        if sender == name
        for message in decoded(send)
        if isinstance(message, Left) and message.name == name
    ]


def test_leave_announced_once_the_left_rumor_was_sent_its_transmit_limit() -> None:
    config = attrs.evolve(TEST_CONFIG, dead_retention=600.0)
    cluster = joined(6, config=config)
    # A dead member keeps a reap timer running in everybody's core for 10 minutes.
    cluster.crash("node-6")
    while not cluster.everyone_sees("node-6", DEAD):
        cluster.step(cluster.now + 60.0)
    leaver = cluster.nodes["node-3"]
    assert not leaver.leave_announced  # not leaving at all
    cluster.apply("node-3", leaver.leave(cluster.now))
    assert leaver.has_left and not leaver.leave_announced
    while not leaver.leave_announced:
        assert cluster.step(cluster.now + 10.0), "the leave must complete by itself"
    announced_at = cluster.now
    # Sent exactly as often as the limit for the 4 live members it left behind, plus
    # one direct datagram to each of them (not to the dead node-6) when it left.
    sent = left_rumors_sent(cluster, "node-3")
    assert len(sent) == retransmit_limit(config.retransmit_mult, 4) + 4
    assert leaver.statistics().leaves_sent_direct == 4
    assert max(sent) == announced_at
    assert announced_at - min(sent) < 2.0  # a few gossip rounds, not a timeout
    # next_deadline() cannot say so: the reap timer of node-6 is still pending.
    assert leaver.next_deadline() is not None
    cluster.run(5.0)
    assert len(left_rumors_sent(cluster, "node-3")) == len(sent)  # nothing more about us
    assert cluster.everyone_sees("node-3", LEFT)


@given(
    n=st.integers(min_value=2, max_value=9),
    crashed=st.integers(min_value=0, max_value=7),
    seed=st.integers(min_value=0, max_value=2**16),
)
@settings(max_examples=25, deadline=None)
def test_leave_sends_its_left_once_to_every_live_member(n: int, crashed: int, seed: int) -> None:
    """Every member the leaver holds as alive or suspect gets exactly one datagram that
    carries only the leaver's `left`; members it holds as dead get none."""
    cluster = joined(n, seed=seed)
    leaver_name = "node-1"
    for index in range(2, 2 + min(crashed, n - 1)):
        cluster.crash(f"node-{index}")
    cluster.run(2.0)  # some crashed members suspected, maybe some dead, by node-1
    leaver = cluster.nodes[leaver_name]
    live = {
        m.address for m in leaver.members() if m.name != leaver_name and m.state in (ALIVE, SUSPECT)
    }
    outputs = leaver.leave(cluster.now)
    sends = [o for o in outputs if isinstance(o, Send)]
    direct = sends[len(sends) - len(live) :]  # after the first gossip round, in leave()
    assert sorted(send.destination for send in direct) == sorted(live)
    left = Left(leaver_name, leaver.incarnation)
    assert all(decoded(send) == [left] and not send.reliable for send in direct)
    assert leaver.statistics().leaves_sent_direct == len(live)
    # The gossip round before them went to at most `gossip_nodes` members.
    assert len(sends) - len(direct) <= leaver.config.gossip_nodes


def test_a_member_that_missed_every_left_rumor_records_the_direct_left() -> None:
    """node-1 gets none of the gossip about node-3's leave, only its direct datagram:
    it records `left` at once, and never suspects or declares node-3 dead."""
    cluster = joined(5)
    blocked = cluster.network.datagram_blocked
    blocked.update({(other, "node-1") for other in ("node-2", "node-4", "node-5")})
    leaver = cluster.nodes["node-3"]
    outputs = leaver.leave(cluster.now)
    # The direct datagrams close the outputs, one per live member: drop every other
    # send to node-1 (the first gossip round may have picked it).
    first_direct = len(outputs) - leaver.statistics().leaves_sent_direct
    node_1 = cluster.nodes["node-1"].address
    cluster.apply(
        "node-3",
        [
            o
            for i, o in enumerate(outputs)
            if i >= first_direct or not (isinstance(o, Send) and o.destination == node_1)
        ],
    )
    blocked.add(("node-3", "node-1"))  # and none of the later gossip rounds either
    cluster.run(0.1)
    assert cluster.states("node-1", "node-3") == LEFT
    while not leaver.leave_announced:
        assert cluster.step(cluster.now + 10.0)
    cluster.crash("node-3")
    blocked.clear()
    cluster.run(60.0)
    # Left, or already reaped after `dead_retention`; never dead.
    assert all(cluster.states(o, "node-3") in (LEFT, None) for o in cluster.live())
    assert not cluster.events_of(MemberFailed, "node-3")
    assert not cluster.events_of(MemberSuspected, "node-3")
    assert {o for _, o in cluster.events_of(MemberLeft, "node-3")} == {
        "node-1",
        "node-2",
        "node-4",
        "node-5",
    }


def test_leave_with_nobody_to_tell_is_announced_at_once() -> None:
    core = Membership(TEST_CONFIG, "me", ("10.0.0.1", 1), random.Random(1), 0.0)
    core.leave(0.0)
    assert core.leave_announced


def test_restarted_member_refutes_its_death_with_a_higher_incarnation() -> None:
    cluster = joined(4)
    cluster.crash("node-2")
    cluster.run(30.0)
    assert cluster.everyone_sees("node-2", DEAD)
    # The new process forgot everything, including its incarnation.
    reborn = cluster.restart("node-2")
    assert reborn.incarnation == 0
    cluster.join("node-2", "node-1")
    cluster.run(5.0)
    assert cluster.converged()
    assert reborn.incarnation >= 1
    assert all(seen(cluster, o, "node-2").incarnation == reborn.incarnation for o in cluster.live())
    assert {o for _, o in cluster.events_of(MemberRecovered, "node-2")} == {
        "node-1",
        "node-3",
        "node-4",
    }


def test_restart_before_detection_with_new_meta_is_refuted_above_the_old_run() -> None:
    cluster = joined(3)
    first = cluster.nodes["node-3"]
    cluster.apply("node-3", first.set_meta(b"run-1", cluster.now))
    cluster.run(3.0)
    assert seen(cluster, "node-1", "node-3").incarnation == 1
    reborn = cluster.restart("node-3", meta=b"run-2")  # incarnation 0 again
    cluster.join("node-3", "node-1")
    cluster.run(5.0)
    assert reborn.incarnation == 2  # above the old run's 1
    for observer in ("node-1", "node-2"):
        member = cluster.member(observer, "node-3")
        assert member is not None and (member.incarnation, member.meta) == (2, b"run-2")


def test_dead_members_are_reaped_after_retention() -> None:
    config = attrs.evolve(TEST_CONFIG, dead_retention=10.0)
    cluster = joined(4, config=config)
    cluster.run(5.0)
    assert cluster.nodes["node-1"].rtt("node-4") is not None
    cluster.crash("node-4")
    while len(cluster.failures_of("node-4")) < 3:
        cluster.step(cluster.now + 60.0)
    last_failure = max(at for at, _ in cluster.failures_of("node-4"))
    assert cluster.everyone_sees("node-4", DEAD)  # retained: a late rumor cannot revive it
    cluster.inject("node-1", Alive("node-4", 0, cluster.nodes["node-4"].address, b""))
    assert cluster.states("node-1", "node-4") is DEAD
    cluster.run_until(last_failure + 10.5)
    for observer in cluster.live():
        assert cluster.member(observer, "node-4") is None
        core = cluster.nodes[observer]
        assert core.rtt("node-4") is None  # forgotten with the member
        assert core.statistics().members_reaped == 1
        assert core.num_members() == core.num_alive() == 3


def test_stale_rumor_after_reap_cannot_lower_an_incarnation() -> None:
    # Found by the simulator's swarm (seeds 117, 124, 161, 178): a member reaped at
    # incarnation k came back through a stale rumor at a lower incarnation.
    config = attrs.evolve(TEST_CONFIG, dead_retention=10.0)
    cluster = joined(4, config=config)
    cluster.apply("node-4", cluster.nodes["node-4"].set_meta(b"v2", cluster.now))
    cluster.run(3.0)
    assert seen(cluster, "node-1", "node-4").incarnation == 1
    cluster.crash("node-4")
    cluster.run(60.0)
    assert all(cluster.member(o, "node-4") is None for o in cluster.live())  # reaped
    address = cluster.nodes["node-4"].address
    cluster.inject("node-1", Alive("node-4", 0, address, b"v1"))  # the stale rumor
    assert cluster.member("node-1", "node-4") is None
    assert cluster.nodes["node-1"].statistics().stale_rumors_ignored == 1
    # A real restart that forgot its incarnation is told it is dead and refutes above.
    reborn = cluster.restart("node-4")
    cluster.join("node-4", "node-1")
    cluster.run(10.0)
    assert reborn.incarnation >= 2
    assert cluster.converged()
    assert all(seen(cluster, o, "node-4").incarnation == reborn.incarnation for o in cluster.live())


def test_reaped_memory_is_bounded() -> None:
    config = attrs.evolve(TEST_CONFIG, dead_retention=5.0, reaped_memory_max=2)
    cluster = joined(5, config=config)
    for name in ("node-3", "node-4", "node-5"):
        cluster.crash(name)
    cluster.run(60.0)
    assert cluster.nodes["node-1"].statistics().members_reaped == 3
    assert len(cluster.nodes["node-1"]._reaped) == 2


def test_partition_heals_through_push_pull() -> None:
    config = attrs.evolve(TEST_CONFIG, push_pull_interval=5.0, dead_retention=60.0)
    cluster = joined(6, config=config)
    left, right = ["node-1", "node-2", "node-3"], ["node-4", "node-5", "node-6"]
    cluster.partition(left, right)
    cluster.run(40.0)
    assert all(cluster.states("node-1", name) is DEAD for name in right)
    assert all(cluster.states("node-6", name) is DEAD for name in left)
    cluster.heal()
    cluster.run(30.0)
    assert cluster.converged()


####################################################################################
# Metadata, push-pull, dissemination
####################################################################################


def test_metadata_change_reaches_everyone() -> None:
    cluster = joined(5)
    core = cluster.nodes["node-2"]
    assert core.set_meta(b"gpu=a100", cluster.now) == []
    assert core.incarnation == 1
    cluster.run(3.0)
    for observer in cluster.live():
        if observer != "node-2":
            member = cluster.member(observer, "node-2")
            assert member is not None and member.meta == b"gpu=a100"
    assert len(cluster.events_of(MemberUpdated, "node-2")) == 4


def test_large_metadata_travels_reliably() -> None:
    cluster = joined(4)
    big = bytes(range(256)) * 12  # 3 KiB: over the 1400-byte packet budget
    cluster.nodes["node-1"].set_meta(big, cluster.now)
    cluster.run(3.0)
    assert all(seen(cluster, o, "node-1").meta == big for o in cluster.live())
    oversize = [s for _, n, s in cluster.sent if n == "node-1" and len(s.payload) > 1400]
    assert oversize and all(s.reliable for s in oversize)
    with pytest.raises(ValueError, match="meta_size_max"):
        cluster.nodes["node-1"].set_meta(b"x" * 4097, cluster.now)


def test_datagrams_never_exceed_the_packet_budget() -> None:
    config = attrs.evolve(TEST_CONFIG, packet_budget=300)
    cluster = Cluster(0, config=config)
    for i in range(25):
        cluster.add(f"a-rather-long-member-name-{i:03d}")
    cluster.join_all()
    cluster.run(10.0)
    assert cluster.converged()
    datagrams = [s for *_, s in cluster.sent if not s.reliable]
    assert datagrams and max(len(s.payload) for s in datagrams) <= 300
    assert any(len(decoded(s)) > 3 for s in datagrams)  # compound packets do happen


def test_push_pull_merges_views_both_ways() -> None:
    config = attrs.evolve(TEST_CONFIG, check_invariants=True)
    rng = random.Random(3)
    a = Membership(config, "a", ("10.0.0.1", 1), random.Random(rng.random()), 0.0)
    b = Membership(config, "b", ("10.0.0.2", 1), random.Random(rng.random()), 0.0, meta=b"m")
    b.receive(("x", 1), encode(Alive("c", 4, ("10.0.0.3", 1), b"")), 0.0)
    (request,) = a.join([b.address, a.address], 0.0)  # our own address is skipped
    assert isinstance(request, Send) and request.destination == b.address
    assert isinstance(decoded(request)[0], Sync)
    reply = [o for o in b.receive(a.address, request.payload, 0.1) if isinstance(o, Send)]
    assert [s.destination for s in reply] == [a.address]
    events = a.receive(b.address, reply[0].payload, 0.2)
    joined_names = sorted(e.member.name for e in events if isinstance(e, MemberJoined))
    assert joined_names == ["b", "c"]
    assert a.member("b") == Member("b", ("10.0.0.2", 1), ALIVE, 0, b"m", 0.2)
    assert b.member("a") is not None and b.num_alive() == 3


def test_a_legacy_push_pull_is_still_merged_and_answered_in_kind() -> None:
    core = Membership(TEST_CONFIG, "a", ("10.0.0.1", 1), random.Random(1), 0.0)
    state = (("b", ("10.0.0.2", 1), 3, int(ALIVE), b"m"),)
    join = encode(PushPull(True, False, "b", ("10.0.0.2", 1), state))
    out = core.receive(("10.0.0.2", 1), join, 0.0)  # a join, from the address it names
    member = core.member("b")
    assert member is not None and member.incarnation == 3
    (reply,) = [o for o in out if isinstance(o, Send)]
    assert isinstance(decoded(reply)[0], PushPull) and reply.destination == ("10.0.0.2", 1)


def test_dead_entry_in_push_pull_is_only_suspected() -> None:
    core = Membership(TEST_CONFIG, "a", ("10.0.0.1", 1), random.Random(1), 0.0)
    core.receive(("x", 1), encode(Alive("c", 1, ("10.0.0.3", 1), b"")), 0.0)
    state = (("c", ("10.0.0.3", 1), 1, int(DEAD), b""),)
    core.receive(("x", 1), encode(PushPull(False, True, "b", ("10.0.0.2", 1), state)), 0.0)
    member = core.member("c")
    assert member is not None and member.state is SUSPECT


####################################################################################
# Lifeguard
####################################################################################


def lone_core(config: SwimConfig = TEST_CONFIG, members: int = 2) -> Membership:
    core = Membership(config, "me", ("10.0.0.1", 1), random.Random(7), 0.0)
    for i in range(members):
        core.receive(("x", 1), encode(Alive(f"m{i}", 0, (f"10.0.1.{i}", 1), b"")), 0.0)
    return core


def run_alone(core: Membership, until: float, answer: bool = False) -> list[object]:
    """Tick a core with nobody answering (or, with answer=True, acking every ping)."""
    outputs: list[object] = []
    while (deadline := core.next_deadline()) is not None and deadline <= until:
        for out in core.tick(deadline):
            outputs.append(out)
            if answer and isinstance(out, Send) and not out.reliable:
                first = decoded(out)[0]
                if isinstance(first, Ping):
                    core.receive(out.destination, encode(Ack(first.seq)), deadline + 0.01)
    return outputs


def tick_until_probe_fails(core: Membership, nack: bool) -> None:
    """Tick a lone core through its first failed probe, nacking indirect pings if asked."""
    while core.statistics().probes_failed == 0:
        deadline = core.next_deadline()
        assert deadline is not None
        for out in core.tick(deadline):
            if nack and isinstance(out, Send) and not out.reliable:
                for message in decoded(out):
                    if isinstance(message, IndirectPing):
                        assert message.nack is True
                        core.receive(out.destination, encode(Nack(message.seq)), deadline + 0.01)


def test_failed_probe_raises_awareness_by_the_missing_nacks() -> None:
    core = lone_core(members=3)
    tick_until_probe_fails(core, nack=False)
    assert core.statistics().indirect_probes_sent == 2
    assert core.awareness == 2  # two helpers asked, no nack came back


def test_without_nacks_a_failed_probe_costs_one() -> None:
    core = lone_core(attrs.evolve(TEST_CONFIG, nack_enabled=False), members=3)
    tick_until_probe_fails(core, nack=False)
    assert core.awareness == 1


def test_refutes_raise_awareness_and_successful_probes_lower_it() -> None:
    core = lone_core(members=3)
    for incarnation in range(3):
        core.receive(("x", 1), encode(Suspect("me", incarnation, "m0")), 0.0)
    assert core.incarnation == 3
    assert core.awareness == 3
    run_alone(core, 30.0, answer=True)
    assert core.awareness == 0


def test_awareness_scales_the_probe_interval() -> None:
    core = lone_core(members=3)
    for incarnation in range(4):  # four refutes: score 4, period 5 s
        core.receive(("x", 1), encode(Suspect("me", incarnation, "m0")), 0.0)
    assert core.awareness == 4
    sends = [o for o in run_alone(core, 20.0) if isinstance(o, Send) and not o.reliable]
    probes = [s for s in sends if isinstance(decoded(s)[0], Ping)]
    # Every failed probe raises the score further: at most 20 / 5 probes in 20 s.
    assert 1 <= len(probes) <= 4


def test_nacks_spare_our_awareness() -> None:
    core = lone_core(members=3)
    tick_until_probe_fails(core, nack=True)
    assert core.statistics().nacks_received == 2
    assert core.awareness == 0  # the helpers proved our own network works


def test_awareness_disabled_stays_zero() -> None:
    core = lone_core(attrs.evolve(TEST_CONFIG, awareness_enabled=False))
    run_alone(core, 10.0)
    assert core.statistics().probes_failed > 0
    assert core.awareness == 0


@pytest.mark.parametrize("buddy", [True, False])
def test_buddy_system_tells_the_suspect_first(buddy: bool) -> None:
    config = attrs.evolve(TEST_CONFIG, buddy_enabled=buddy)
    core = lone_core(config, members=9)  # big enough for a 25 s suspicion
    core.receive(("x", 1), encode(Suspect("m0", 0, "someone")), 0.0)
    # Let gossip exhaust the queued suspect rumor, answering every probe.
    run_alone(core, 3.0, answer=True)
    sends = run_alone(core, 20.0, answer=True)
    pings = [
        decoded(o)
        for o in sends
        if isinstance(o, Send) and o.destination == ("10.0.1.0", 1) and not o.reliable
    ]
    pings = [p for p in pings if isinstance(p[0], Ping)]
    assert pings
    carries = [len(p) > 1 and p[1] == Suspect("m0", 0, "me") for p in pings]
    assert all(carries) if buddy else not any(carries)


@pytest.mark.parametrize("dynamic", [True, False])
def test_dynamic_suspicion_starts_long_and_shrinks_with_confirmations(dynamic: bool) -> None:
    config = attrs.evolve(TEST_CONFIG, dynamic_suspicion_enabled=dynamic)
    core = lone_core(config, members=9)  # n = 10: min = 4 * log10(11) = 4.17 s
    core.receive(("x", 1), encode(Suspect("m0", 0, "s1")), 0.0)
    timeout_min = 4 * 1.0413926851582251
    deadline = core.next_deadline()
    suspicion = core._members["m0"].suspicion  # white box: the deadline itself
    assert suspicion is not None
    expected = 6 * timeout_min if dynamic else timeout_min
    assert suspicion.deadline == pytest.approx(expected)
    for source in ("s2", "s2", "s3"):
        core.receive(("x", 1), encode(Suspect("m0", 0, source)), 0.5)
    if dynamic:  # k = 2 confirmations reached: down to the minimum
        assert suspicion.confirmations == 2
        assert suspicion.deadline == pytest.approx(timeout_min, abs=1e-3)
    else:
        assert suspicion.deadline == pytest.approx(timeout_min)
    assert deadline is not None
    # Ticked on time (a late tick would be a stall, which the stall guard forgives).
    early = run_alone(core, timeout_min - 0.01)
    assert not any(isinstance(o, MemberFailed) and o.member.name == "m0" for o in early)
    outputs = run_alone(core, timeout_min + 0.01)
    assert any(isinstance(o, MemberFailed) and o.member.name == "m0" for o in outputs)


####################################################################################
# Robustness and driver contract
####################################################################################


def test_bad_input_is_dropped_and_counted_never_raised() -> None:
    core = lone_core()
    assert core.receive(("x", 1), b"\x01garbage", 0.0) == []
    assert core.receive(("x", 1), b"", 0.0) == []
    assert core.receive(("x", 1), encode(Ping(1, "not-me", "m0", ("10.0.1.0", 1))), 0.0) == []
    big_meta = Alive("m0", 9, ("10.0.1.0", 1), b"x" * 5000)
    assert core.receive(("x", 1), encode(big_meta), 0.0) == []
    stats = core.statistics()
    assert (stats.dropped_malformed, stats.dropped_misdirected, stats.dropped_invalid) == (2, 1, 1)
    member = core.member("m0")
    assert member is not None and member.incarnation == 0
    with pytest.raises(DecodeError):
        decode_packet(b"\x01garbage")


def test_replies_go_to_the_advertised_address_only_from_its_host() -> None:
    """A ping over a stream comes from an ephemeral port: the ack goes to the address
    it names, on that host. A datagram from elsewhere than the held address is
    answered where it came from (`swim._reply`)."""
    core = lone_core()
    ping = encode(Ping(42, "me", "m0", ("10.0.1.0", 1)))
    (ack,) = core.receive(("10.0.1.0", 1), ping, 0.0)
    assert isinstance(ack, Send)
    assert ack.destination == ("10.0.1.0", 1) and not ack.reliable
    assert decoded(ack)[0] == Ack(42)
    (ack,) = core.receive(("10.0.1.0", 55555), ping, 0.0, reliable=True)
    assert isinstance(ack, Send) and ack.reliable and ack.destination == ("10.0.1.0", 1)
    (ack,) = core.receive(("10.0.1.0", 55555), ping, 0.0)
    assert isinstance(ack, Send) and ack.destination == ("10.0.1.0", 55555)
    assert not ack.reliable and len(ack.payload) <= len(ping)


def test_indirect_probe_requests_are_bounded_and_relayed() -> None:
    config = attrs.evolve(TEST_CONFIG, indirect_pending_max=2)
    core = lone_core(config)
    request = IndirectPing(7, "m1", ("10.0.1.1", 1), True, "m0", ("10.0.1.0", 1))
    outputs = [core.receive(("10.0.1.0", 1), encode(request), 0.0) for _ in range(3)]
    assert [len(o) for o in outputs] == [1, 1, 0]
    assert core.statistics().dropped_indirect_full == 1
    (relayed,) = outputs[0]
    assert isinstance(relayed, Send) and relayed.destination == ("10.0.1.1", 1)
    ping = decoded(relayed)[0]
    assert isinstance(ping, Ping) and ping.target == "m1" and ping.source_address == core.address
    # The target answers us: we forward the ack under the requester's sequence number.
    (forwarded,) = core.receive(("10.0.1.1", 1), encode(Ack(ping.seq)), 0.1)
    assert isinstance(forwarded, Send) and forwarded.destination == ("10.0.1.0", 1)
    assert decoded(forwarded)[0] == Ack(7)
    # The second request gets no answer: a nack goes back after the probe timeout.
    nacks = [o for o in core.tick(0.0 + config.probe_timeout) if isinstance(o, Send)]
    assert any(decoded(s)[0] == Nack(7) and s.destination == ("10.0.1.0", 1) for s in nacks)


def test_send_failed_is_counted() -> None:
    core = lone_core()
    assert core.send_failed(("10.0.1.0", 1), b"x", 0.0) == []
    assert core.statistics().send_failures == 1


def test_same_seed_same_run_different_seed_different_run() -> None:
    def trace(seed: int) -> list[tuple[float, str, bytes, bool]]:
        cluster = Cluster(5, seed=seed, network=Network(loss=0.05, jitter=0.01))
        cluster.join_all()
        cluster.run(4.0)
        cluster.crash("node-2")
        cluster.run(10.0)
        return [(at, name, s.payload, s.reliable) for at, name, s in cluster.sent]

    assert trace(11) == trace(11)
    assert trace(11) != trace(12)


def test_next_deadline_is_when_something_is_due() -> None:
    core = lone_core()
    deadline = core.next_deadline()
    assert deadline is not None
    assert core.tick(deadline - 1e-3) == []  # nothing is due before the deadline
    assert core.next_deadline() == deadline
    assert core.tick(deadline)  # the first probe goes out
    later = core.next_deadline()
    assert later is not None and later > deadline


def test_prime_from_a_shared_view_is_copy_on_write() -> None:
    cluster = Cluster(0)
    for i in range(1, 9):
        cluster.add(f"node-{i}")
    members = [Member(n, c.address, ALIVE, 0) for n, c in cluster.nodes.items()]
    view = SharedView(members, cluster.now)
    for core in cluster.nodes.values():
        core.prime(view, cluster.now)
    assert cluster.converged()
    assert all(core.num_alive() == core.num_members() == 8 for core in cluster.nodes.values())
    cluster.crash("node-5")
    cluster.run(30.0)
    assert cluster.everyone_sees("node-5", DEAD)
    assert {o for _, o in cluster.failures_of("node-5")} == set(cluster.live())
    assert not cluster.events_of(MemberJoined)  # priming is silent
    # The shared records were never written: each core copied before changing.
    assert all(node.state is ALIVE and node.incarnation == 0 for node in view.nodes.values())


def test_invariant_checker_catches_corruption() -> None:
    core = lone_core()
    core._check_invariants()
    core._counts[0] += 1  # white box: simulate a bookkeeping bug
    with pytest.raises(AssertionError, match="state counts"):
        core._check_invariants()


def test_constructor_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="meta_size_max"):
        Membership(TEST_CONFIG, "a", ("h", 1), random.Random(0), 0.0, meta=b"x" * 5000)
    with pytest.raises(ValueError, match="incarnation"):
        Membership(TEST_CONFIG, "a", ("h", 1), random.Random(0), 0.0, incarnation=-1)


def test_fault_hooks_are_consulted() -> None:
    class Faults:
        def __init__(self) -> None:
            self.fanouts = 0

        def gossip_fanout(self, fanout: int) -> int:
            self.fanouts += 1
            return 1

        def drop_refute(self) -> bool:
            return True

    faults = Faults()
    core = Membership(TEST_CONFIG, "me", ("10.0.0.1", 1), random.Random(7), 0.0, faults=faults)
    for i in range(4):
        core.receive(("x", 1), encode(Alive(f"m{i}", 0, (f"10.0.1.{i}", 1), b"")), 0.0)
    assert core.receive(("x", 1), encode(Suspect("me", 0, "m1")), 0.0) == []  # refute dropped
    assert core.incarnation == 0
    deadline = core.next_deadline()
    gossip = []
    while deadline is not None and deadline < 0.25:
        gossip += [o for o in core.tick(deadline) if isinstance(o, Send)]
        deadline = core.next_deadline()
    assert faults.fanouts >= 1
    assert len({s.destination for s in gossip if isinstance(decoded(s)[0], Alive)}) <= 1


def tick_until_ping(core: Membership) -> tuple[float, Send, Ping]:
    """Tick on time until the core sends a direct probe; when, to whom, and the ping."""
    for _ in range(100):
        now = core.next_deadline()
        assert now is not None
        for out in core.tick(now):
            if isinstance(out, Send) and not out.reliable:
                message = decoded(out)[0]
                if isinstance(message, Ping):
                    return now, out, message
    raise AssertionError("no ping sent")


@given(
    late=st.floats(min_value=0.0, max_value=30.0),
    answer=st.booleans(),
    answer_after=st.floats(0.0, 0.49),
)
@settings(max_examples=80, deadline=None)
def test_a_starved_node_gives_its_indirect_phase_its_full_length(
    late: float, answer: bool, answer_after: float
) -> None:
    """A node that only gets to run long after its probe timeout (starved of CPU) still
    gives the helpers the whole indirect phase, and a late ack within it counts; it
    never suspects the target in the tick that sent the indirect pings."""
    core = lone_core(members=3)
    config = core.config
    assume(abs(late - config.probe_timeout) > 1e-6)
    start, ping_send, ping = tick_until_ping(core)
    woke = start + config.probe_timeout + late  # the tick we got, `late` past timeout_at
    due = core.next_deadline()  # the earliest deadline (a gossip round may come first)
    assert due is not None
    assume(abs(woke - due - config.stall_threshold) > 1e-6)
    outputs = core.tick(woke)
    assert core.statistics().indirect_probes_sent == 2
    assert not [o for o in outputs if isinstance(o, MemberSuspected)]
    stalled = woke - due > config.stall_threshold  # the stall guard's evidence
    assert core.awareness == (1 if stalled else 0)
    assert core.statistics().stalls == (1 if stalled else 0)
    assert core.statistics().probes_ended_late == (1 if late > config.probe_timeout else 0)
    phase_end = max(
        start + config.probe_interval, woke + config.probe_interval - config.probe_timeout
    )
    if answer:
        core.receive(ping_send.destination, encode(Ack(ping.seq)), woke + answer_after)
        assert core.statistics().probes_acked_late == 1
    while (deadline := core.next_deadline()) is not None and deadline < phase_end - 1e-6:
        core.tick(deadline)
    assert core.statistics().probes_failed == 0
    core.tick(phase_end + 1e-6)
    assert core.statistics().probes_failed == (0 if answer else 1)
