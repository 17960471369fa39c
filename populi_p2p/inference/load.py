"""The accepting node's count of the requests outstanding at each serving node.

Sans-IO (the caller passes ``now``): the route needs a node's load at the moment it
chooses, and the serving node's record is re-signed at most every 10 s, so a burst of
requests would all see the same stale load and land on one node. The count here is
live:

- *ours*: this node's own relays in flight to each node, per model (`begin`/`end`
  around every attempt), exact and immediate;
- *theirs*: what other accepting nodes have there. Each answer from a serving node
  carries its queue (``x-populi-queue``: its engines' requests in flight for the model,
  this one included); minus ours at that moment, that is everyone else's (`reported`).
  A report older than `REPORT_TTL` is forgotten, and then the record's ``inflight``
  (less ours) stands in.

It also keeps the gate's evidence of failure: a node whose last relay from this node
failed is `failing` for `FAILING_SECONDS` (then it is tried again, as a circuit
breaker half-opens), so a node that fails fast, and so always looks idle, does not
draw every request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = ["FAILING_SECONDS", "REPORT_TTL", "LoadBook"]

#: Seconds a serving node's reported queue is believed.
REPORT_TTL: Final = 10.0
#: Seconds a node whose last relay failed ranks after the healthy ones.
FAILING_SECONDS: Final = 5.0
#: Nodes whose reports and failures are kept (the oldest report goes first).
MAX_NODES: Final = 4096


class LoadBook:
    def __init__(self) -> None:
        self._ours: dict[tuple[str, str], int] = {}
        self._theirs: dict[tuple[str, str], tuple[int, float]] = {}
        self._failed_at: dict[str, float] = {}

    def begin(self, node: str, model: str) -> None:
        """An attempt at `node` starts (before its request is sent)."""
        key = (node, model)
        self._ours[key] = self._ours.get(key, 0) + 1

    def end(self, node: str, model: str) -> None:
        key = (node, model)
        left = self._ours.get(key, 0) - 1
        if left > 0:
            self._ours[key] = left
        else:
            self._ours.pop(key, None)

    def ours(self, node: str, model: str) -> int:
        return self._ours.get((node, model), 0)

    def reported(self, node: str, model: str, queue: int, now: float) -> None:
        """`node` answered with `queue` requests in flight for `model` (ours included)."""
        key = (node, model)
        self._theirs.pop(key, None)  # re-inserted last: the dict stays oldest first
        self._theirs[key] = (max(0, queue - self.ours(node, model)), now)
        if len(self._theirs) > MAX_NODES:
            del self._theirs[next(iter(self._theirs))]

    def outcome(self, node: str, success: bool, now: float) -> None:
        if success:
            self._failed_at.pop(node, None)
            return
        self._failed_at.pop(node, None)
        self._failed_at[node] = now
        if len(self._failed_at) > MAX_NODES:
            del self._failed_at[next(iter(self._failed_at))]

    def failing(self, now: float) -> frozenset[str]:
        """Nodes whose last relay from here failed less than `FAILING_SECONDS` ago."""
        return frozenset(n for n, at in self._failed_at.items() if now - at < FAILING_SECONDS)

    def outstanding(
        self, model: str, nodes: Iterable[tuple[str, Mapping[str, Any]]], now: float
    ) -> dict[str, int]:
        """Requests outstanding per node for `model`: ours plus theirs. `nodes` gives
        each node's record entry for the model (its ``inflight``, for theirs when no
        report is fresh)."""
        out: dict[str, int] = {}
        for node, facts in nodes:
            ours = self._ours.get((node, model), 0)
            report = self._theirs.get((node, model))
            if report is not None and now - report[1] <= REPORT_TTL:
                theirs = report[0]
            else:
                inflight = facts.get("inflight", 0)
                recorded = inflight if isinstance(inflight, int) and inflight > 0 else 0
                theirs = max(0, recorded - ours)
            out[node] = ours + theirs
        return out
