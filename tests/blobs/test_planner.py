"""The fetch plan (sans-IO): several holders at once, within bounds; corrupt and lying
holders skipped and counted; their chunks fetched elsewhere; stuck only when no holder
is left."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.blobs.planner import Assignment, ChunkFailure, FetchPlan


def test_spreads_over_holders_lowest_chunks_first() -> None:
    plan = FetchPlan(10, [], ["a", "b", "c"], per_holder=2, total=5)
    out = plan.assign(0.0)
    assert [a.chunk for a in out] == [0, 1, 2, 3, 4]
    assert sorted(a.holder for a in out) == ["a", "a", "b", "b", "c"]
    assert plan.assign(0.0) == []


def test_corrupt_and_lying_holders_are_skipped_and_their_chunk_fetched_elsewhere() -> None:
    plan = FetchPlan(3, [], ["liar", "bad", "good"], per_holder=1, total=3)
    out = {a.holder: a.chunk for a in plan.assign(0.0)}
    plan.failed(out["liar"], "liar", ChunkFailure.MISSING, 0.0)
    plan.failed(out["bad"], "bad", ChunkFailure.CORRUPT, 0.0)
    plan.succeeded(out["good"], "good")
    stats = plan.holders
    assert stats["liar"].skipped and stats["liar"].missing == 1
    assert stats["bad"].skipped and stats["bad"].corrupt == 1
    while not plan.finished:
        (a,) = plan.assign(0.0)
        assert a.holder == "good"
        plan.succeeded(a.chunk, a.holder)
    assert stats["good"].served == 3


def test_unreachable_backs_off_then_is_skipped_and_the_plan_is_stuck() -> None:
    plan = FetchPlan(1, [], ["a"], max_failures=3, backoff_min=1.0)
    now = 0.0
    for _ in range(3):
        (a,) = plan.assign(now)
        plan.failed(a.chunk, a.holder, ChunkFailure.UNREACHABLE, now)
        assert plan.assign(now) == []
        deadline = plan.next_deadline(now)
        now = deadline if deadline is not None else now
    assert plan.holders["a"].skipped is not None
    assert plan.stuck() is not None and "unreachable" in (plan.stuck() or "")
    assert FetchPlan(1, [], []).stuck() == "no member holds this blob"


def test_a_holder_lacking_a_chunk_serves_the_others_and_is_asked_again_later() -> None:
    plan = FetchPlan(3, [], ["full", "part"], per_holder=1, total=2, lack_retry=1.0)
    out = {a.holder: a.chunk for a in plan.assign(0.0)}
    assert out == {"full": 0, "part": 1}
    plan.failed(1, "part", ChunkFailure.LACKS, 0.0)
    assert plan.holders["part"].skipped is None and plan.holders["part"].lacks == 1
    assert plan.assign(0.0) == [Assignment(2, "part")]  # not chunk 1 again, yet
    plan.succeeded(2, "part")
    assert plan.assign(0.0) == []  # only "part" is free, and it lacks chunk 1
    assert plan.next_deadline(0.0) == 1.0
    assert plan.assign(1.0) == [Assignment(1, "part")]
    plan.succeeded(0, "full")
    plan.succeeded(1, "part")
    assert plan.finished and plan.stuck() is None


def test_a_chunk_refuted_after_it_was_done_is_fetched_again_elsewhere() -> None:
    plan = FetchPlan(2, [1], ["sly", "good"], per_holder=1)
    (a,) = plan.assign(0.0)
    plan.succeeded(a.chunk, a.holder)
    assert plan.finished and a == Assignment(0, "sly")
    plan.refuted(0)
    plan.refuted(1)  # held before this fetch: fetched again, nobody blamed
    sly = plan.holders["sly"]
    assert not plan.finished and sly.corrupt == 1 and sly.served == 0 and sly.skipped
    assert sorted(plan.assign(0.0)) == [Assignment(0, "good")]
    assert plan.holders["good"].corrupt == 0


def test_resumption_fetches_only_what_is_missing() -> None:
    plan = FetchPlan(4, [0, 2], ["a"], per_holder=4)
    assert sorted(a.chunk for a in plan.assign(0.0)) == [1, 3]


_HONEST, _CORRUPT, _LIAR, _FLAKY = "honest", "corrupt", "liar", "flaky"
_SLY = "sly"  # its chunks arrive and count as done; the whole hash later refutes them


@settings(max_examples=200, deadline=None)
@given(
    chunks=st.integers(1, 20),
    kinds=st.lists(
        st.sampled_from([_HONEST, _CORRUPT, _LIAR, _FLAKY, _SLY]), min_size=1, max_size=5
    ),
    per_holder=st.integers(1, 4),
    total=st.integers(1, 8),
    coin=st.randoms(use_true_random=False),
)
def test_any_behaviour_finishes_with_an_honest_holder_and_respects_the_bounds(
    chunks: int, kinds: list[str], per_holder: int, total: int, coin: object
) -> None:
    import random

    assert isinstance(coin, random.Random)
    holders = [f"h{i}" for i in range(len(kinds))]
    behaviour = dict(zip(holders, kinds, strict=True))
    plan = FetchPlan(chunks, [], holders, per_holder=per_holder, total=total, max_failures=50)
    now, served_by = 0.0, {}
    for _ in range(10_000):
        if plan.finished:  # the round's whole hash: a sly holder's chunks are refuted
            sly = [c for c, h in served_by.items() if behaviour[h] == _SLY]
            if not sly:
                break
            for c in sly:
                plan.refuted(c)
                del served_by[c]
            continue
        if plan.stuck() and not plan.inflight():
            break
        for a in plan.assign(now):
            assert plan.holders[a.holder].skipped is None
        inflight = plan.inflight()
        assert len(inflight) <= total
        assert all(list(inflight.values()).count(h) <= per_holder for h in holders)
        if not inflight:
            deadline = plan.next_deadline(now)
            assert deadline is not None
            now = deadline
            continue
        chunk = coin.choice(sorted(inflight))
        holder = inflight[chunk]
        kind = behaviour[holder]
        if kind in (_HONEST, _SLY) or (kind == _FLAKY and coin.random() < 0.5):
            plan.succeeded(chunk, holder)
            served_by[chunk] = holder
        else:
            why = {_CORRUPT: ChunkFailure.CORRUPT, _LIAR: ChunkFailure.MISSING}.get(
                kind, ChunkFailure.UNREACHABLE
            )
            plan.failed(chunk, holder, why, now)
    if _HONEST in kinds:
        assert plan.finished
    if plan.finished:
        assert sorted(served_by) == list(range(chunks))
        assert all(behaviour[h] in (_HONEST, _FLAKY) for h in served_by.values())
    for h, s in plan.holders.items():
        if behaviour[h] in (_CORRUPT, _LIAR, _SLY) and (s.corrupt or s.missing):
            assert s.skipped is not None
        assert s.served == sum(1 for x in served_by.values() if x == h)
