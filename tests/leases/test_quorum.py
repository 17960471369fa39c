"""`quorum.is_quorum`: the one property safety rests on (two quorums of a set share a
member), what the primary adds to even sets, and the epoch that liars among the set
cannot have made up (`epoch_vouched`)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.leases.quorum import can_still_reach_quorum, epoch_vouched, is_quorum, neighbours

NODES = [f"n{i}" for i in range(7)]


@st.composite
def replica_sets(draw: st.DrawFn) -> tuple[str, ...]:
    size = draw(st.integers(min_value=1, max_value=7))
    return tuple(draw(st.permutations(NODES))[:size])


@given(replica_sets(), st.data())
def test_any_two_quorums_of_one_set_share_a_member(
    replicas: tuple[str, ...], data: st.DataObject
) -> None:
    voters = st.sets(st.sampled_from(NODES))
    a, b = data.draw(voters), data.draw(voters)
    if is_quorum(replicas, a) and is_quorum(replicas, b):
        assert a & b & set(replicas)


def test_every_pair_of_quorums_intersects_exhaustively() -> None:
    for size in range(1, 7):
        replicas = tuple(NODES[:size])
        subsets = [set(c) for k in range(size + 1) for c in itertools.combinations(replicas, k)]
        quorums = [s for s in subsets if is_quorum(replicas, s)]
        assert quorums, size
        for a, b in itertools.product(quorums, repeat=2):
            assert a & b, (replicas, a, b)


@given(replica_sets(), st.sets(st.sampled_from(NODES)))
def test_odd_sets_decide_by_strict_majority(replicas: tuple[str, ...], voters: set[str]) -> None:
    if len(replicas) % 2:
        inside = len(voters & set(replicas))
        assert is_quorum(replicas, voters) == (inside > len(replicas) // 2)


def test_the_primary_alone_decides_for_a_set_of_two_and_the_other_alone_does_not() -> None:
    assert is_quorum(("a", "b"), {"a"})
    assert not is_quorum(("a", "b"), {"b"})
    assert not is_quorum(("a", "b"), set())


def test_half_of_four_decides_only_with_the_primary() -> None:
    replicas = ("a", "b", "c", "d")
    assert is_quorum(replicas, {"a", "d"})
    assert not is_quorum(replicas, {"b", "c"})
    assert is_quorum(replicas, {"b", "c", "d"})


def test_votes_from_outside_the_set_count_for_nothing() -> None:
    assert not is_quorum(("a", "b", "c"), {"a", "x", "y"})
    assert not is_quorum((), {"a"})


def test_a_quorum_is_out_of_reach_once_the_primary_of_two_refused() -> None:
    assert not can_still_reach_quorum(("a", "b"), {"a"})
    assert can_still_reach_quorum(("a", "b"), {"b"})
    assert can_still_reach_quorum(("a", "b", "c"), {"a"})
    assert not can_still_reach_quorum(("a", "b", "c"), {"a", "c"})


def test_neighbours_are_the_owners_and_exclude_it() -> None:
    live = [f"n{i}" for i in range(20)]
    first = neighbours("n3", live, 4)
    assert len(first) == 4 and "n3" not in first
    assert neighbours("n3", reversed(live), 4) == first, "the same on every view"
    assert neighbours("n4", live, 4) != first, "another owner, other neighbours"
    assert neighbours("n3", ["n3", "n1"], 4) == ("n1",), "fewer in a small mesh"


def test_an_epoch_is_vouched_for_only_past_what_the_tolerated_liars_could_say() -> None:
    five = ("a", "b", "c", "d", "e")  # 2 beyond a majority: the third highest counts
    assert epoch_vouched(five, {"b": 2**62, "c": 2**62, "d": 9, "e": 7}, 5) == 9
    assert epoch_vouched(five, {"b": 2**62, "c": 9}, 5) == 5, "three values: the third"
    assert epoch_vouched(five, {"b": 2**62}, 5) == 5, "too few answers: our own record"
    assert epoch_vouched(five, {"z": 2**62, "y": 2**62, "b": 3}, 1) == 1, "outsiders count nil"
    three = ("a", "b", "c")  # 1 beyond a majority: the second highest counts
    assert epoch_vouched(three, {"b": 2**62, "c": 4}, 2) == 4
    assert epoch_vouched(("a",), {}, 3) == 3


@given(
    st.lists(st.integers(0, 100), min_size=5, max_size=5),
    st.lists(st.booleans(), min_size=5, max_size=5),
    st.integers(0, 100),
)
def test_the_vouched_epoch_is_never_above_every_honest_replica(
    honest: list[int], lying: list[bool], own: int
) -> None:
    """Whatever up to 2 of 5 replicas say (here 2^62), the vouched epoch is at most the
    highest that we or an honest replica hold."""
    replicas = ("r0", "r1", "r2", "r3", "r4")
    liars = [r for r, lie in zip(replicas, lying, strict=True) if lie][:2]
    held = {r: (2**62 if r in liars else e) for r, e in zip(replicas, honest, strict=True)}
    truth = max([own, *(e for r, e in held.items() if r not in liars)])
    assert epoch_vouched(replicas, held, own) <= truth
