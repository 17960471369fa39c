"""The suite's Hypothesis runs are reproducible: the ``ci`` profile is loaded by default.

Issue 7 §6: a random counterexample once failed CI on one run and passed on the next.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

_SEEN: list[list[int]] = []


@settings(max_examples=20)
@given(st.lists(st.integers(), max_size=5))
def _draw(values: list[int]) -> None:
    _SEEN[-1].append(hash(tuple(values)))


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci", reason="ci profile only")
def test_ci_profile_is_loaded_and_deterministic() -> None:
    assert settings.default.derandomize is True
    assert settings.default.database is None
    assert settings.default.deadline is None
    # A test's own @settings keeps the profile's derandomize: two runs draw the same.
    for _ in range(2):
        _SEEN.append([])
        _draw()
    assert _SEEN[0] == _SEEN[1] and len(_SEEN[0]) > 1
