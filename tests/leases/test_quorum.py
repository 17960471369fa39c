"""`quorum.is_quorum`: the one property safety rests on (two quorums of a set share a
member), and what the primary adds to even sets."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.leases.quorum import can_still_reach_quorum, is_quorum, neighbours

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
