"""`LeaseStore`: the lease table's durability, one SQLite file (WAL, synchronous=FULL).

The only module of the package that does I/O. Wire it as the table's `persist` and
`forget` callables, and the agent's `persist_grant` and `forget_grant`. Rows hold the
entry's canonical wire bytes; `load` decodes them as hostile input (a corrupt row is
skipped and counted) and `LeaseTable.load` re-verifies signatures.

Two modes:

* **immediate** (the default): each write is committed (and fsynced, by
  synchronous=FULL) before it returns;
* **deferred** (``deferred=True``, the node's): a write only records the row's bytes
  (encoded at once: the record may change after); `take` hands over every row written
  since the last `take`, and `stage` and `finish` write them in one transaction, one
  fsync (`finish`, in a worker thread). The caller (the lease driver's group commit)
  holds back everything a write leads to (an answer, a gossip, a start) until a commit
  that covers it returned, so "durable before it answers" holds as in the immediate
  mode, while a burst costs one fsync per batch instead of one per record, off the
  event loop.

  A **relaxed** row (``put(entry, relaxed=True)``: a table entry received from another
  node, by gossip or push-pull) needs no fsync of its own: a commit of relaxed rows only
  runs with ``synchronous=NORMAL``, so it is in the WAL (it survives a kill -9 of the
  daemon, not a power loss) and reaches the disk with the next fsynced commit or
  checkpoint. Other nodes hold it, and anti-entropy brings it back. Granter records and
  this node's own table changes are always fsynced before what follows them leaves.
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


def _row(conn: sqlite3.Connection, table: str, task_id: str, body: bytes | None) -> None:
    """Write or (None) delete one row of `table` (one of ours, never input)."""
    if body is None:
        conn.execute(f"DELETE FROM {table} WHERE task_id = ?", (task_id,))
    else:
        conn.execute(
            f"INSERT OR REPLACE INTO {table} (task_id, body) VALUES (?, ?)", (task_id, body)
        )


#: Deferred writes: (table, task id) -> (the row's bytes or None to delete it, relaxed).
Rows = dict[tuple[str, str], tuple[bytes | None, bool]]


class LeaseStore:
    """Entries by task id in a SQLite file. One owner, like the table; in the deferred
    mode only `commit` runs in another thread, and never two at once."""

    def __init__(self, path: str | Path, *, deferred: bool = False) -> None:
        self._conn = sqlite3.connect(
            str(path), isolation_level=None, check_same_thread=not deferred
        )  # autocommit
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute(_SCHEMA)
        self._conn.execute(_GRANTS)
        self.deferred = deferred
        self._rows: Rows = {}
        #: Writes asked for, and writes a `commit` made durable (deferred mode).
        self.written = self.committed = 0

    def _write(self, table: str, task_id: str, body: bytes | None, relaxed: bool = False) -> None:
        if self.deferred:
            key = (table, task_id)
            # A row rewritten keeps the stricter of its two writes (one fsync covers both).
            relaxed = relaxed and self._rows.get(key, (None, True))[1]
            self._rows[key] = (body, relaxed)
            self.written += 1
        else:
            _row(self._conn, table, task_id, body)

    def take(self) -> tuple[Rows, int]:
        """Deferred mode: the rows written since the last `take`, and `written` then."""
        rows, self._rows = self._rows, {}
        return rows, self.written

    def stage(self, rows: Rows) -> bool:
        """Open a transaction holding `rows` (no I/O to wait for yet) and return whether
        its `finish` fsyncs: unless every row is relaxed. The caller runs `finish` next,
        in a worker thread when it fsyncs, and touches the store in between only to
        buffer writes (`put`, `put_grant`)."""
        conn = self._conn
        fsync = not all(relaxed for _body, relaxed in rows.values())
        conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for (table, task_id), (body, _relaxed) in rows.items():
                _row(conn, table, task_id, body)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return fsync

    def finish(self) -> None:
        """Commit the staged transaction (the fsync, if any, happens here)."""
        self._conn.execute("COMMIT")

    def commit(self, rows: Rows) -> bool:
        """`stage` and `finish` in one go; whether it fsynced (False: nothing to write)."""
        if not rows:
            return False
        fsync = self.stage(rows)
        self.finish()
        return fsync

    def put_grant(self, rec: GrantRecord) -> None:
        """Write one granter record; durable when this returns (immediate mode) or once
        a `commit` covers it (deferred): a grant is answered only after that."""
        self._write("lease_grants", rec.task_id, encode_grant(rec))

    def delete_grant(self, task_id: str) -> None:
        """Forget a compacted granter record."""
        self._write("lease_grants", task_id, None)

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

    def put(self, entry: TaskEntry, *, relaxed: bool = False) -> None:
        """Write one entry; durable when this returns (immediate mode) or once a
        `commit` covers it (deferred; a `relaxed` one: see the module doc)."""
        self._write("lease_entries", entry.task_id, encode_entry(entry), relaxed)

    def delete(self, task_id: str) -> None:
        """Forget a compacted entry."""
        self._write("lease_entries", task_id, None)

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
        """Commit what is still deferred (nothing was sent on it yet), then close."""
        self.commit(self.take()[0])
        self._conn.close()
