"""Durations as typed on the command line: units add up, anything else is one line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from populi_p2p._duration import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("45s", 45.0),
        ("30m", 1800.0),
        ("12h", 43200.0),
        ("30d", 30 * 86400.0),
        ("2w", 14 * 86400.0),
        ("1y", 365 * 86400.0),
        ("1d12h", 1.5 * 86400),
        ("1.5h", 5400.0),
        (" 2H ", 7200.0),  # case and surrounding blanks do not matter
        ("1 h", 3600.0),  # blanks between a number and its unit
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "  ", "0", "0s", "h", "5q", "-1d", "1d x", "1..5h", "d1"])
def test_bad_durations_are_one_line_naming_the_input(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration") as caught:
        parse_duration(text)
    assert repr(text.strip().lower()) in str(caught.value)


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from("smhdwy")), min_size=1))
def test_parts_add_up(parts: list[tuple[int, str]]) -> None:
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    total = sum(n * unit[u] for n, u in parts)
    text = "".join(f"{n}{u}" for n, u in parts)
    if total > 0:
        assert parse_duration(text) == total
    else:
        with pytest.raises(ValueError):
            parse_duration(text)
