"""The stall guard: a node starved of CPU does not blame its members for its own lateness.

Sans-IO: the tests drive one core with a `now` that jumps, as a daemon's clock does
when its event loop got no CPU for seconds. The daemon's driver, woken late, ticks the
due timers and only then reads the packets that arrived meanwhile (those not yet in
its inbox): the tests deliver the answer after the late tick, which is the order that
turned a starved accuser's lateness into false deaths.
"""

from __future__ import annotations

import random

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swim import MemberFailed, Membership, MemberState, MemberSuspected, Send, SwimConfig
from swim._math import suspicion_timeout_min
from swim.probe import ProbeRound
from swim.suspicion import Suspicion
from swim.wire import Ack, Alive, IndirectPing, Ping, Suspect, decode_packet, encode

from .helpers import TEST_CONFIG

GUARDED = TEST_CONFIG
UNGUARDED = attrs.evolve(TEST_CONFIG, stall_guard_enabled=False)


def core_with(config: SwimConfig, members: int = 4) -> Membership:
    core = Membership(config, "me", ("10.0.0.1", 1), random.Random(7), 0.0)
    for i in range(members):
        core.receive(("x", 1), encode(Alive(f"m{i}", 0, (f"10.0.1.{i}", 1), b"")), 0.0)
    return core


def run_on_time(
    core: Membership, until: float, *, answer: bool = True, lateness: float = 0.0
) -> list[object]:
    """Tick at every deadline up to `until` (plus `lateness`), acking every direct ping
    when `answer`; returns the outputs."""
    outputs: list[object] = []
    while (deadline := core.next_deadline()) is not None and deadline <= until:
        now = deadline + lateness
        for out in core.tick(now):
            outputs.append(out)
            if answer and isinstance(out, Send) and not out.reliable:
                first = decode_packet(out.payload)[0]
                if isinstance(first, Ping):
                    outputs += core.receive(out.destination, encode(Ack(first.seq)), now + 0.01)
    return outputs


def failed(outputs: list[object], name: str) -> bool:
    return any(isinstance(o, MemberFailed) and o.member.name == name for o in outputs)


def suspected(outputs: list[object], name: str) -> bool:
    return any(isinstance(o, MemberSuspected) and o.member.name == name for o in outputs)


def suspicion_deadline(core: Membership, name: str) -> float:
    suspicion = core._members[name].suspicion  # white box: when it is due
    assert suspicion is not None
    return suspicion.deadline


####################################################################################
# Suspicions
####################################################################################


@pytest.mark.parametrize("guard", [True, False])
def test_a_starved_accuser_does_not_declare_a_live_member_dead(guard: bool) -> None:
    """m0 refutes before its suspicion runs out, but we were stalled from before the
    refute to after the deadline: woken, we tick first and read the refute after.
    Without the guard that declares m0 dead (the control: the false death this guard
    exists for); with it the suspicion is pushed back and the refute wins."""
    core = core_with(GUARDED if guard else UNGUARDED)
    core.receive(("x", 1), encode(Suspect("m0", 0, "m1")), 0.0)
    deadline = suspicion_deadline(core, "m0")
    outputs = run_on_time(core, deadline - 1.0)
    woke = deadline + 2.0  # no CPU from deadline - 1 to here
    outputs += core.tick(woke)
    refute = encode(Alive("m0", 1, ("10.0.1.0", 1), b""))  # arrived at deadline - 0.5
    outputs += core.receive(("10.0.1.0", 1), refute, woke + 0.001)
    outputs += run_on_time(core, woke + 60.0)
    assert failed(outputs, "m0") is not guard
    member = core.member("m0")
    assert member is not None and member.state is MemberState.ALIVE  # the refute won
    stats = core.statistics()
    assert stats.suspicions_postponed == (1 if guard else 0)
    assert stats.stalls == (1 if guard else 0)


def test_a_crash_is_still_declared_dead_at_most_one_stall_later() -> None:
    """The same stall with no refute ever: m0 is declared dead once the stall has been
    given back, no later."""
    core = core_with(GUARDED)
    core.receive(("x", 1), encode(Suspect("m0", 0, "m1")), 0.0)
    deadline = suspicion_deadline(core, "m0")
    run_on_time(core, deadline - 1.0)
    stall = 3.0  # the earliest due deadline is at or after deadline - 1
    woke = deadline + 2.0
    assert not failed(core.tick(woke), "m0")
    moved = suspicion_deadline(core, "m0")
    assert woke < moved <= woke + stall
    outputs = run_on_time(core, moved)
    assert failed(outputs, "m0")
    member = core.member("m0")
    assert member is not None and member.state is MemberState.DEAD


@given(
    stalls=st.lists(st.floats(0.0, 6.0), min_size=1, max_size=40),
    every=st.integers(1, 5),
)
@settings(max_examples=60, deadline=None)
def test_a_node_that_keeps_stalling_still_reaches_a_verdict(
    stalls: list[float], every: int
) -> None:
    """However often the node stalls, a suspicion nobody refutes ends in a death no
    later than its deadline plus its minimum timeout (the most the guard gives back in
    all) plus the lateness of the ticks after the deadline; and the lateness of ticks
    before the threshold changes nothing."""
    core = core_with(GUARDED)
    core.receive(("x", 1), encode(Suspect("m0", 0, "m1")), 0.0)
    deadline = suspicion_deadline(core, "m0")
    timeout_min = suspicion_timeout_min(GUARDED.suspicion_mult, 5, GUARDED.probe_interval)
    run_on_time(core, deadline - 0.5)
    lateness_after = 0.0
    ticks = 0
    died_at = None
    while died_at is None:
        due = core.next_deadline()
        assert due is not None
        late = stalls[ticks % len(stalls)] if ticks % every == 0 else 0.0
        ticks += 1
        now = due + late
        if now >= deadline:
            lateness_after += late
        if failed(core.tick(now), "m0"):
            died_at = now
        assert ticks < 10_000
    assert died_at <= deadline + timeout_min + lateness_after + 1e-6
    if all(s <= GUARDED.stall_threshold for s in stalls):
        assert core.statistics().suspicions_postponed == 0


def test_confirmations_do_not_take_back_a_postponement() -> None:
    suspicion = Suspicion("a", 2, 4.0, 24.0, now=0.0)
    assert suspicion.postpone(30.0, 3.0)
    assert suspicion.deadline == 33.0
    assert suspicion.confirm("b", 30.5)
    assert suspicion.deadline == 33.0
    # At most the minimum timeout in all, then the suspicion may expire.
    assert suspicion.postpone(33.0, 3.0)  # 1.0 of the 4.0 left
    assert suspicion.deadline == 34.0
    assert suspicion.postponed == 4.0
    assert not suspicion.postpone(34.0, 3.0)


####################################################################################
# Probes
####################################################################################


def ping_then_indirect(core: Membership) -> tuple[ProbeRound[str], Send]:
    """Tick on time until a direct ping goes out and its probe goes indirect; the
    probe and one indirect-ping request sent to a helper."""
    for _ in range(200):
        now = core.next_deadline()
        assert now is not None
        core.tick(now)
        probe = core._probe  # white box: the round in flight
        if probe is not None:
            break
    assert probe is not None
    while not probe.indirect:
        now = core.next_deadline()
        assert now is not None
        outputs = core.tick(now)
    requests = [
        o
        for o in outputs
        if isinstance(o, Send)
        and not o.reliable
        and isinstance(decode_packet(o.payload)[0], IndirectPing)
    ]
    assert requests
    return probe, requests[0]


@pytest.mark.parametrize("guard", [True, False])
def test_a_probe_round_that_ends_during_a_stall_reads_its_ack_first(guard: bool) -> None:
    """A helper relayed the target's ack before the round ended, but we were stalled
    until after the end: woken, we tick first. Without the guard the target becomes
    suspect; with it the round is stretched and the ack counts."""
    core = core_with(GUARDED if guard else UNGUARDED)
    probe, request = ping_then_indirect(core)
    woke = probe.round_end + 2.0
    outputs = core.tick(woke)
    outputs += core.receive(request.destination, encode(Ack(probe.seq)), woke + 0.001)
    outputs += run_on_time(core, woke + 5.0)
    assert suspected(outputs, probe.target) is not guard
    stats = core.statistics()
    assert stats.probes_stretched == (1 if guard else 0)
    assert (stats.probes_failed == 0) is guard
    assert stats.probes_acked_late == (1 if guard else 0)


def test_a_probe_of_a_crashed_member_fails_once_the_stall_is_given_back() -> None:
    core = core_with(GUARDED)
    probe, _ = ping_then_indirect(core)
    woke = probe.round_end + 2.0
    assert not suspected(core.tick(woke), probe.target)
    assert woke < probe.round_end <= woke + probe.phase  # stretched by min(stall, phase)
    end = probe.round_end
    outputs = run_on_time(core, end, answer=False)
    assert suspected(outputs, probe.target)
    assert core.statistics().probes_failed == 1


def test_a_round_is_stretched_once() -> None:
    probe = ProbeRound("t", 1, now=0.0, timeout=0.5, interval=1.0)
    probe.go_indirect(0.5)
    assert probe.stretch(3.0, 2.5)
    assert probe.round_end == 3.5  # the stall, but no more than the indirect phase
    assert not probe.stretch(6.0, 2.0)
    assert probe.round_end == 3.5


####################################################################################
# Awareness and configuration
####################################################################################


@given(late=st.floats(0.0, 10.0))
@settings(max_examples=60, deadline=None)
def test_a_stalled_tick_costs_one_awareness_point_and_an_on_time_one_none(late: float) -> None:
    core = core_with(GUARDED)
    run_on_time(core, 5.0)
    assert core.awareness == 0
    due = core.next_deadline()
    assert due is not None
    core.tick(due + late)
    stalled = late > GUARDED.stall_threshold
    assert core.awareness == (1 if stalled else 0)
    assert core.statistics().stalls == (1 if stalled else 0)


def test_without_awareness_a_stall_moves_no_score() -> None:
    core = core_with(attrs.evolve(GUARDED, awareness_enabled=False))
    run_on_time(core, 5.0)
    due = core.next_deadline()
    assert due is not None
    core.tick(due + 3.0)
    assert core.statistics().stalls == 1
    assert core.awareness == 0


def test_stall_guard_presets_and_switch() -> None:
    lan, wan, local = SwimConfig.lan(), SwimConfig.wan(), SwimConfig.local()
    for preset in (lan, wan, local):
        assert preset.stall_guard_enabled
        assert preset.stall_threshold == preset.probe_timeout / 2
    assert SwimConfig() == lan
    off = lan.with_lifeguard(False)
    assert not off.stall_guard_enabled
    assert off.with_lifeguard(True).stall_guard_enabled
    with pytest.raises(ValueError, match="stall_threshold must be > 0"):
        attrs.evolve(lan, stall_threshold=0.0)
