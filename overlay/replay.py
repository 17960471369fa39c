"""Replay protection: a sliding window over each sender's packet counters, plus freshness.

Each sender numbers its packets with one counter shared by all destinations (see
`overlay.auth` for how it is seeded so that restarts keep it increasing). A receiver
keeps, per sender, the highest counter it accepted and a bitmap of the `window`
counters below it (IPsec/WireGuard style, RFC 6479 without the blocks):

- a counter above the highest is new: the window slides up;
- a counter inside the window is new if its bit is clear (reordering is fine);
- a counter already seen, or older than the window, is a replay.

A packet's signed timestamp must also lie within `freshness` of the receiver's clock.
That bounds how long any packet is worth remembering, which makes the table safe to
bound: an entry whose newest timestamp is older than `freshness` protects nothing (every
packet it could catch is stale anyway) and is dropped; if the table is full of live
entries, the least recently used is evicted and its newest timestamp raises a floor that
packets from senders without an entry must exceed, so eviction never reopens a replay.

The table does not check signatures: `check` is a pure look-up, cheap enough to run
before the signature (to drop obvious replays early), and only `commit`, called after
the signature verified, changes state. All times are integers in microseconds.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

import attrs

__all__ = ["ReplayReason", "ReplayTable"]

ReplayReason = Literal["replayed", "stale"]


@attrs.define
class _Window:
    #: Highest counter accepted.
    highest: int
    #: Bit i set: counter `highest - i` was accepted (bit 0 is `highest` itself).
    seen: int
    #: Newest timestamp accepted, microseconds.
    newest_us: int


class ReplayTable:
    """Per-sender replay windows, bounded in number.

    Args:
        window: counters remembered below the highest; older ones are refused.
        freshness_us: largest allowed distance, either way, between a packet's timestamp
            and the receiver's clock.
        max_senders: entries kept; the least recently used live one is evicted beyond.
    """

    def __init__(self, *, window: int, freshness_us: int, max_senders: int) -> None:
        if window < 1 or freshness_us < 0 or max_senders < 1:
            raise ValueError("window and max_senders must be positive, freshness not negative")
        self.window = window
        self.freshness_us = freshness_us
        self.max_senders = max_senders
        self._mask = (1 << window) - 1
        self._windows: OrderedDict[bytes, _Window] = OrderedDict()
        #: Packets from senders with no entry must be newer than this (see module doc).
        self._evicted_floor_us = -1

    def __len__(self) -> int:
        return len(self._windows)

    def _live(self, sender: bytes, now_us: int) -> _Window | None:
        entry = self._windows.get(sender)
        if entry is not None and now_us - entry.newest_us > self.freshness_us:
            del self._windows[sender]  # everything it could catch is stale now
            return None
        return entry

    def check(
        self, sender: bytes, counter: int, timestamp_us: int, now_us: int
    ) -> ReplayReason | None:
        """Why a packet must be refused, or None if it is new. Changes nothing visible."""
        if abs(timestamp_us - now_us) > self.freshness_us:
            return "stale"
        entry = self._live(sender, now_us)
        if entry is None:
            return "replayed" if timestamp_us <= self._evicted_floor_us else None
        if counter > entry.highest:
            return None
        age = entry.highest - counter
        if age >= self.window or entry.seen >> age & 1:
            return "replayed"
        return None

    def continues(self, sender: bytes, counter: int, now_us: int, reach: int) -> bool:
        """Whether `counter` lies in `sender`'s live window or at most `reach` above it.

        A running sender's counters to us climb by the packets it sent in between (to us
        and to others), so its next packet lands here; a blind forger's guess almost never
        does. `AdmissionGate` verifies such packets without spending any budget.
        """
        entry = self._live(sender, now_us)
        if entry is None:
            return False
        return entry.highest - self.window < counter <= entry.highest + reach

    def commit(self, sender: bytes, counter: int, timestamp_us: int, now_us: int) -> None:
        """Remember an authenticated packet. Call only after `check` returned None."""
        entry = self._live(sender, now_us)
        if entry is None:
            self._windows[sender] = _Window(counter, 1, timestamp_us)
            self._evict(now_us)
            return
        self._windows.move_to_end(sender)
        entry.newest_us = max(entry.newest_us, timestamp_us)
        if counter > entry.highest:
            shift = counter - entry.highest
            entry.seen = ((entry.seen << shift) | 1) & self._mask if shift < self.window else 1
            entry.highest = counter
        else:
            entry.seen |= 1 << (entry.highest - counter)

    def _evict(self, now_us: int) -> None:
        while len(self._windows) > self.max_senders:
            _, oldest = self._windows.popitem(last=False)
            if now_us - oldest.newest_us <= self.freshness_us:
                self._evicted_floor_us = max(self._evicted_floor_us, oldest.newest_us)
