"""`BlobService` and `model add`'s worker thread: the thread says "the store changed"
while it holds the store's lock, so it must never wait for the trio loop, which may be
waiting for that lock (a deadlock: `model add` hung for 120 s in a loaded full run)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import trio

from populi_p2p.blobs.service import BlobService
from populi_p2p.blobs.store import BlobStore


async def _noop(_name: str, _section: Any) -> None:
    return None


async def test_a_change_said_from_a_worker_thread_does_not_wait_for_the_loop(
    tmp_path: Path,
) -> None:
    store = BlobStore(tmp_path / "blobs", 0)
    BlobService(
        store, me="me", is_member=lambda _n: True, sections=dict,
        address_of=lambda _n: None, peer_client=lambda: None, set_section=_noop,
    )  # fmt: skip
    started, go, said = threading.Event(), threading.Event(), threading.Event()

    def worker() -> None:
        started.set()
        go.wait(10.0)
        with store._lock:  # as `add_file` holds it when it saves the catalogue
            store.on_change()  # `BlobService._store_changed`
        said.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, worker)
        while not started.is_set():  # the worker thread starts, then waits for `go`
            await trio.sleep(0.01)
        # The loop is busy (here: blocked) while the thread says it; a thread that
        # waited for the loop would not be done before the loop is free again.
        go.set()
        finished = said.wait(5.0)
    assert finished, "the worker thread waited for the trio loop while holding the lock"
