"""Which chunk to fetch from which holder: a sans-IO plan (no sockets, no clock).

The fetcher (`fetcher.py`) asks `assign(now)` for work, reports each chunk's outcome
(`succeeded`, `failed`) and sleeps until `next_deadline()`. The rules:

- Chunks go out lowest index first, each to the eligible holder with the fewest chunks
  in flight (ties: the order holders were given), at most `per_holder` per holder and
  `total` in all: several holders are used at once, none is asked for everything.
- A holder that sends a **corrupt** chunk (its sha256 is not the manifest's) or **lies**
  about holding the blob (answers "not here" after advertising it) is skipped for the
  rest of the fetch and counted; its chunk goes back to the queue for another holder.
  A chunk found corrupt only after it was counted done (`refuted`: the fetcher checks
  a holder's later chunks by the whole hash) is handled the same way.
- A holder that is **unreachable** or **busy** backs off (`backoff_min` doubling to
  `backoff_max`) and is skipped after `max_failures` failures in a row.
- A holder that **lacks** a chunk (it is fetching the blob itself and serves only the
  chunks it has verified) is not asked for that chunk again for `lack_retry` seconds;
  it goes on serving the others. Assignment looks at the `SCAN` lowest chunks left for
  one that some holder can serve.
- The fetch is **stuck** (`stuck()` says why) when chunks remain and no holder is left
  that is not skipped.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

__all__ = ["Assignment", "ChunkFailure", "FetchPlan", "HolderStats"]

#: Default bounds (the fetcher's defaults).
PER_HOLDER: Final = 4
TOTAL: Final = 12
#: How many of the lowest chunks left one assignment looks through.
SCAN: Final = 64


class ChunkFailure(enum.Enum):
    """Why a chunk did not arrive from a holder."""

    CORRUPT = "corrupt"  # bytes whose sha256 is not the manifest's: skip the holder
    MISSING = "missing"  # the holder says it does not hold the blob: it lied, skip it
    UNREACHABLE = "unreachable"  # connection or protocol error: back off, then skip
    BUSY = "busy"  # the holder is at its transfer cap: back off
    LACKS = "lacks"  # a holder still fetching it lacks this chunk: ask again later


@attrs.frozen
class Assignment:
    chunk: int
    holder: str


@attrs.define
class HolderStats:
    """One holder's part in a fetch."""

    served: int = 0
    corrupt: int = 0
    missing: int = 0
    unreachable: int = 0
    busy: int = 0
    lacks: int = 0
    skipped: str | None = None  # why it is no longer asked
    inflight: int = 0
    failures_in_row: int = 0
    retry_at: float = 0.0


class FetchPlan:
    """The plan of one blob's fetch.

    Args:
        chunks: how many chunks the blob has.
        done: the chunks already held (a resumption).
        holders: who may serve it, in order of preference.
        per_holder: most chunks in flight from one holder.
        total: most chunks in flight in all.
    """

    def __init__(
        self,
        chunks: int,
        done: Iterable[int],
        holders: Sequence[str],
        *,
        per_holder: int = PER_HOLDER,
        total: int = TOTAL,
        backoff_min: float = 0.2,
        backoff_max: float = 5.0,
        max_failures: int = 5,
        lack_retry: float = 1.0,
    ) -> None:
        if chunks < 1 or per_holder < 1 or total < 1:
            raise ValueError("chunks, per_holder and total are at least 1")
        self.chunks = chunks
        self._done = set(done)
        self._pending = sorted(set(range(chunks)) - self._done, reverse=True)  # pop() = lowest
        self._inflight: dict[int, str] = {}
        self._served_by: dict[int, str] = {}  # chunk -> the holder it came from
        self.holders: dict[str, HolderStats] = {h: HolderStats() for h in holders}
        self._per_holder = per_holder
        self._total = total
        self._backoff = (backoff_min, backoff_max)
        self._max_failures = max_failures
        self._lack_retry = lack_retry
        self._lacking: dict[tuple[str, int], float] = {}  # (holder, chunk) -> ask again at

    ####################################################################################
    # Queries

    @property
    def finished(self) -> bool:
        return len(self._done) == self.chunks

    @property
    def done_count(self) -> int:
        return len(self._done)

    def inflight(self) -> dict[int, str]:
        return dict(self._inflight)

    def stuck(self) -> str | None:
        """Why the fetch cannot finish (no usable holder left), or None."""
        if self.finished or any(s.skipped is None for s in self.holders.values()):
            return None
        if not self.holders:
            return "no member holds this blob"
        why = sorted({f"{h[:12]}: {s.skipped}" for h, s in self.holders.items()})
        return "every holder was skipped (" + "; ".join(why) + ")"

    def next_deadline(self, now: float) -> float | None:
        """When a backed-off holder may be asked again, after `now` (None: none waits)."""
        times = [
            s.retry_at
            for s in self.holders.values()
            if s.skipped is None and s.retry_at > now and s.inflight < self._per_holder
        ]
        for key, at in list(self._lacking.items()):
            if at > now:
                times.append(at)
            else:
                del self._lacking[key]
        return min(times) if times and self._pending else None

    ####################################################################################
    # Commands

    def add_holder(self, holder: str) -> None:
        self.holders.setdefault(holder, HolderStats())

    def assign(self, now: float) -> list[Assignment]:
        """The chunks to request now, each from one holder (within the bounds)."""
        out: list[Assignment] = []
        while self._pending and len(self._inflight) < self._total:
            found = self._next(now)
            if found is None:
                break
            at, holder = found
            chunk = self._pending.pop(at)
            self._inflight[chunk] = holder
            self.holders[holder].inflight += 1
            out.append(Assignment(chunk, holder))
        return out

    def _next(self, now: float) -> tuple[int, str] | None:
        """(index in `_pending`, holder) of the lowest chunk some holder can serve."""
        last = len(self._pending) - 1
        for at in range(last, max(-1, last - SCAN), -1):
            holder = self._pick(now, self._pending[at])
            if holder is not None:
                return at, holder
        return None

    def _pick(self, now: float, chunk: int) -> str | None:
        best: str | None = None
        best_load = self._per_holder
        for holder, stats in self.holders.items():
            if stats.skipped is not None or stats.retry_at > now:
                continue
            if stats.inflight < best_load and self._lacking.get((holder, chunk), 0.0) <= now:
                best, best_load = holder, stats.inflight
        return best

    def _settle(self, chunk: int, holder: str) -> HolderStats:
        if self._inflight.get(chunk) != holder:
            raise AssertionError(f"chunk {chunk} is not in flight from {holder}")
        del self._inflight[chunk]
        stats = self.holders[holder]
        stats.inflight -= 1
        return stats

    def succeeded(self, chunk: int, holder: str) -> None:
        """The chunk arrived from `holder` and matched its hash."""
        stats = self._settle(chunk, holder)
        stats.served += 1
        stats.failures_in_row = 0
        stats.retry_at = 0.0
        self._done.add(chunk)
        self._served_by[chunk] = holder
        for other in self.holders:
            self._lacking.pop((other, chunk), None)

    def failed(self, chunk: int, holder: str, why: ChunkFailure, now: float) -> None:
        """The chunk did not arrive from `holder`; it goes back to the queue."""
        stats = self._settle(chunk, holder)
        self._pending.append(chunk)
        self._pending.sort(reverse=True)
        if why is ChunkFailure.LACKS:
            stats.lacks += 1
            self._lacking[(holder, chunk)] = now + self._lack_retry
        elif why is ChunkFailure.CORRUPT:
            stats.corrupt += 1
            stats.skipped = stats.skipped or "sent a corrupt chunk"
        elif why is ChunkFailure.MISSING:
            stats.missing += 1
            stats.skipped = stats.skipped or "does not hold the blob it advertised"
        else:
            if why is ChunkFailure.BUSY:
                stats.busy += 1
            else:
                stats.unreachable += 1
                stats.failures_in_row += 1
            low, high = self._backoff
            stats.retry_at = now + min(high, low * 2 ** max(0, stats.failures_in_row - 1))
            if stats.failures_in_row >= self._max_failures and stats.skipped is None:
                stats.skipped = f"unreachable {stats.failures_in_row} times in a row"

    def refuted(self, chunk: int) -> None:
        """A chunk counted done turned out corrupt: its holder is skipped and counted,
        and the chunk goes back to the queue."""
        if chunk not in self._done:
            raise AssertionError(f"chunk {chunk} is not done")
        self._done.discard(chunk)
        self._pending.append(chunk)
        self._pending.sort(reverse=True)
        holder = self._served_by.pop(chunk, None)
        if holder is None:  # held before this fetch (it was checked then): nobody to blame
            return
        stats = self.holders[holder]
        stats.served -= 1
        stats.corrupt += 1
        stats.skipped = stats.skipped or "sent a corrupt chunk"

    def skip(self, holder: str, why: str) -> None:
        """Stop asking `holder` (e.g. its manifest disagreed with the others)."""
        stats = self.holders.get(holder)
        if stats is not None and stats.skipped is None:
            stats.skipped = why
