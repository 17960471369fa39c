"""`LeaseStore`: the lease table's durability, one SQLite file (WAL, synchronous=FULL).

The only module of the package that does I/O. Wire it as the table's `persist` and
`forget` callables: each change is committed (and fsynced, by synchronous=FULL) before
the table returns the delta, so nothing is gossiped or acknowledged that a kill -9 could
lose. Rows hold the entry's canonical wire bytes; `load` decodes them as hostile input
(a corrupt row is skipped and counted) and `LeaseTable.load` re-verifies signatures.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgpack

from ._entry import TaskEntry
from .wire import DecodeError, encode_entry, entry_from_wire

_SCHEMA = "CREATE TABLE IF NOT EXISTS lease_entries (task_id TEXT PRIMARY KEY, body BLOB NOT NULL)"


class LeaseStore:
    """Entries by task id in a SQLite file. Not thread-safe: one owner, like the table."""

    def __init__(self, path: str | Path) -> None:
        self._conn = sqlite3.connect(str(path), isolation_level=None)  # autocommit
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute(_SCHEMA)

    def put(self, entry: TaskEntry) -> None:
        """Write one entry; returns only once SQLite has committed it durably."""
        self._conn.execute(
            "INSERT OR REPLACE INTO lease_entries (task_id, body) VALUES (?, ?)",
            (entry.task_id, encode_entry(entry)),
        )

    def delete(self, task_id: str) -> None:
        """Forget a compacted entry."""
        self._conn.execute("DELETE FROM lease_entries WHERE task_id = ?", (task_id,))

    def load(self) -> tuple[list[TaskEntry], int]:
        """Every stored entry, in task-id order, and the number of corrupt rows skipped."""
        entries, bad = [], 0
        rows = self._conn.execute("SELECT task_id, body FROM lease_entries ORDER BY task_id")
        for task_id, body in rows:
            try:
                if not isinstance(body, bytes):
                    raise DecodeError("body is not a blob")
                entry = entry_from_wire(msgpack.unpackb(body, raw=False))
                if entry.task_id != task_id:
                    raise DecodeError("row key does not match entry")
            except (DecodeError, ValueError, msgpack.UnpackException):
                bad += 1
                continue
            entries.append(entry)
        return entries, bad

    def close(self) -> None:
        self._conn.close()
