"""Members that died or left, kept for people to see: "last seen", for a day.

The swim core forgets a dead or left member after its `dead_retention` (30 s at `lan`):
the protocol needs the tombstone only that long (a late rumor of the old incarnation is
refuted by it; a rejoin brings a higher one). An operator needs more: a machine that went
away at night should still be listed in the morning, as Serf keeps failed and left
members for 24 h and Tailscale shows offline peers with "last seen". So the node keeps
its own roster of departed members, a snapshot of each one's row when it went, apart
from the core: the protocol's timing is unchanged, and what is shown lives here.

Bounded twice: a row expires after `retention` seconds, and at most `capacity` rows are
kept (the oldest departure goes first).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

__all__ = ["DEPARTED_MAX", "DepartedMembers"]

#: Departed members kept at most (as many as the record book holds members).
DEPARTED_MAX: Final = 4096


class DepartedMembers:
    """Snapshots of members' rows at their departure, by node id, oldest first.

    Args:
        retention: seconds a departed member stays listed.
        capacity: rows kept at most.
    """

    def __init__(self, retention: float, capacity: int = DEPARTED_MAX) -> None:
        if retention < 0 or capacity < 1:
            raise ValueError(f"need retention >= 0 and capacity >= 1, got {retention}, {capacity}")
        self.retention = retention
        self._capacity = capacity
        #: node id -> (realtime of the departure, the row then); insertion = departure order.
        self._rows: dict[str, tuple[float, dict[str, Any]]] = {}

    def keep(self, row: dict[str, Any], *, departed_at: float) -> None:
        """`row` (a member row, its state dead or left, `last_seen` set) went now."""
        node_id = str(row["node_id"])
        self._rows.pop(node_id, None)
        self._rows[node_id] = (departed_at, dict(row))
        while len(self._rows) > self._capacity:
            self._rows.pop(next(iter(self._rows)))

    def discard(self, node_id: str) -> None:
        """`node_id` is back (joined again, or alive after all)."""
        self._rows.pop(node_id, None)

    def last_seen(self, node_id: str) -> float | None:
        entry = self._rows.get(node_id)
        return None if entry is None else entry[1].get("last_seen")

    def rows(self, now: float, *, except_ids: Iterable[str] = ()) -> list[dict[str, Any]]:
        """The rows still within `retention` at realtime `now`, but for `except_ids`
        (the members the core still holds: their live row is shown instead). Each row's
        `state_since` is the seconds since it departed."""
        self._expire(now)
        skip = set(except_ids)
        return [
            row | {"state_since": round(now - at, 3)}
            for node_id, (at, row) in self._rows.items()
            if node_id not in skip
        ]

    def __len__(self) -> int:
        return len(self._rows)

    def _expire(self, now: float) -> None:
        for node_id, (at, _) in list(self._rows.items()):
            if now - at <= self.retention:
                break  # oldest first: the rest are younger
            del self._rows[node_id]
