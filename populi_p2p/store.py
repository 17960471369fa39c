"""What a node remembers across restarts: known members and its own incarnation (SQLite).

Why: a node that restarts (a reboot, an upgrade) should find its mesh again without the
operator repeating ``--bootstrap`` flags, and must come back with a higher incarnation
than the one the others last saw, or its "alive" would lose to their "dead" rumor. Both
facts live in ``members.sqlite3`` in the state directory.

Blocking I/O: SQLite calls block, and the daemon is one Trio thread. The writes here are
small (a few rows) and rare (a membership change, flushed at most every few seconds in
one transaction by the node), and the file runs in WAL mode with ``synchronous=NORMAL``,
so a write costs well under a millisecond and never waits on an fsync of the main
database. They are therefore made synchronously from the Trio thread rather than through
``trio.to_thread`` (which would need a connection usable from other threads and buy
nothing at this size). Reads happen once, at start-up, before the node joins.
A corrupt or unreadable file is not fatal: the node logs it and starts with an empty
memory (it can still join through ``--bootstrap`` or mDNS).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import attrs

from swim import INCARNATION_MAX

__all__ = ["KnownMember", "MemberStore", "StoreError"]

#: Rows kept: members not seen for longer than this are forgotten (seconds, 30 days).
FORGET_AFTER: Final = 30 * 24 * 3600.0
#: Bound on remembered members, so a hostile mesh cannot grow the file without limit.
MAX_KNOWN_MEMBERS: Final = 4096
#: Largest incarnation the file can hold: SQLite's INTEGER is a signed 64-bit value.
#: The wire codec bounds incarnations well below this; the store still refuses anything
#: larger (with a `StoreError`, never an ``OverflowError``) so a bug elsewhere cannot
#: turn into a crash here.
MAX_STORED_INCARNATION: Final = 2**63 - 1

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS members (
    node_id   TEXT PRIMARY KEY,
    name      TEXT NOT NULL,
    host      TEXT NOT NULL,
    port      INTEGER NOT NULL,
    last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS self (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


class StoreError(Exception):
    """The state file cannot be opened or written; the message is one line."""


@attrs.frozen
class KnownMember:
    """A member remembered from a previous run: where it was last reachable."""

    node_id: str
    name: str
    host: str
    port: int
    #: Realtime (Unix seconds) when this node last saw it alive.
    last_seen: float


class MemberStore:
    """The SQLite file of known members and this node's last incarnation.

    Not thread-safe: use it from the one thread that opened it (the Trio thread).
    """

    def __init__(self, path: Path) -> None:
        """Open (creating if needed) the store at `path`.

        Raises:
            StoreError: the file cannot be opened or is not a populi store.
        """
        self.path = path
        # SQLite creates the -wal and -shm files with the mode of the database file, so
        # the database must be 0600 *before* the first connection opens the WAL.
        try:
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as exc:
            raise StoreError(f"cannot open the member store {path}: {exc.strerror}") from None
        _restrict(path)
        try:
            self._db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the member store {path}: {exc}") from None
        # Files left by an older version (created 0644) are tightened too.
        for suffix in ("-wal", "-shm"):
            _restrict(path.with_name(path.name + suffix))

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._db.close()

    def __enter__(self) -> MemberStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def known_members(self, now: float | None = None) -> list[KnownMember]:
        """Members seen alive within `FORGET_AFTER`, most recently seen first."""
        now = time.time() if now is None else now
        rows = self._db.execute(
            "SELECT node_id, name, host, port, last_seen FROM members"
            " WHERE last_seen >= ? ORDER BY last_seen DESC, node_id LIMIT ?",
            (now - FORGET_AFTER, MAX_KNOWN_MEMBERS),
        ).fetchall()
        return [KnownMember(*row) for row in rows]

    def remember(self, members: Iterable[KnownMember]) -> None:
        """Insert or refresh `members` in one transaction, then trim old and excess rows.

        Raises:
            StoreError: the write failed (disk full, file removed).
        """
        rows = [(m.node_id, m.name, m.host, m.port, m.last_seen) for m in members]
        if not rows:
            return
        try:
            with self._transaction():
                self._db.executemany(
                    "INSERT INTO members (node_id, name, host, port, last_seen)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT(node_id) DO UPDATE SET"
                    " name=excluded.name, host=excluded.host, port=excluded.port,"
                    " last_seen=MAX(last_seen, excluded.last_seen)",
                    rows,
                )
                self._db.execute(
                    "DELETE FROM members WHERE node_id NOT IN (SELECT node_id FROM members"
                    " ORDER BY last_seen DESC LIMIT ?)",
                    (MAX_KNOWN_MEMBERS,),
                )
        except OverflowError:
            raise StoreError(f"a member row does not fit the store {self.path}") from None
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write the member store {self.path}: {exc}") from None

    def forget(self, node_ids: Iterable[str]) -> None:
        """Remove members that left gracefully (they should not be retried at start-up)."""
        ids = [(n,) for n in node_ids]
        if not ids:
            return
        try:
            with self._transaction():
                self._db.executemany("DELETE FROM members WHERE node_id = ?", ids)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write the member store {self.path}: {exc}") from None

    def last_incarnation(self) -> int:
        """The highest incarnation this node has used (0 on first start)."""
        try:
            row = self._db.execute("SELECT value FROM self WHERE key = 'incarnation'").fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the member store {self.path}: {exc}") from None
        if row is None:
            return 0
        value = row[0]
        if not isinstance(value, int) or not 0 <= value <= MAX_STORED_INCARNATION:
            raise StoreError(f"the member store {self.path} holds a bad incarnation {value!r}")
        return value

    def save_incarnation(self, incarnation: int) -> None:
        """Record that this node has used `incarnation` (only ever raises the stored value).

        Raises:
            StoreError: the write failed, or `incarnation` is not an int in
                ``[0, MAX_STORED_INCARNATION]`` (nothing else, whatever it is handed).
        """
        if (
            not isinstance(incarnation, int)
            or isinstance(incarnation, bool)
            or not 0 <= incarnation <= MAX_STORED_INCARNATION
        ):
            raise StoreError(
                f"incarnation {incarnation!r} is outside the storable range"
                f" 0..{MAX_STORED_INCARNATION}: not saved"
            )
        try:
            self._db.execute(
                "INSERT INTO self (key, value) VALUES ('incarnation', ?) ON CONFLICT(key)"
                " DO UPDATE SET value = MAX(value, excluded.value)",
                (incarnation,),
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write the member store {self.path}: {exc}") from None

    def reset_incarnation(self, incarnation: int) -> None:
        """Set the stored incarnation exactly: a new session after swim's limit (only then).

        Raises:
            StoreError: the write failed, or `incarnation` is out of range.
        """
        if isinstance(incarnation, bool) or not 0 <= incarnation <= INCARNATION_MAX:
            raise StoreError(f"incarnation {incarnation!r} is outside 0..{INCARNATION_MAX}")
        try:
            self._db.execute(
                "INSERT INTO self (key, value) VALUES ('incarnation', ?) ON CONFLICT(key)"
                " DO UPDATE SET value = excluded.value",
                (incarnation,),
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write the member store {self.path}: {exc}") from None

    def start_incarnation(self) -> int:
        """The incarnation to start this run with: one above any used before; persisted.

        Persisting before joining means a crash right after start still never reuses it.
        """
        incarnation = self.last_incarnation() + 1
        if incarnation > INCARNATION_MAX:
            # Beyond what the wire carries (swim.INCARNATION_MAX): start a new session at 0,
            # as the core does when accused at the limit (docs/protocol.md).
            self.reset_incarnation(0)
            return 0
        self.save_incarnation(incarnation)
        return incarnation

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


def _restrict(path: Path) -> None:
    """Make `path` owner-only (0600) if it exists; the docs promise this for every file."""
    with contextlib.suppress(OSError):
        path.chmod(0o600)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
