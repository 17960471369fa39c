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
from ._spec import TaskSpec
from .grants import EPOCH_MAX, Ended, GrantRecord
from .wire import DecodeError, encode_entry, entry_from_wire

_SCHEMA = "CREATE TABLE IF NOT EXISTS lease_entries (task_id TEXT PRIMARY KEY, body BLOB NOT NULL)"
_GRANTS = "CREATE TABLE IF NOT EXISTS lease_grants (task_id TEXT PRIMARY KEY, body BLOB NOT NULL)"


def encode_grant(rec: GrantRecord) -> bytes:
    """A granter record's durable bytes (everything but `heard_at`)."""
    body = [rec.spec.to_wire(), rec.spec_signature, rec.epoch, rec.owner, int(rec.ended),
            rec.failures]  # fmt: skip
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def decode_grant(task_id: str, body: bytes) -> GrantRecord:
    """The record back; `DecodeError` for a row that is not one."""
    try:
        raw = msgpack.unpackb(body, raw=False)
        spec_raw, sig, epoch, owner, ended, failures = raw
        spec = TaskSpec.from_wire(spec_raw)
        if spec.task_id() != task_id or type(sig) is not bytes or not isinstance(owner, str):
            raise DecodeError("grant row does not match its task")
        if not (type(epoch) is int and 0 <= epoch <= EPOCH_MAX and type(failures) is int):
            raise DecodeError("bad grant row")
        return GrantRecord(task_id, spec, sig, epoch, owner, Ended(ended), failures)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise DecodeError(f"bad grant row: {exc}") from None


class LeaseStore:
    """Entries by task id in a SQLite file. Not thread-safe: one owner, like the table."""

    def __init__(self, path: str | Path) -> None:
        self._conn = sqlite3.connect(str(path), isolation_level=None)  # autocommit
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute(_SCHEMA)
        self._conn.execute(_GRANTS)

    def put_grant(self, rec: GrantRecord) -> None:
        """Write one granter record; returns only once it is durable (a grant is
        answered only after this)."""
        self._conn.execute(
            "INSERT OR REPLACE INTO lease_grants (task_id, body) VALUES (?, ?)",
            (rec.task_id, encode_grant(rec)),
        )

    def delete_grant(self, task_id: str) -> None:
        """Forget a compacted granter record."""
        self._conn.execute("DELETE FROM lease_grants WHERE task_id = ?", (task_id,))

    def load_grants(self) -> tuple[list[GrantRecord], int]:
        """Every granter record and the number of corrupt rows skipped."""
        out, bad = [], 0
        for task_id, body in self._conn.execute("SELECT task_id, body FROM lease_grants"):
            try:
                if not isinstance(body, bytes) or not isinstance(task_id, str):
                    raise DecodeError("row is not a blob")
                out.append(decode_grant(task_id, body))
            except DecodeError:
                bad += 1
        return out, bad

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
