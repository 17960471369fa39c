"""Every scaling formula of the protocol, in one place.

memberlist spreads these over several files and documents one base of logarithm while
using another in places; keeping each formula here once, with tests against the numbers
the issue and the papers give, means the simulator, the daemon and the docs cannot
drift apart.
"""

from __future__ import annotations

import math

#: Below this many members push-pull runs at its configured interval; above it the
#: interval grows with log2 of the cluster size (memberlist's pushPullScaleThreshold).
PUSH_PULL_SCALE_THRESHOLD = 32
#: Weight of a new round-trip sample in the smoothed RTT, TCP's alpha (RFC 6298): an
#: eighth, so one slow ack moves the estimate a little and a lasting change within a
#: dozen probes.
RTT_SMOOTHING = 0.125


def retransmit_limit(retransmit_mult: int, n: int) -> int:
    """How many times one update is piggybacked before it is dropped.

    `retransmit_mult * ceil(log10(n + 1))`: with 4 and a 1,000-member cluster an update
    rides 12 messages, enough for epidemic spread to reach everybody with high
    probability (SWIM section 4.1), while the total load stays O(log n) per update.

    Args:
        retransmit_mult: `SwimConfig.retransmit_mult`.
        n: the number of live members, self included.
    """
    return retransmit_mult * math.ceil(math.log10(max(n, 0) + 1))


def suspicion_timeout_min(suspicion_mult: int, n: int, probe_interval: float) -> float:
    """The shortest time a member stays suspect: `mult * log10(max(n, 1) + 1) * interval`.

    The log factor gives a suspect message enough protocol periods to reach everybody
    (and the suspect the chance to refute) as the cluster grows.
    """
    return suspicion_mult * math.log10(max(n, 1) + 1) * probe_interval


def suspicion_timeout_max(suspicion_max_mult: int, timeout_min: float) -> float:
    """Lifeguard's starting suspicion timeout: `suspicion_max_mult * min`."""
    return suspicion_max_mult * timeout_min


def suspicion_confirmations_expected(suspicion_mult: int, n: int) -> int:
    """Lifeguard's K: independent suspicions that shrink the timeout to its minimum.

    memberlist takes `suspicion_mult - 2` and falls back to 0 (a fixed timeout at the
    minimum) when the cluster is too small to ever produce that many other suspectors:
    the suspect itself and the local node cannot confirm.
    """
    k = suspicion_mult - 2
    if n - 2 < k:
        return 0
    return max(k, 0)


def push_pull_interval_scaled(interval: float, n: int) -> float:
    """Push-pull slows down in big clusters: full-state exchange costs O(n) each time.

    Unchanged up to 32 members, then `interval * (ceil(log2(n) - log2(32)) + 1)`:
    64 members exchange every 2 intervals, 10,000 members every 10.
    """
    if n <= PUSH_PULL_SCALE_THRESHOLD:
        return interval
    multiplier = math.ceil(math.log2(n) - math.log2(PUSH_PULL_SCALE_THRESHOLD)) + 1
    return interval * multiplier


def smoothed_rtt(previous: float | None, sample: float) -> float:
    """Fold one round-trip sample into the smoothed RTT of a member (an EWMA).

    `sample` when there is no estimate yet, else
    `previous + RTT_SMOOTHING * (sample - previous)`, as TCP's SRTT.

    Args:
        previous: the current estimate in seconds, or None before the first sample.
        sample: one measured round trip in seconds (ping sent to ack received).
    """
    if previous is None:
        return sample
    return previous + RTT_SMOOTHING * (sample - previous)
