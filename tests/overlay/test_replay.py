"""The replay table against a plain reference model, and its bounds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.replay import ReplayTable

S = 1_000_000  # microseconds per second
NOW = 1_700_000_000 * S


def table(window: int = 64, max_senders: int = 16) -> ReplayTable:
    return ReplayTable(window=window, freshness_us=120 * S, max_senders=max_senders)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 80), st.lists(st.integers(0, 300), max_size=200))
def test_window_matches_reference_model(window: int, counters: list[int]) -> None:
    t = table(window)
    seen: set[int] = set()
    for c in counters:
        highest = max(seen, default=None)
        new = c not in seen and (highest is None or c > highest - window)
        verdict = t.check(b"s", c, NOW, NOW)
        assert (verdict is None) == new, (c, sorted(seen))
        if new:
            t.commit(b"s", c, NOW, NOW)
            seen.add(c)
        else:
            assert verdict == "replayed"


def test_senders_are_independent() -> None:
    t = table()
    t.commit(b"a", 10, NOW, NOW)
    assert t.check(b"b", 10, NOW, NOW) is None
    assert t.check(b"a", 10, NOW, NOW) == "replayed"


def test_freshness_both_ways() -> None:
    t = table()
    assert t.check(b"a", 1, NOW - 121 * S, NOW) == "stale"
    assert t.check(b"a", 1, NOW + 121 * S, NOW) == "stale"
    assert t.check(b"a", 1, NOW + 119 * S, NOW) is None


def test_idle_entries_expire_because_they_protect_nothing() -> None:
    t = table()
    t.commit(b"a", 1000, NOW, NOW)
    later = NOW + 121 * S
    # Anything Alice sent before is stale by now, so a lower counter (a restart with a
    # clock that stepped back) is accepted, and the old entry is gone.
    assert t.check(b"a", 5, later, later) is None
    t.commit(b"a", 5, later, later)
    assert t.check(b"a", 5, later, later) == "replayed"
    assert len(t) == 1


def test_bounded_and_eviction_keeps_replays_out() -> None:
    t = table(max_senders=3)
    for i in range(10):
        t.commit(bytes([i]), 1, NOW + i, NOW + i)
    assert len(t) == 3
    # Sender 0 was evicted while its packets were still fresh: they stay refused...
    assert t.check(b"\x00", 1, NOW, NOW + 10) == "replayed"
    # ...while genuinely newer packets from unknown senders get in.
    assert t.check(b"\x00", 2, NOW + 11, NOW + 11) is None
