"""Renewals by digest (`leases.renewals`): once a replica renewed an owner's set in
full, later rounds send 16 bytes instead of the list; a replica holding another set
answers `missed` and the owner sends the full list at once, so no lease lapses; a
digest renews only what its sender was granted; long lists go in parts; a lease a
replica never granted is not named there again; a steady owner renews every
`lease_renew_steady`, and every `lease_renew_interval` after a round that missed; after
a round that renewed everything only a majority is asked to answer, and a lost answer
makes the next round ask everyone."""

from __future__ import annotations

import itertools
from typing import Any

import attrs
from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.leases import LeaseConfig
from populi_p2p.leases.agent_commands import SendTo
from populi_p2p.leases.agent_wire import (
    GrantRequest,
    Offer,
    Renew,
    RenewAnswer,
    RenewDigest,
    decode,
    encode,
)
from populi_p2p.leases.grants import Ended, GrantRecord, Refusal
from populi_p2p.leases.renewals import (
    RENEW_CHUNK,
    RenewalRounds,
    answering,
    lease_digest,
    refused_for_good,
    renewable,
    steady_round,
)

from .agent_harness import Cluster
from .test_agent_wire import SIG, SPEC


def _pairs(n: int, epoch: int = 1) -> list[tuple[str, int]]:
    return [(f"{i:032x}", epoch) for i in range(n)]


def test_a_clean_full_round_earns_a_digest_and_any_refusal_or_miss_loses_it() -> None:
    rounds = RenewalRounds(keep_for=10.0)
    pairs = _pairs(3)
    [(node, first)] = rounds.messages({"r": pairs}, 0.0)
    assert node == "r" and isinstance(first, Renew) and first.leases == tuple(pairs)
    rounds.answered("r", RenewAnswer(first.seq, ()))
    [(_, second)] = rounds.messages({"r": pairs}, 1.0)
    assert isinstance(second, RenewDigest)
    assert (second.count, second.digest) == (3, lease_digest(reversed(pairs)))
    rounds.answered("r", RenewAnswer(second.seq, (), missed=True))
    [(_, third)] = rounds.messages({"r": pairs}, 2.0)
    assert isinstance(third, Renew), "a miss: the full list again"
    rounds.answered("r", RenewAnswer(third.seq, ((pairs[0][0], Refusal.SUPERSEDED),)))
    [(_, fourth)] = rounds.messages({"r": pairs}, 3.0)
    assert isinstance(fourth, Renew), "a refusal: the full list again"
    rounds.answered("r", RenewAnswer(fourth.seq, ()))
    [(_, fifth)] = rounds.messages({"r": pairs[:2]}, 4.0)
    assert isinstance(fifth, Renew), "another set: the full list"


def test_answers_are_matched_to_the_part_and_the_replica_they_answer() -> None:
    rounds = RenewalRounds(keep_for=10.0)
    [(_, msg)] = rounds.messages({"r": _pairs(1)}, 0.0)
    assert rounds.answered("x", RenewAnswer(msg.seq, ())) is None, "not sent to x"
    assert rounds.answered("r", RenewAnswer(msg.seq + 1, ())) is None, "never sent"
    rounds.messages({}, 11.0)  # a round later than keep_for forgets it
    assert rounds.answered("r", RenewAnswer(msg.seq, ())) is None


def test_a_long_list_goes_in_parts_each_answered_on_its_own_and_never_as_a_digest() -> None:
    rounds = RenewalRounds(keep_for=10.0)
    pairs = _pairs(RENEW_CHUNK * 2 + 5)
    parts = rounds.messages({"r": pairs}, 0.0)
    assert [len(m.leases) for _, m in parts if isinstance(m, Renew)] == [
        RENEW_CHUNK, RENEW_CHUNK, 5
    ]  # fmt: skip
    assert len({m.seq for _, m in parts}) == 3
    for _, m in parts:
        part = rounds.answered("r", RenewAnswer(m.seq, ()))
        assert part is not None and part.pairs == m.leases  # type: ignore[union-attr]
    assert all(isinstance(m, Renew) for _, m in rounds.messages({"r": pairs}, 1.0))
    largest = rounds.messages({"q": pairs}, 2.0)[0][1]
    data = encode(largest)
    assert decode(data) == largest, "a full part fits the wire's bounds"


@given(st.lists(st.tuples(st.integers(0, 2**64), st.integers(0, 2**62 - 1)), max_size=20))
def test_the_digest_is_of_the_set_whatever_the_order(raw: list[tuple[int, int]]) -> None:
    pairs = [(f"{t:032x}", e) for t, e in raw]
    assert lease_digest(pairs) == lease_digest(sorted(pairs, reverse=True))
    if pairs:
        tid, epoch = pairs[0]
        assert lease_digest(pairs) != lease_digest([(tid, epoch + 1), *pairs[1:]]) or (
            (tid, epoch + 1) in pairs
        )


def test_a_granter_renews_by_digest_only_what_it_granted_to_the_sender() -> None:
    def rec(
        tid: str, owner: str, epoch: int = 1, ended: Ended = Ended.NO, renewed: bool = True
    ) -> GrantRecord:
        return GrantRecord(tid, SPEC, SIG, epoch=epoch, owner=owner, ended=ended, renewed=renewed)

    grants = {
        "a" * 32: rec("a" * 32, "n1"),
        "b" * 32: rec("b" * 32, "n1", epoch=3),
        "c" * 32: rec("c" * 32, "n2"),
        "d" * 32: rec("d" * 32, "n1", ended=Ended.SUCCEEDED),
        # Granted, never taken up (its owner was busy, or the `Own` was lost): the owner
        # does not renew it, so a digest that counted it would never match.
        "e" * 32: rec("e" * 32, "n1", epoch=2, renewed=False),
    }
    assert sorted(renewable(grants, "n1")) == [("a" * 32, 1), ("b" * 32, 3)]
    assert renewable(grants, "n3") == []


class Counting(Cluster):
    """The agents' cluster, counting the renewal messages sent after `since`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.since = float("inf")
        self.sent: dict[str, int] = {}

    def _apply(self, node: Any, cmds: list[Any]) -> None:
        for cmd in cmds:
            if isinstance(cmd, SendTo) and self.now >= self.since:
                kind = type(decode(cmd.payload)).__name__
                self.sent[kind] = self.sent.get(kind, 0) + 1
        super()._apply(node, cmds)


def _counters(c: Cluster) -> dict[str, int]:
    total: dict[str, int] = {}
    for n in c.nodes.values():
        for k, v in n.agent.counters.items():
            total[k] = total.get(k, 0) + v
    return total


def test_in_steady_state_owners_renew_by_digest_and_no_lease_lapses() -> None:
    c = Counting(5, seed=11)
    tids = [c.submit(f"n{i % 5}", 100.0) for i in range(20)]
    c.run_until(10.0)
    c.since = 10.0
    c.run_until(90.0)
    assert c.sent.get("RenewDigest", 0) > 0
    assert c.sent.get("Renew", 0) == 0, c.sent
    assert _counters(c).get("fenced", 0) == 0
    c.run_until(200.0)
    c.heal_and_sync()
    assert c.check() == []
    assert [len(c.runs[t]) for t in tids] == [1] * 20


def test_steady_state_sends_no_full_list_after_a_burst() -> None:
    """A burst leaves a few grants nobody took up and a few refusals; neither may turn a
    steady round's digest into a full list (`renewable` skips grants never renewed, the
    owner stops naming a lease a replica refused)."""
    c = Counting(
        10,
        seed=5,
        config=attrs.evolve(LeaseConfig.lan(), finished_retention=1e6, tombstone_retention=2e6),
    )
    for i in range(200):
        c.submit(f"n{i % 10}", 500.0)
    c.run_until(60.0)
    c.since = 60.0
    c.run_until(160.0)
    assert c.sent.get("RenewDigest", 0) > 0
    assert c.sent.get("Renew", 0) == 0, c.sent


def test_replicas_holding_another_set_miss_and_the_full_list_keeps_the_lease() -> None:
    """Two of five replicas hold a grant to the owner that the owner does not (a lost
    vote, a missed end), so they miss every digest; a third is down. The full lists
    sent after each miss count with the round's digests towards the majority (3 of 5),
    so the lease holds."""
    c = Counting(5, seed=12)
    tid = c.submit("n0", 100.0)
    c.run_until(10.0)
    owner = c.runs[tid][0].node
    spec = c.nodes[owner].agent.spec_of(tid)
    assert spec is not None
    others = [r for r in spec[0].replicas if r != owner]
    assert len(others) == 4
    ghost = "f" * 32
    for replica in others[:2]:
        grants = c.nodes[replica].agent.grants
        grants[ghost] = attrs.evolve(grants[tid], task_id=ghost)
    c.crash(others[2])
    c.since = 10.0
    c.run_until(60.0)
    assert _counters(c).get("renew_digests_missed", 0) >= 1
    assert c.sent.get("Renew", 0) >= 1, "the full list after each miss"
    assert _counters(c).get("fenced", 0) == 0
    assert len(c.runs[tid]) == 1 and c.runs[tid][0].end is None, "still running, once"


def _one_running(seed: int) -> tuple[Cluster, str, str, tuple[str, ...]]:
    """Four agents running one task: the cluster, the task, its owner, its replicas."""
    c = Cluster(4, seed=seed)
    tid = c.submit("n0", 100.0)
    c.run_until(5.0)
    owner = c.runs[tid][0].node
    spec = c.nodes[owner].agent.spec_of(tid)
    assert spec is not None
    return c, tid, owner, spec[0].replicas


def test_a_digest_in_another_members_name_set_renews_nothing_of_the_owners() -> None:
    c, tid, owner, replicas = _one_running(seed=13)
    evil = next(n for n in c.nodes if n != owner)
    replica = next(r for r in replicas if r not in (owner, evil))
    rec = c.nodes[replica].agent.grants[tid]
    heard = rec.heard_at
    stolen = RenewDigest(1, 1, lease_digest([(tid, rec.epoch)]))
    c._push(c.now, "msg", (evil, replica, encode(stolen)))
    c.run_until(c.now + 0.01)
    assert c.nodes[replica].agent.grants[tid].heard_at == heard
    assert c.nodes[replica].agent.counters.get("renew_digests_missed", 0) >= 1


LAN = attrs.evolve(LeaseConfig.lan(), finished_retention=1e6, tombstone_retention=2e6)


def test_which_refusals_are_for_good() -> None:
    for refusal in (Refusal.FINISHED, Refusal.SUPERSEDED):
        assert refused_for_good(refusal, early=True) and refused_for_good(refusal, early=False)
    for refusal in (Refusal.UNKNOWN, Refusal.NOT_OWNER):
        assert refused_for_good(refusal, early=False)
        assert not refused_for_good(refusal, early=True), "a grant may be on its way"
    assert not refused_for_good(Refusal.LEASE_LIVE, early=False)


def test_the_next_round_waits_longer_only_when_every_lease_was_renewed() -> None:
    ttl, steady = LAN.lease_ttl, LAN.lease_renew_steady
    assert steady_round(None, 10.0, [10.0 + ttl], LAN) is None
    assert steady_round(12.0, 10.0, [10.0 + ttl, 12.0 + ttl], LAN) == 10.0 + steady
    assert steady_round(12.0, 10.0, [10.0 + ttl, 9.0 + ttl], LAN) == 12.0, "one missed"
    assert steady_round(15.0, 10.0, [10.0 + ttl], LAN) == 15.0, "never earlier"


def test_a_replica_that_missed_the_grant_is_not_named_there_again() -> None:
    """One replica lost the offer and the grant request (nobody repeats them once a
    majority has them), so it refuses the owner's renewals as UNKNOWN: after the first
    interval the owner stops naming the lease there, and its rounds are digests, not a
    full list every time."""
    c = Counting(5, seed=3, config=LAN)
    deaf = "n4"
    event = c._event

    def lossy(kind: str, data: Any) -> None:
        if (
            kind == "msg"
            and data[1] == deaf
            and isinstance(decode(data[2]), Offer | GrantRequest)
        ):
            return
        event(kind, data)

    c._event = lossy  # type: ignore[method-assign]
    tid = c.submit("n0", 200.0)
    c.run_until(30.0)
    owner = c.runs[tid][0].node
    assert owner != deaf and tid not in c.nodes[deaf].agent.grants
    c.since = 30.0
    c.run_until(90.0)
    assert c.sent.get("RenewDigest", 0) > 0
    assert c.sent.get("Renew", 0) == 0, c.sent
    assert _counters(c).get("fenced", 0) == 0 and len(c.runs[tid]) == 1


def test_a_steady_owner_renews_every_steady_interval_and_sooner_after_a_miss() -> None:
    c = Counting(5, seed=4, config=LAN, drift=0.0)
    tid = c.submit("n0", 300.0)
    c.run_until(30.0)
    owner = c.runs[tid][0].node
    rounds: list[float] = []
    apply = c._apply

    def spy(node: Any, cmds: list[Any]) -> None:
        for cmd in cmds:
            mine = node.name == owner and isinstance(cmd, SendTo) and cmd.node != owner
            if mine and isinstance(decode(cmd.payload), Renew | RenewDigest):
                rounds.append(round(c.now, 3))
        apply(node, cmds)

    c._apply = spy  # type: ignore[method-assign]
    c.run_until(70.0)
    gaps = [b - a for a, b in itertools.pairwise(sorted(set(rounds)))]
    assert gaps and all(abs(g - LAN.lease_renew_steady) < 0.01 for g in gaps), gaps
    # Every other replica cut off: no round gets a majority, so they come every
    # `lease_renew_interval` until the lease runs out and the owner fences the task.
    c.partition({owner})
    rounds.clear()
    c.run_until(c.now + LAN.lease_ttl - LAN.fence_grace)
    gaps = [b - a for a, b in itertools.pairwise(sorted(set(rounds)))]
    assert gaps and all(abs(g - LAN.lease_renew_interval) < 0.01 for g in gaps), gaps


def test_answering_asks_us_then_the_freshest_replicas_until_each_lease_has_a_majority() -> None:
    same = ("me", "a", "b", "c", "d")
    per_node = {n: [("t1", 1), ("t2", 1)] for n in same}
    asked = answering(per_node, {"t1": same, "t2": same}, {"me"}, ["c", "a", "b"])
    assert asked == {"me", "c", "a"}, "3 of 5, the freshest first"
    # Another lease on a set without us: three of its own replicas, freshest first.
    per_node["x"] = [("t3", 1)]
    for n in ("b", "c", "d"):
        per_node[n].append(("t3", 1))
    replicas = {"t1": same, "t2": same, "t3": ("x", "b", "c", "d")}
    asked = answering(per_node, replicas, {"me"}, ["c", "a", "b"])
    # t3 needs 3 of 4 (half of an even set counts only with its first, x): c and b,
    # then d (the unranked by name).
    assert asked == {"me", "c", "a", "b", "d"}
    assert answering(per_node, replicas, {"me"}, ["x", "b", "a"]) == {"me", "x", "b", "a"}
    # A replica sent a full list answers anyway and counts towards the majority.
    assert answering(per_node, {"t1": same, "t2": same, "t3": replicas["t3"]},
                     {"me", "d", "x"}, ["a"]) == {"me", "d", "x", "a"}  # fmt: skip
    # A lease we send to too few replicas for a majority: everyone we send it to.
    assert answering({"a": [("t9", 1)]}, {"t9": ("a", "b", "c")}, set(), []) == {"a"}


def test_after_a_round_that_renewed_everything_only_a_majority_answers() -> None:
    """Five replicas (the owner and 4 others): in steady state each round asks 2 others
    to answer (with the owner's own vote, 3 of 5) and sends the other 2 a quiet digest,
    which renews there just the same: no lease lapses at any replica, nothing fences."""
    c = Counting(5, seed=21, config=LAN)
    tids = [c.submit(f"n{i % 5}", 300.0) for i in range(20)]
    c.run_until(40.0)
    c.since = 40.0
    c.run_until(140.0)
    counters = _counters(c)
    digests, answers = c.sent.get("RenewDigest", 0), c.sent.get("RenewAnswer", 0)
    assert counters.get("renew_digests_quiet", 0) > 0
    assert digests > 0 and answers <= 0.6 * digests, c.sent
    assert counters.get("fenced", 0) == 0 and c.sent.get("GrantRequest", 0) == 0, c.sent
    for tid in tids:
        run = c.runs[tid][0]
        for node in c.nodes.values():
            rec = node.agent.grants.get(tid)
            assert rec is None or rec.owner == run.node, "no replica let a lease lapse"
    c.run_until(400.0)
    c.heal_and_sync()
    assert c.check() == [] and [len(c.runs[t]) for t in tids] == [1] * 20


def test_lost_answers_from_one_replica_leave_the_lease_held() -> None:
    """From some point on every answer of one replica is lost: a round that counted on
    it misses its majority, the next comes a `lease_renew_interval` later and asks
    everyone, and later rounds ask the replicas that answer. No lease is fenced."""
    c = Counting(5, seed=22, config=LAN, drift=0.0)
    tid = c.submit("n0", 300.0)
    c.run_until(30.0)
    owner = c.runs[tid][0].node
    mute = next(n for n in c.nodes if n != owner)
    event = c._event

    def lossy(kind: str, data: Any) -> None:
        if kind == "msg" and data[0] == mute and isinstance(decode(data[2]), RenewAnswer):
            return
        event(kind, data)

    c._event = lossy  # type: ignore[method-assign]
    c.since = 30.0
    c.run_until(150.0)
    assert _counters(c).get("fenced", 0) == 0
    assert len(c.runs[tid]) == 1 and c.runs[tid][0].end is None, "still running, once"
    assert _counters(c).get("renew_digests_quiet", 0) > 0


def test_a_quiet_digest_that_misses_is_answered() -> None:
    c, _tid, owner, replicas = _one_running(seed=23)
    replica = next(r for r in replicas if r != owner)
    agent = c.nodes[replica].agent
    wrong = RenewDigest(10**6, 1, bytes(16), quiet=True)
    [answer] = agent.receive(encode(wrong), c.nodes[replica].local(c.now), owner)
    assert isinstance(answer, SendTo) and answer.node == owner
    assert decode(answer.payload) == RenewAnswer(10**6, (), missed=True)


def test_a_round_that_missed_its_majority_makes_the_next_ask_everyone() -> None:
    """Every answer to the owner is lost for a moment: the round sent in it misses its
    majority, so the next comes `lease_renew_interval` (not `lease_renew_steady`) later
    and sends no quiet digest; rounds after a full majority are quiet again."""
    c = Counting(5, seed=24, config=LAN, drift=0.0)
    tid = c.submit("n0", 300.0)
    c.run_until(30.0)
    owner = c.runs[tid][0].node
    rounds: dict[float, list[bool]] = {}  # round time -> each digest's quiet flag
    apply, event = c._apply, c._event

    def spy(node: Any, cmds: list[Any]) -> None:
        for cmd in cmds:
            if node.name == owner and isinstance(cmd, SendTo) and cmd.node != owner:
                msg = decode(cmd.payload)
                if isinstance(msg, RenewDigest):
                    rounds.setdefault(round(c.now, 3), []).append(msg.quiet)
        apply(node, cmds)

    def lossy(kind: str, data: Any) -> None:
        lost = kind == "msg" and data[1] == owner and 50.0 <= c.now < 54.0
        if not (lost and isinstance(decode(data[2]), RenewAnswer)):
            event(kind, data)

    c._apply = spy  # type: ignore[method-assign]
    c._event = lossy  # type: ignore[method-assign]
    c.run_until(80.0)
    times = sorted(rounds)
    before = [t for t in times if t < 50.0]
    assert before and all(any(rounds[t]) for t in before), "steady rounds are quiet"
    missed = [(a, b) for a, b in itertools.pairwise(times)
              if abs(b - a - LAN.lease_renew_interval) < 0.01 and a >= 50.0]  # fmt: skip
    assert missed, f"a round missed its majority: {times}"
    _, after = missed[0]
    assert not any(rounds[after]), "the round after a miss asks everyone"
    assert any(any(rounds[t]) for t in times if t > after), "then quiet again"
    assert _counters(c).get("fenced", 0) == 0 and len(c.runs[tid]) == 1
