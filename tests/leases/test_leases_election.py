"""Election helpers: claim, settle, stop, re-place; a three-node election converges."""

from __future__ import annotations

import random

from populi_p2p.leases import LeaseConfig, LeaseExpired, TaskResult
from populi_p2p.leases.election import (
    claim_stands,
    must_stop,
    replacement_epoch,
    should_claim,
    start_time,
)
from populi_p2p.leases.placement import Candidate, Gpu, place

from .helpers import spec, table

GIB = 1 << 30
CFG = LeaseConfig.local()


def cands(views: dict[str, float]) -> list[Candidate]:
    return [
        Candidate(n, gpus=(Gpu(48 * GIB, (8, 0)),), cpu_cores=8, ram=32 * GIB, reliability=r)
        for n, r in views.items()
    ]


def test_two_claimants_with_different_views_resolve_to_one_owner() -> None:
    nodes = {n: table(n, CFG) for n in "abc"}
    tid, d = nodes["a"].submit(spec(1, by="a"), 0.0)
    for n in "bc":
        nodes[n].apply(d, 0.0)
    # b and c each believe they are the best (different reliability views)
    deltas = []
    for me, view in (("b", {"b": 0.9, "c": 0.5}), ("c", {"b": 0.3, "c": 0.6})):
        p = place(nodes[me].get(tid).spec, cands(view), config=CFG, rng=random.Random(0))
        epoch = should_claim(nodes[me].get(tid), me, p)
        assert epoch == 1
        deltas.append(nodes[me].claim(tid, epoch, p.rank_of(me), p.explain(), 0.0))
    assert start_time(0.0, CFG) == CFG.settle_time
    for t in nodes.values():  # one gossip round later
        for d in deltas:
            t.apply(d, 0.1)
    owners = {t.get(tid).owner for t in nodes.values()}
    assert owners == {"b"}  # higher rank wins on every replica
    assert claim_stands(nodes["b"].get(tid), "b", 1)
    assert must_stop(nodes["c"].get(tid), "c", 1)
    p = place(nodes["a"].get(tid).spec, cands({"a": 0.9}), config=CFG, rng=random.Random(0))
    assert should_claim(nodes["a"].get(tid), "a", p) is None  # already owned


def test_replacement_after_expiry_takes_the_next_epoch_and_fences() -> None:
    a, b, c = (table(n, CFG) for n in "abc")
    tid, d = a.submit(spec(2, by="a"), 0.0)
    for t in (b, c):
        t.apply(d, 0.0)
    claim = b.claim(tid, 1, 5, "", 0.0)
    a.apply(claim, 0.0)
    c.apply(claim, 0.0)
    expired = a.expired_owners(CFG.lease_ttl)
    assert expired == [LeaseExpired(tid, 1, "b", "silent")]
    epoch = replacement_epoch(a.get(tid), expired[0])
    assert epoch == 2
    p = place(
        a.get(tid).spec,
        cands({"b": 0.9, "c": 0.3}),
        config=CFG,
        rng=random.Random(0),
        exclude={"b"},
    )
    assert p.chosen == "c"
    c_claim = c.claim(tid, epoch, p.rank_of("c"), p.explain(), 20.0)
    a.apply(c_claim, 20.0)
    late = b.post_result(tid, TaskResult(0, b"late"), 30.0)  # b was alive after all
    a.apply(late, 21.0)
    assert a.get(tid).owner == "c" and a.get(tid).accepted_result is None
    b.apply(c_claim, 31.0)
    assert must_stop(b.get(tid), "b", 1)
    assert replacement_epoch(a.get(tid), expired[0]) is None  # already moved on
