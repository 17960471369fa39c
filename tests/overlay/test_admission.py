"""Rate limiting what unauthenticated sources cost, and drop counters."""

from __future__ import annotations

import pytest

from overlay.admission import DropCounters, SourceRateLimiter, TokenBucket, source_key


def test_failures_drain_only_the_failing_source() -> None:
    limiter = SourceRateLimiter(rate=2.0, burst=5.0)
    for _ in range(5):
        assert limiter.allow("10.0.0.9", 0.0)
        limiter.charge("10.0.0.9", 0.0)
    assert not limiter.allow("10.0.0.9", 0.0)
    assert limiter.allow("10.0.0.7", 0.0)  # another source is unaffected


def test_recovers_at_rate() -> None:
    limiter = SourceRateLimiter(rate=2.0, burst=5.0)
    for _ in range(5):
        limiter.charge("s", 0.0)
    assert not limiter.allow("s", 0.4)  # 0.8 tokens
    assert limiter.allow("s", 0.5)  # 1 token
    limiter.charge("s", 0.5)
    assert not limiter.allow("s", 0.5)
    assert limiter.allow("s", 100.0)


def test_sustained_attack_is_held_to_rate() -> None:
    limiter = SourceRateLimiter(rate=5.0, burst=20.0)
    examined = 0
    for i in range(10_000):  # 1000 junk packets per second for 10 s
        now = i / 1000
        if limiter.allow("attacker", now):
            examined += 1
            limiter.charge("attacker", now)
    assert examined <= 20 + 5 * 10 + 1


def test_table_is_bounded_lru() -> None:
    limiter = SourceRateLimiter(rate=1.0, burst=1.0, max_sources=3)
    for source in "abcd":
        limiter.charge(source, 0.0)
    assert len(limiter) == 3
    assert limiter.allow("a", 0.0)  # forgotten: a fresh bucket
    assert not limiter.allow("d", 0.0)


def test_global_cap() -> None:
    limiter = SourceRateLimiter(rate=100.0, burst=100.0, global_rate=10.0, global_burst=10.0)
    for i in range(10):
        limiter.charge(f"spoofed-{i}", 0.0)
    assert not limiter.allow("spoofed-new", 0.0)
    assert limiter.allow("spoofed-new", 0.1)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        SourceRateLimiter(rate=0)
    with pytest.raises(ValueError):
        SourceRateLimiter(global_rate=-1)


def test_token_bucket_never_goes_below_minus_burst() -> None:
    bucket = TokenBucket.full(1.0, 2.0, 0.0)
    for _ in range(10):
        bucket.take(0.0)
    assert bucket.tokens == -2.0
    assert bucket.available(3.0)


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("192.0.2.1", "192.0.2.1"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::ffff", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("::ffff:192.0.2.1", "192.0.2.1"),
        ("node-3", "node-3"),
    ],
)
def test_source_key(host: str, key: str) -> None:
    assert source_key(host) == key


def test_drop_counters() -> None:
    drops = DropCounters(["b", "a"])
    assert drops.as_dict() == {"a": 0, "b": 0}
    drops.add("b")
    drops.add("c", 3)
    assert drops.as_dict() == {"a": 0, "b": 1, "c": 3}
    assert list(drops.as_dict()) == ["a", "b", "c"]
    assert drops["b"] == 1 and drops["zzz"] == 0 and drops.total == 4
