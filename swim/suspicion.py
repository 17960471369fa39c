"""Lifeguard's dynamic suspicion timeout (section 4.2 of the Lifeguard paper).

SWIM suspects a member for a fixed time. Lifeguard starts the timer long (`max`) and
shortens it each time another member independently suspects the same member: when K
others agree, it is probably really down and the timer is at `min`. One slow node's lone
suspicion therefore takes much longer to kill a healthy member, while real failures,
which everybody notices, are still declared quickly.
"""

from __future__ import annotations

import math


def remaining_suspicion_time(
    n: int, k: int, elapsed: float, timeout_min: float, timeout_max: float
) -> float:
    """Seconds left before a suspicion with `n` of `k` confirmations times out.

    The timeout is `max - log(n+1)/log(k+1) * (max - min)`, floored to whole
    milliseconds and never below `min`, minus the `elapsed` time since the suspicion
    started. The result is negative when the deadline has already passed. This is
    memberlist's `remainingSuspicionTime`, ported with its test table.

    Args:
        n: confirmations received so far.
        k: confirmations expected; with k < 1 the timeout is fixed at `timeout_min`.
        elapsed: seconds since the suspicion started.
        timeout_min: the shortest suspicion, reached at k confirmations.
        timeout_max: the starting suspicion timeout.
    """
    if k < 1:
        return timeout_min - elapsed
    fraction = math.log(n + 1.0) / math.log(k + 1.0)
    raw = timeout_max - fraction * (timeout_max - timeout_min)
    timeout_ms = math.floor(1000.0 * raw)
    timeout = max(timeout_ms / 1000.0, timeout_min)
    return timeout - elapsed


class Suspicion:
    """One member's suspicion: its deadline and who has confirmed it.

    A value with a deadline, not a timer callback: the core keeps it on the member and
    fires it from `tick`. Confirmations are bounded by `k`, and the member who started
    the suspicion, or any member confirming twice, counts once.
    """

    __slots__ = ("_confirmers", "_k", "_max", "_min", "deadline", "postponed", "start")

    def __init__(
        self, source: str, k: int, timeout_min: float, timeout_max: float, now: float
    ) -> None:
        """Args:
        source: who raised the suspicion; its later confirmations do not count.
        k: confirmations expected (0: fixed timeout at `timeout_min`).
        timeout_min: seconds, reached after k confirmations.
        timeout_max: seconds, the starting timeout when k >= 1.
        now: the core's clock when the suspicion started.
        """
        self._k = k
        self._min = timeout_min
        self._max = timeout_max
        self._confirmers: dict[str, None] = {source: None}
        self.start = now
        #: When the member is to be declared dead, absent a refute.
        self.deadline = now + (timeout_max if k >= 1 else timeout_min)
        #: Seconds `postpone` has added so far (at most `timeout_min`).
        self.postponed = 0.0

    @property
    def confirmations(self) -> int:
        """Independent confirmations counted so far (the source does not count)."""
        return len(self._confirmers) - 1

    def confirm(self, source: str, now: float) -> bool:
        """Count `source`'s independent suspicion and move the deadline in.

        Returns:
            True when this was a new confirmation (worth re-gossiping), False for a
            duplicate, the original source, or once k confirmations are in.
        """
        n = len(self._confirmers) - 1
        if n >= self._k or source in self._confirmers:
            return False
        self._confirmers[source] = None
        elapsed = now - self.start
        remaining = remaining_suspicion_time(n + 1, self._k, elapsed, self._min, self._max)
        deadline = now + remaining
        # Time given back for our own stall (`postpone`) stays given.
        if not self.postponed or deadline > self.deadline:
            self.deadline = deadline
        return True

    def postpone(self, now: float, stall: float) -> bool:
        """The suspicion expired while this node was stalled for `stall` seconds:
        move the deadline to `now` plus the stall, so that the suspect gets back the
        time in which we neither gossiped its suspicion nor read its refute. All
        postponements of one suspicion add up to at most `timeout_min`, so a node that
        stays starved still reaches a verdict.

        Returns:
            False when nothing is left to add: the suspicion expires now.
        """
        grant = min(stall, self._min - self.postponed)
        if grant <= 0.0:
            return False
        self.postponed += grant
        self.deadline = now + grant
        return True

    def remaining(self, now: float) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self.deadline - now
