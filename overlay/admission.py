"""What an unauthenticated source may cost us, and counters of what we dropped and why.

Checking an Ed25519 signature costs about 60 microseconds; anybody who can reach the
port can send packets that force that work. But a source *address* proves nothing: a
second process on a member's host, or a spoofed source on the LAN, can send junk "from"
a member. So the budget must never be one that junk can spend on the member's behalf.
`AdmissionGate` decides which packets earn a signature check, in three tiers:

1. Shape: a packet whose envelope does not even parse (size, kind, flags, length) or
   that is stale or replayed is refused before any bucket is touched. It costs no
   crypto, so it needs no budget; it is only counted. Random junk ends here.
2. Known sender: a packet that names a sender whose certificate we already verified is
   judged by that *claimed sender*, never by its source address. If its counter
   continues the sender's replay window (`continues`), it is always verified: the real
   sender's packets do, and a blind forger cannot guess the window. Other packets naming
   that sender (a restart, or a forger's guess) spend the claimed sender's own bucket,
   which only failed verifications drain.
3. Unknown sender: a per-source-address `SourceRateLimiter` (and an optional global
   one), drained only by packets that failed a signature or certificate check.

So a member's correctly signed packets are never dropped because of packets that did
not verify, whatever address those came from.

`SourceRateLimiter` gives every source
address a token bucket that only *failed* packets drain: a member whose packets
authenticate never notices it, while a source that keeps sending forgeries is
cut to `rate` examined packets per second, and the rest are dropped before any crypto
(counted as `rate_limited`). The table of buckets is bounded (least recently used
sources are forgotten first), and an optional global bucket caps the total work spent on
failures when many source addresses are spoofed.

IPv6 hands every host a /64, so `source_key` folds an IPv6 address to its /64: one
attacker cannot dodge its bucket by cycling through its own subnet.

`DropCounters` is the one counter type behind every "dropped, counted by reason" in
the overlay and the record book; `as_dict()` is what `status` shows.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Final

import attrs

__all__ = ["AdmissionGate", "DropCounters", "SourceRateLimiter", "TokenBucket", "source_key"]

#: IPv6 prefix length treated as one source (a typical end-site allocation).
IPV6_SOURCE_PREFIX: Final = 64


def source_key(host: str) -> str:
    """The rate-limiting key for a source address: the IPv4 address, or the IPv6 /64.

    An unparseable host (a test's synthetic address, a unix socket) is its own key.
    """
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{address}/{IPV6_SOURCE_PREFIX}", strict=False))
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


class DropCounters:
    """Counts of dropped inputs by reason.

    Reasons given at construction always appear in `as_dict` (as 0 until they happen),
    so `status` shows the full list of what *could* be dropped. Reasons are names from
    the code, never from input, so the table stays small.
    """

    def __init__(self, reasons: Iterable[str] = ()) -> None:
        self._counts: dict[str, int] = dict.fromkeys(reasons, 0)

    def add(self, reason: str, count: int = 1) -> None:
        """Count `count` more drops for `reason`."""
        self._counts[reason] = self._counts.get(reason, 0) + count

    def __getitem__(self, reason: str) -> int:
        return self._counts.get(reason, 0)

    @property
    def total(self) -> int:
        """All drops, every reason."""
        return sum(self._counts.values())

    def as_dict(self) -> dict[str, int]:
        """A snapshot, sorted by reason, for status output and metrics."""
        return {reason: self._counts[reason] for reason in sorted(self._counts)}

    def __repr__(self) -> str:
        return f"DropCounters({self.as_dict()!r})"


@attrs.define
class TokenBucket:
    """A classic token bucket: `rate` tokens per second, at most `burst` saved up.

    Time is passed in (monotonic seconds), so tests and the simulator drive it.
    """

    rate: float
    burst: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        return cls(rate, burst, burst, now)

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now

    def available(self, now: float) -> bool:
        """Whether at least one token is there (does not take it)."""
        self._refill(now)
        return self.tokens >= 1.0

    def take(self, now: float, cost: float = 1.0) -> None:
        """Take `cost` tokens; the balance may go negative, which delays recovery."""
        self._refill(now)
        self.tokens = max(self.tokens - cost, -self.burst)


class SourceRateLimiter:
    """Per-source token buckets drained by failed authentication, bounded in size.

    Use: before authenticating a packet from `source`, ask `allow(source, now)`; when
    authentication fails, `charge(source, now)`. Successful packets cost nothing.

    Args:
        rate: failed packets per second a source may keep costing us.
        burst: failed packets a fresh source may send at once.
        max_sources: sources remembered; the least recently seen is forgotten first.
        global_rate: failed packets per second over all sources together (None: no
            global cap). A cap keeps the CPU bounded under a flood from spoofed
            addresses, at the price of also refusing unknown *good* sources during one.
        global_burst: the global bucket's burst (defaults to `global_rate`).
    """

    def __init__(
        self,
        *,
        rate: float = 5.0,
        burst: float = 20.0,
        max_sources: int = 4096,
        global_rate: float | None = None,
        global_burst: float | None = None,
    ) -> None:
        if not (rate > 0 and burst >= 1 and max_sources >= 1):
            raise ValueError("rate must be positive, burst at least 1, max_sources at least 1")
        if global_rate is not None and not global_rate > 0:
            raise ValueError("global_rate must be positive (or None for no global cap)")
        self.rate = rate
        self.burst = burst
        self.max_sources = max_sources
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()
        self._global: TokenBucket | None = None
        if global_rate is not None:
            gb = global_burst if global_burst is not None else max(global_rate, 1.0)
            self._global = TokenBucket(global_rate, gb, gb, float("-inf"))

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, source: Hashable, now: float) -> bool:
        """Whether a packet from `source` may be examined now (takes no token)."""
        if self._global is not None and not self._global.available(now):
            return False
        bucket = self._buckets.get(source)
        if bucket is None:
            return True
        self._buckets.move_to_end(source)
        return bucket.available(now)

    def charge(self, source: Hashable, now: float, cost: float = 1.0) -> None:
        """Record that a packet from `source` failed authentication."""
        if self._global is not None:
            self._global.take(now, cost)
        bucket = self._buckets.get(source)
        if bucket is None:
            bucket = TokenBucket.full(self.rate, self.burst, now)
            self._buckets[source] = bucket
            while len(self._buckets) > self.max_sources:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(source)
        bucket.take(now, cost)


class AdmissionGate:
    """Which packets earn a signature check (see the module doc for the three tiers).

    The authenticator asks `admit` after the cheap checks and before any crypto, and
    reports `failed` when a packet that was admitted did not verify. A packet that
    verifies costs no budget at all.

    Args:
        unauthenticated: the per-source-address limiter for senders we do not know yet.
        claimed_rate: failed verifications per second a known sender's *name* may cost us
            when the packets do not continue its replay window.
        claimed_burst: the same, at once.
        max_claimed: known senders whose buckets are remembered (LRU beyond).
    """

    def __init__(
        self,
        *,
        unauthenticated: SourceRateLimiter | None = None,
        claimed_rate: float = 5.0,
        claimed_burst: float = 20.0,
        max_claimed: int = 4096,
    ) -> None:
        self.unauthenticated = (
            unauthenticated if unauthenticated is not None else SourceRateLimiter()
        )
        self.claimed = SourceRateLimiter(
            rate=claimed_rate, burst=claimed_burst, max_sources=max_claimed
        )

    def admit(
        self, source: Hashable | None, sender: bytes, *, known: bool, continues: bool, now: float
    ) -> bool:
        """Whether this packet may have its certificate and signature checked now.

        Args:
            source: the rate-limiting key of the source address (`source_key`), or None
                when there is none (a test, a local caller): then only known-sender
                budgets apply.
            sender: the sender public key the envelope claims.
            known: we hold a verified certificate for `sender`.
            continues: its counter continues `sender`'s live replay window.
            now: seconds (any clock, used consistently).
        """
        if known:
            return continues or self.claimed.allow(sender, now)
        return source is None or self.unauthenticated.allow(source, now)

    def failed(self, source: Hashable | None, sender: bytes, *, known: bool, now: float) -> None:
        """An admitted packet failed its certificate or signature check: charge it."""
        if known:
            self.claimed.charge(sender, now)
        elif source is not None:
            self.unauthenticated.charge(source, now)
