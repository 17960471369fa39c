"""`RejoinPolicy`: the one join/reconnect schedule the daemon and the simulator share."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swim import RejoinConfig, RejoinPolicy
from swim.rejoin import failed_targets

PLAIN = RejoinConfig(jitter=0.0)


def policy(config: RejoinConfig = PLAIN, seed: int = 1) -> RejoinPolicy:
    return RejoinPolicy(config, random.Random(seed), 100.0)


def test_the_first_check_is_due_at_once() -> None:
    p = policy()
    assert p.next_deadline() == 100.0 and p.due(100.0)


@pytest.mark.parametrize(
    ("results", "delays"),
    [
        ([False] * 8, [1, 2, 4, 8, 16, 32, 60, 60]),  # doubling, capped at 60 s
        ([False, False, True, False], [1, 2, 0, 1]),  # a success resets the backoff
        # joined: the start's join is followed by a check at once (bootstrap peers its
        # answer did not bring), then back to checking every check_interval
        ([True, True], [0, 5]),
        ([False, True, True], [1, 0, 5]),  # the check at once follows the first success only
    ],
)
def test_backoff_table(results: list[bool], delays: list[float]) -> None:
    p = policy()
    now = 100.0
    got = []
    for joined in results:
        got.append(p.on_result(now, joined))
        now = p.next_deadline()
    assert got == delays


def test_without_bootstrap_after_first_join_a_first_success_waits_a_check_interval() -> None:
    p = policy(RejoinConfig(jitter=0.0, bootstrap_after_first_join=False))
    assert [p.on_result(100.0, True), p.on_result(105.0, True)] == [5, 5]


def test_a_first_join_whose_answer_lacks_the_other_seed_joins_it_at_once() -> None:
    """The start storm's split: a joiner reached seed "a", whose view does not hold
    seed "b" yet; the check right after the join sends "b" a join, and one only."""
    p = policy()
    assert p.on_result(100.0, True) == 0.0 and p.due(100.0)
    assert p.bootstrap_targets(100.0, ["b"]) == ["b"]
    assert p.on_result(100.5, True) == 5.0
    assert p.bootstrap_targets(105.5, []) == []  # b's answer brought it: nothing more


def test_the_check_after_the_first_join_leaves_the_seed_it_joined_alone() -> None:
    """Gossip can reach a joiner before its (starved) seed's answer does: the check at
    once joins the other seed, not the one whose answer is still on its way."""
    p = policy(RejoinConfig(jitter=0.0, first_join_max=1), seed=3)
    (sent,) = p.first_targets(["a", "b"])
    other = "b" if sent == "a" else "a"
    assert p.on_result(100.0, True) == 0.0
    assert p.bootstrap_targets(100.0, ["a", "b"]) == [other]
    assert sent in p.bootstrap_targets(105.0, ["a", "b"])  # still missing: its next try


@given(st.lists(st.booleans(), min_size=1, max_size=12))
def test_only_the_first_success_is_followed_by_a_check_at_once(results: list[bool]) -> None:
    p = policy()
    now = 100.0
    for index, joined in enumerate(results):
        delay = p.on_result(now, joined)
        assert (delay == 0.0) == (joined and True not in results[:index])
        now = p.next_deadline()


def test_not_needed_resets_the_backoff_and_waits_a_check_interval() -> None:
    p = policy()
    p.on_result(100.0, False)
    p.on_result(101.0, False)
    assert p.on_not_needed(103.0) == 5.0 and p.next_deadline() == 108.0
    assert p.on_result(108.0, False) == 1.0


def test_jitter_only_shortens_and_is_reproducible() -> None:
    config = RejoinConfig(jitter=0.2)
    a, b = policy(config, seed=7), policy(config, seed=7)
    for i in range(10):
        da, db = a.on_result(float(i), False), b.on_result(float(i), False)
        assert da == db
        nominal = min(2.0**i, 60.0)
        assert nominal * 0.8 <= da <= nominal


@pytest.mark.parametrize(
    ("failed", "known", "alone", "expected"),
    [
        ([], ["b1", "b2"], True, ["b1", "b2"]),  # alone: the bootstrap list
        ([], ["b1"], False, []),  # not alone, nothing failed: nobody
        (["f1"], ["b1"], False, ["f1"]),  # reconnect to the failed only
        (["f1", "b1"], ["b1", "b2"], True, ["f1", "b1", "b2"]),  # deduplicated, in order
    ],
)
def test_targets_table(
    failed: list[str], known: list[str], alone: bool, expected: list[str]
) -> None:
    assert policy().targets(failed, known, alone=alone) == expected


def test_targets_are_bounded() -> None:
    config = RejoinConfig(jitter=0.0, failed_max=3, targets_max=5)
    failed = [f"f{i}" for i in range(20)]
    known = [f"k{i}" for i in range(20)]
    got = policy(config).targets(failed, known, alone=True)
    assert len(got) == 5
    assert len([t for t in got if t.startswith("f")]) == 3  # a random 3 of the 20 failed
    assert got[3:] == ["k0", "k1"]


@given(st.integers(0, 40), st.integers(1, 4))
def test_with_live_peers_only_reconnect_max_failed_members_are_tried(
    n_failed: int, reconnect_max: int
) -> None:
    """Not alone: a random `reconnect_max` of the failed members and nothing else, so a
    member falsely declared dead is not hit by a join from everyone at every check."""
    config = RejoinConfig(jitter=0.0, reconnect_max=reconnect_max)
    failed = [f"f{i}" for i in range(n_failed)]
    got = policy(config).targets(failed, ["k0"], alone=False)
    assert len(got) == min(n_failed, reconnect_max)
    assert set(got) <= set(failed)


def test_failed_targets_forgets_old_failures() -> None:
    failed = {"a": 0.0, "b": 50.0, "c": 90.0}
    assert failed_targets(failed, 100.0, memory=20.0) == ["c"]
    assert failed == {"c": 90.0}


def test_for_probe_interval_is_the_daemons_check_interval() -> None:
    assert RejoinConfig.for_probe_interval(1.0).check_interval == 5.0
    assert RejoinConfig.for_probe_interval(0.1).check_interval == 1.0
    assert RejoinConfig.for_probe_interval(5.0).check_interval == 25.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"check_interval": 0},
        {"backoff_initial": 10, "backoff_max": 5},
        {"backoff_factor": 0.5},
        {"jitter": 1.5},
        {"targets_max": 0},
        {"failed_max": 0},
        {"reconnect_max": 0},
        {"bootstrap_retry_max": -1},
    ],
)
def test_bad_config_is_one_line_value_error(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="RejoinConfig") as info:
        RejoinConfig(**kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


####################################################################################
# Bootstrap peers missing from a joined node's view


def test_a_missing_bootstrap_peer_is_tried_at_once_then_backed_off_then_given_up() -> None:
    """5, 10, 20 s apart on a LAN (check_interval doubling), four tries in all."""
    p = policy()
    tried = [t for t in range(100, 200) if p.bootstrap_targets(float(t), ["b"])]
    assert tried == [100, 105, 115, 135]
    assert p.bootstrap_retries == 4


def test_a_held_bootstrap_peer_is_not_tried_and_a_new_loss_gets_a_fresh_budget() -> None:
    p = policy(RejoinConfig(jitter=0.0, bootstrap_retry_max=1))
    assert p.bootstrap_targets(100.0, ["a", "b"]) == ["a", "b"]
    assert p.bootstrap_targets(200.0, ["a", "b"]) == []  # budget spent
    assert p.bootstrap_targets(201.0, ["b"]) == []  # "a" is held now
    assert p.bootstrap_targets(202.0, ["a", "b"]) == ["a"]  # lost again: one more try


def test_bootstrap_retry_max_zero_switches_it_off() -> None:
    p = policy(RejoinConfig(bootstrap_retry_max=0))
    assert p.bootstrap_targets(100.0, ["a"]) == []


@given(
    seen=st.lists(
        st.tuples(st.floats(0.0, 5.0), st.lists(st.sampled_from("abcd"), max_size=6)),
        max_size=60,
    ),
    most=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_bootstrap_retries_are_bounded_backed_off_and_only_for_missing_peers(
    seen: list[tuple[float, list[str]]], most: int, seed: int
) -> None:
    """Whatever the sequence of views: only missing peers are returned, no peer more
    than `bootstrap_retry_max` times per absence, two tries of one peer at least
    check_interval x (1 - jitter) apart."""
    config = RejoinConfig(jitter=0.2, bootstrap_retry_max=most)
    p = policy(config, seed=seed)
    now = 100.0
    last: dict[str, float] = {}
    tries: dict[str, int] = {}
    for step, missing in seen:
        now += step
        for gone in [a for a in tries if a not in missing]:
            del tries[gone], last[gone]
        got = p.bootstrap_targets(now, missing)
        assert set(got) <= set(missing) and len(got) == len(set(got))
        for address in got:
            tries[address] = tries.get(address, 0) + 1
            assert tries[address] <= most
            if address in last:
                assert now - last[address] >= config.check_interval * 0.8 - 1e-9
            last[address] = now


@given(
    candidates=st.lists(st.sampled_from("abcdefgh"), max_size=12),
    most=st.integers(min_value=1, max_value=4),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_first_targets_are_at_most_first_join_max_distinct_candidates(
    candidates: list[str], most: int, seed: int
) -> None:
    p = policy(RejoinConfig(jitter=0.0, first_join_max=most), seed=seed)
    got = p.first_targets(candidates)
    assert len(got) == min(most, len(set(candidates)))
    assert len(set(got)) == len(got) and set(got) <= set(candidates)
    # Only the life's first join is narrowed: a retry (no answer) tries every candidate.
    assert p.first_targets(candidates) == list(dict.fromkeys(candidates))


def test_first_joins_of_a_fleet_are_spread_over_the_seeds() -> None:
    """100 daemons started at once through the same two seeds: each seed gets about
    half of the start's joins, not every one."""
    counts = {"s0": 0, "s1": 0}
    for seed in range(100):
        (target,) = policy(seed=seed).first_targets(["s0", "s1"])
        counts[target] += 1
    assert 30 <= counts["s0"] <= 70 and counts["s0"] + counts["s1"] == 100


def test_first_join_max_must_be_positive() -> None:
    with pytest.raises(ValueError, match="first_join_max"):
        RejoinConfig(first_join_max=0)
