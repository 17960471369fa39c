"""Failure detection: who to probe next, and the state of the probe in flight.

memberlist's `probeNode` blocks a goroutine through its phases. Here a probe is a value,
`ProbeRound`, with two deadlines, and `Membership.tick` moves it along:

1. direct: a ping went to the target; an ack ends the probe successfully;
2. at `timeout_at` without an ack: indirect pings through k members, plus a reliable
   ping to the target when enabled;
3. at `round_end` (one protocol period after the start) without an ack: failure, and
   the target becomes suspect. An ack that arrives late, after `timeout_at` but before
   `round_end`, still counts, so a briefly paused member is not suspected.

When the node itself was starved (no CPU until well after a deadline), each phase is
given its length from when the node actually runs: `go_indirect` moves `round_end` by
the lateness, and `stretch` gives a round whose end came during a stall the stall once
more (the stall guard, docs/protocol.md "Stalls"), since the answer may be sitting
unread in our own socket.

`ProbeOrder` is SWIM's randomized round-robin (section 4.3): each round visits every
member once in random order, which bounds the time until a failed member is probed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ProbeRound(Generic[T]):
    """One probe in flight. Keyed by `seq`: any ack with this seq answers it."""

    __slots__ = (
        "indirect",
        "nacks_expected",
        "nacks_received",
        "phase",
        "round_end",
        "seq",
        "started_at",
        "stretched",
        "target",
        "timeout_at",
    )

    def __init__(self, target: T, seq: int, now: float, timeout: float, interval: float) -> None:
        self.target = target
        self.seq = seq
        self.started_at = now
        #: When the direct phase gives up and the indirect phase starts.
        self.timeout_at = now + timeout
        #: When the probe fails for good if no ack came.
        self.round_end = now + interval
        #: Length of the indirect phase (the period less the probe timeout).
        self.phase = interval - timeout
        self.indirect = False
        #: Whether `stretch` was used: a round is stretched at most once.
        self.stretched = False
        self.nacks_expected = 0
        self.nacks_received = 0

    def go_indirect(self, now: float) -> float:
        """Enter the indirect phase at `now`; returns how late that is (seconds after
        `timeout_at`). The phase keeps its full length (`round_end - timeout_at`) from
        `now`, however late the node got to run."""
        late = now - self.timeout_at
        self.indirect = True
        if late > 0:
            self.round_end += late
        return late

    def stretch(self, now: float, stall: float) -> bool:
        """The round ended while this node was stalled for `stall` seconds: give it
        `min(stall, phase)` more from `now`, once. An ack (direct or relayed) that
        arrived during the stall is then read before the round can fail, and a real
        failure is noticed at most that much later.

        Returns:
            False when the round was stretched already: it fails now.
        """
        if self.stretched:
            return False
        self.stretched = True
        self.round_end = now + min(stall, self.phase)
        return True

    def deadline(self) -> float:
        """The next time this probe needs the core's attention."""
        return self.round_end if self.indirect else self.timeout_at


class ProbeOrder:
    """Randomized round-robin over member indexes, shuffled lazily.

    A round visits the indexes 0..n-1 of the core's member-name list in a uniformly
    random order, by an incremental Fisher-Yates shuffle: each `next` swaps a random
    not-yet-visited position into place. The permutation is kept sparse (only positions
    that differ from the identity are stored), so starting a round is O(1) and a round
    costs O(probes made), even for a 10,000-member view, and nothing here is a large
    container for Python's garbage collector to walk. A member added mid-round gets the
    next position, which lands it at a uniformly random point among the members still
    to be probed this round (SWIM's "insert at a random position").
    """

    __slots__ = ("_index", "_moved", "_n", "_size")

    def __init__(self, size: Callable[[], int]) -> None:
        """Args:
        size: the current length of the member-name list (read once per round).
        """
        self._size = size
        self._n = 0
        self._index = 0
        self._moved: dict[int, int] = {}

    def __len__(self) -> int:
        """Positions in the current round, visited or not."""
        return self._n

    def add(self, index: int) -> None:
        """A new member: it will be visited at a random point of the current round."""
        if index != self._n:
            self._moved[self._n] = index
        self._n += 1

    def restart(self) -> None:
        """Forget the current round (the index space changed); the next call to `next`
        starts a fresh one."""
        self._n = 0
        self._index = 0
        self._moved = {}

    def next(self, rng: random.Random, usable: Callable[[int], bool]) -> int | None:
        """The next member index to probe, or None when nobody is usable.

        Entries that became unusable (dead, left, reaped, ourselves) are skipped; they
        cost O(1) amortized, as each is skipped at most once per round.
        """
        refilled = False
        moved = self._moved
        while True:
            index = self._index
            n = self._n
            if index >= n:
                if refilled:
                    return None
                self._n = n = self._size()
                self._index = index = 0
                self._moved = moved = {}
                refilled = True
                if not n:
                    return None
            j = rng.randrange(index, n)
            item = moved.pop(j, j)
            if j != index:
                moved[j] = moved.pop(index, index)
            self._index = index + 1
            if usable(item):
                return item
