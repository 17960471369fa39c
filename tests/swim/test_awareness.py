"""Awareness (Lifeguard's local health multiplier): memberlist's TestAwareness, case for case."""

from __future__ import annotations

import pytest

from swim import Awareness

####################################################################################
# Awareness: memberlist's TestAwareness, case for case
####################################################################################

AWARENESS_CASES = [
    (0, 0, 1.0),
    (-1, 0, 1.0),
    (-10, 0, 1.0),
    (1, 1, 2.0),
    (-1, 0, 1.0),
    (10, 7, 8.0),
    (-1, 6, 7.0),
    (-1, 5, 6.0),
    (-1, 4, 5.0),
    (-1, 3, 4.0),
    (-1, 2, 3.0),
    (-1, 1, 2.0),
    (-1, 0, 1.0),
    (-1, 0, 1.0),
]


def test_awareness_table() -> None:
    awareness = Awareness(8)
    for delta, score, timeout in AWARENESS_CASES:
        assert awareness.apply_delta(delta) == score
        assert awareness.score == score
        assert awareness.scale(1.0) == timeout


def test_awareness_rejects_zero_max() -> None:
    with pytest.raises(ValueError, match="max_multiplier"):
        Awareness(0)
