"""`LeaseStore`: a real SQLite file, reload after restart and after a kill."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from populi_p2p.leases import TaskPhase, TaskResult
from populi_p2p.leases.store import LeaseStore

from .helpers import spec, table


def test_every_change_is_on_disk_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "leases.sqlite"
    store = LeaseStore(path)
    a = table("a", persist=store.put, forget=store.delete)
    tid, _ = a.submit(spec(1, by="a"), 0.0)
    a.claim(tid, 1, 0, "x", 1.0)
    a.post_result(tid, TaskResult(0, b"ok"), 2.0)
    store.close()
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    store2 = LeaseStore(path)
    entries, bad = store2.load()
    assert bad == 0 and entries == [a.get(tid)]
    b = table("a", persist=store2.put)
    b.load(entries, now=100.0)
    assert b.get(tid).phase is TaskPhase.SUCCEEDED


def test_reload_after_a_kill_9_style_exit(tmp_path: Path) -> None:
    """A child writes through the table and dies with os._exit (no close, no flush of
    Python state): every change the table returned is on disk."""
    path = tmp_path / "leases.sqlite"
    child = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent.parent.parent)!r})
        from tests.leases.helpers import spec, table
        from populi_p2p.leases.store import LeaseStore
        store = LeaseStore({str(path)!r})
        a = table("a", persist=store.put)
        tid, _ = a.submit(spec(7, by="a"), 0.0)
        a.claim(tid, 1, 0, "", 1.0)
        a.mark_running(tid, 2.0)
        print(tid, flush=True)
        os._exit(0)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, check=True, timeout=60
    )
    tid = out.stdout.strip()
    entries, bad = LeaseStore(path).load()
    assert bad == 0 and [e.task_id for e in entries] == [tid]
    assert entries[0].phase is TaskPhase.RUNNING


def test_corrupt_rows_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "leases.sqlite"
    store = LeaseStore(path)
    a = table("a", persist=store.put)
    tid, _ = a.submit(spec(2, by="a"), 0.0)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO lease_entries VALUES ('zz', x'c1c1')")
    conn.execute("INSERT INTO lease_entries VALUES ('yy', 'text')")
    conn.commit()
    entries, bad = store.load()
    assert bad == 2 and [e.task_id for e in entries] == [tid]


def _on_disk(path: Path) -> set[str]:
    """Task ids another connection sees committed (in the WAL or the file)."""
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT task_id FROM lease_entries")}
    finally:
        conn.close()


def test_deferred_writes_wait_for_a_commit_and_share_it(tmp_path: Path) -> None:
    """The node's group commit: writes are buffered until `stage` and `finish` write
    them all in one transaction; nothing shows on disk before."""
    path = tmp_path / "leases.sqlite"
    store = LeaseStore(path, deferred=True)
    a = table("a", persist=store.put, forget=store.delete)
    one, _ = a.submit(spec(1, by="a"), 0.0)
    two, _ = a.submit(spec(2, by="a"), 0.0)
    assert store.written == 2 and _on_disk(path) == set()
    rows, upto = store.take()
    assert len(rows) == 2 and upto == 2 and store.take()[0] == {}
    assert store.stage(rows) is True  # our own entries: fsynced
    assert _on_disk(path) == set()  # staged, not committed
    store.finish()
    assert _on_disk(path) == {one, two}
    store.close()


def test_relaxed_rows_alone_commit_without_an_fsync(tmp_path: Path) -> None:
    """A peer's entry (`relaxed`) commits with synchronous=NORMAL; one strict row in the
    batch makes the whole commit fsynced, and a row written both ways stays strict."""
    path = tmp_path / "leases.sqlite"
    store = LeaseStore(path, deferred=True)
    a = table("a")
    tid, _ = a.submit(spec(3, by="a"), 0.0)
    entry = a.get(tid)
    store.put(entry, relaxed=True)
    assert store.commit(store.take()[0]) is False
    assert _on_disk(path) == {tid}
    store.put(entry, relaxed=True)
    store.put(entry)  # the same row, strict this time
    assert store.commit(store.take()[0]) is True
    assert store.commit({}) is False


def test_close_commits_what_is_still_buffered(tmp_path: Path) -> None:
    path = tmp_path / "leases.sqlite"
    store = LeaseStore(path, deferred=True)
    a = table("a", persist=store.put)
    tid, _ = a.submit(spec(4, by="a"), 0.0)
    store.close()
    assert _on_disk(path) == {tid}
