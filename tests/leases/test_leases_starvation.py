"""Duplicate starts under load (issue 10): a starved replica expires and starts nothing
until it has read what waited for it, and a node never ranks itself above how the others
see it, so two nodes do not both claim one epoch over the same information."""

from __future__ import annotations

import random

import attrs

from populi_p2p.leases import LeaseConfig, LeaseExpired, LeaseTable, TableStalled, TaskResult
from populi_p2p.leases.election import claim_wait
from populi_p2p.leases.placement import Candidate, Gpu, committed_resources, place
from populi_p2p.leases.reliability import earned_reliability, prior_reliability

from .helpers import spec, table

GIB = 1 << 30
CFG = LeaseConfig.local()


def owned(observer: LeaseTable, owner: LeaseTable, n: int, now: float) -> str:
    """A task submitted and claimed by `owner`, known to `observer`: its id."""
    tid, d = owner.submit(spec(n, by=owner.me), now)
    observer.apply(d, now)
    observer.apply(owner.claim(tid, 1, 1, "", now), now)
    return tid


def test_a_starved_tick_expires_no_lease_until_it_has_listened_for_settle_time() -> None:
    a, b = table("a"), table("b")
    tid = owned(b, a, 1, 0.0)
    assert b.tick(0.5) == []
    # b's process did not run for 9.5 s: the owner's renewals may wait in its socket.
    events = b.tick(10.0)
    assert not any(isinstance(e, LeaseExpired) for e in events)
    stalled = [e for e in events if isinstance(e, TableStalled)]
    assert stalled == [TableStalled(9.5, 10.0 + CFG.settle_time)]
    assert b.statistics().stalls == 1
    # What waited is read: a renewal keeps the lease.
    b.apply(a.renew(tid, 10.0), 10.05)
    assert b.tick(10.05 + CFG.settle_time) == []
    # Without one, the lease expires settle_time after the stall, not before.
    c = table("c")
    owned(c, a, 2, 0.0)
    c.tick(0.5)
    c.tick(10.0)
    assert c.tick(10.0 + CFG.settle_time / 2) == []
    expired = c.tick(10.0 + CFG.settle_time)
    assert [(e.owner, e.reason) for e in expired if isinstance(e, LeaseExpired)] == [
        ("a", "silent")
    ]


def test_a_tick_on_time_still_expires_a_silent_lease_and_gone_is_never_held() -> None:
    a, b = table("a"), table("b")
    owned(b, a, 3, 0.0)
    t = 0.0
    while t < CFG.lease_ttl:
        assert b.tick(t) == []
        deadline = b.next_deadline()
        assert deadline is not None and deadline <= t + CFG.tick_gap_max / 2
        t = deadline
    assert [e.reason for e in b.tick(t) if isinstance(e, LeaseExpired)] == ["silent"]
    c = table("c")
    owned(c, a, 4, 0.0)
    c.tick(0.1)
    events = c.tick(30.0, gone={"a"})  # SWIM's verdict does not wait on our backlog
    assert any(isinstance(e, TableStalled) for e in events)
    assert [e.reason for e in events if isinstance(e, LeaseExpired)] == ["gone"]


def test_our_own_lease_ending_reaches_our_placement_view_after_self_view_lag() -> None:
    a, b = table("a"), table("b")
    tid = owned(b, a, 5, 0.0)
    a.mark_running(tid, 0.1)
    a.post_result(tid, TaskResult(0), 1.0)
    assert a.hides(1.0)
    view, outcomes = a.placement_view(1.0 + CFG.self_view_lag / 2)
    assert committed_resources(view) == {"a": [spec(5, by="a").requirements]}
    assert outcomes == []  # the success is not counted yet
    assert not a.hides(1.0 + CFG.self_view_lag)
    view, outcomes = a.placement_view(1.0 + CFG.self_view_lag)
    assert committed_resources(view) == {}
    assert [(o.node, o.success) for o in outcomes] == [("a", True)]
    # Renewals and claims are not endings: nothing is hidden.
    tid2 = owned(b, a, 6, 2.0)
    a.renew(tid2, 2.1)
    assert not a.hides(2.1)
    # A remote change to the entry ends the hiding (the view follows the table).
    a.release(tid2, 3.0)
    assert a.hides(3.1)
    a.apply(b.claim(tid2, 2, 1, "", 3.2), 3.2)
    assert not a.hides(3.3)


def _candidates(table_: LeaseTable, now: float, fresh: bool) -> tuple[list[Candidate], dict]:
    view, outcomes = (
        (list(table_), table_.outcomes()) if fresh else table_.placement_view(now)
    )
    rel = earned_reliability(outcomes, now, CFG)
    cands = [
        Candidate(
            n,
            gpus=(Gpu(24 * GIB, (8, 6)),),
            cpu_cores=8,
            ram=32 * GIB,
            reliability=rel.get(n, prior_reliability(CFG)),
        )
        for n in ("a", "b")
    ]
    return cands, committed_resources(view)


def _who_claims(config: LeaseConfig) -> set[str]:
    """a just finished a task; b has not heard yet; a new task is placed by both."""
    a = table("a", config)
    b = table("b", config)
    first = owned(b, a, 7, 0.0)
    b.apply(a.mark_running(first, 0.1), 0.1)
    a.post_result(first, TaskResult(0), 1.0)  # b does not have this yet
    claimants = set()
    for n in range(100):  # a task whose rendezvous tie-break prefers a
        task = spec(100 + n, by="b")
        tid, d = b.submit(task, 1.1)
        a.apply(d, 1.1)
        cands, committed = _candidates(a, 1.1, fresh=True)
        if place(task, cands, config=config, rng=random.Random(0), committed={}).chosen == "a":
            break
    for me in (a, b):
        cands, committed = _candidates(me, 1.1, fresh=False)  # what the service does
        held = place(task, cands, config=config, rng=random.Random(0), committed=committed)
        fresh = None
        if held.chosen != me.me and me.hides(1.1):
            cands, committed = _candidates(me, 1.1, fresh=True)
            fresh = place(task, cands, config=config, rng=random.Random(0), committed=committed)
        if claim_wait(me.me, held, fresh, config) == 0.0:
            claimants.add(me.me)
    assert tid
    return claimants


def test_a_node_that_just_finished_does_not_claim_alongside_the_one_others_rank_first() -> None:
    # Before the fix (no lag): a sees itself free, b still sees a busy: both claim.
    assert _who_claims(attrs.evolve(CFG, self_view_lag=0.0)) == {"a", "b"}
    # Now a sees itself as b does until its news has spread: only b claims at once.
    assert _who_claims(CFG) == {"b"}


def test_claim_wait_orders_held_fresh_and_fallback() -> None:
    cands = [Candidate(n, gpus=(Gpu(24 * GIB, (8, 6)),), cpu_cores=8, ram=32 * GIB) for n in "ab"]
    p = place(spec(9, by="x"), cands, config=CFG, rng=random.Random(0))
    first, second = p.ranked
    assert claim_wait(first, p, None, CFG) == 0.0
    assert claim_wait(second, p, None, CFG) is None
    assert claim_wait(second, p, None, CFG, fallback_step=1.5) == 1.5
    assert claim_wait(second, p, p, CFG) is None  # first on neither view
    swapped = attrs.evolve(p, ranked=(second, first), chosen=second)
    assert claim_wait(second, p, swapped, CFG) == CFG.self_view_lag
