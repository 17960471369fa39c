"""`swim._stats`: the mutable counters and their frozen snapshot stay twins."""

from __future__ import annotations

import attrs
import pytest

from swim import MembershipStatistics
from swim._stats import Counters

FIELDS = [f.name for f in attrs.fields(MembershipStatistics)]


def test_counters_have_exactly_the_snapshot_fields() -> None:
    assert list(Counters.__slots__) == FIELDS
    # Every slot is annotated too, so mypy sees the hot path's increments.
    assert set(Counters.__annotations__) == set(FIELDS)


def test_fresh_counters_are_zero_and_snapshot_to_the_default() -> None:
    assert Counters().snapshot() == MembershipStatistics()


def test_each_counter_reaches_its_own_field_of_the_snapshot() -> None:
    counters = Counters()
    for i, name in enumerate(FIELDS, start=1):
        setattr(counters, name, i)
    snapshot = counters.snapshot()
    assert [getattr(snapshot, name) for name in FIELDS] == list(range(1, len(FIELDS) + 1))


def test_the_snapshot_is_frozen_and_later_increments_do_not_reach_it() -> None:
    counters = Counters()
    counters.pulls_sent += 2
    snapshot = counters.snapshot()
    counters.pulls_sent += 1
    assert snapshot.pulls_sent == 2
    assert counters.snapshot().pulls_sent == 3
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        snapshot.pulls_sent = 9  # type: ignore[misc]


def test_counters_take_no_other_attribute() -> None:
    with pytest.raises(AttributeError):
        Counters().not_a_counter = 1  # type: ignore[attr-defined]
