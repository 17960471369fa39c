"""Departed members: kept for `retention`, newest departure last, bounded, and dropped
when they come back."""

from __future__ import annotations

import pytest

from populi_p2p.services.departed import DepartedMembers


def row(node_id: str, last_seen: float = 0.0) -> dict[str, object]:
    return {"node_id": node_id, "state": "dead", "last_seen": last_seen}


def test_rows_within_retention_with_the_seconds_since() -> None:
    departed = DepartedMembers(retention=60.0)
    departed.keep(row("a", 1.0), departed_at=100.0)
    departed.keep(row("b", 2.0), departed_at=130.0)
    assert departed.rows(150.0) == [
        row("a", 1.0) | {"state_since": 50.0},
        row("b", 2.0) | {"state_since": 20.0},
    ]
    assert [r["node_id"] for r in departed.rows(170.0)] == ["b"]  # a expired at 160
    assert len(departed) == 1
    assert departed.rows(500.0) == [] and len(departed) == 0


def test_members_the_core_still_holds_are_left_out_but_kept() -> None:
    departed = DepartedMembers(retention=60.0)
    departed.keep(row("a"), departed_at=0.0)
    assert departed.rows(1.0, except_ids=["a"]) == []
    assert len(departed) == 1


def test_a_second_departure_replaces_the_first_and_moves_last() -> None:
    departed = DepartedMembers(retention=60.0)
    departed.keep(row("a", 1.0), departed_at=0.0)
    departed.keep(row("b"), departed_at=10.0)
    departed.keep(row("a", 5.0), departed_at=20.0)
    assert [r["node_id"] for r in departed.rows(30.0)] == ["b", "a"]
    assert departed.last_seen("a") == 5.0


def test_a_member_back_is_discarded() -> None:
    departed = DepartedMembers(retention=60.0)
    departed.keep(row("a", 3.0), departed_at=0.0)
    departed.discard("a")
    departed.discard("never-here")
    assert departed.last_seen("a") is None and len(departed) == 0


def test_the_oldest_departure_goes_first_past_the_capacity() -> None:
    departed = DepartedMembers(retention=1e9, capacity=3)
    for n in range(5):
        departed.keep(row(f"n{n}"), departed_at=float(n))
    assert [r["node_id"] for r in departed.rows(10.0)] == ["n2", "n3", "n4"]


def test_the_kept_row_is_a_copy() -> None:
    departed = DepartedMembers(retention=60.0)
    original = row("a")
    departed.keep(original, departed_at=0.0)
    original["state"] = "alive"
    assert departed.rows(1.0)[0]["state"] == "dead"


@pytest.mark.parametrize(("retention", "capacity"), [(-1.0, 10), (10.0, 0)])
def test_bad_limits_are_refused(retention: float, capacity: int) -> None:
    with pytest.raises(ValueError, match="need retention >= 0 and capacity >= 1"):
        DepartedMembers(retention, capacity)
