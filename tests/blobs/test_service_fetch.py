"""`BlobService.fetch`: two fetches of one blob at once (a task's owner staging an input
while a member asked it to keep the same input) make one transfer, and neither fails;
the bytes received are counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from populi_p2p.blobs import BlobStore
from populi_p2p.blobs import service as service_module
from populi_p2p.blobs.service import BlobService

from .test_store import _file


async def _noop(_name: str, _value: object) -> None:
    return None


class _Client:
    def bulk(self) -> _Client:
        return self


async def test_a_second_fetch_of_the_same_blob_waits_for_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _file(tmp_path, "in.bin", 1000, seed=1)
    store = BlobStore(tmp_path / "blobs", 0)
    calls: list[list[str]] = []
    release = trio.Event()

    async def fake_fetch(store: BlobStore, source: Any, digest: bytes, holders: list[str],
                         *, name: str, kind: str, progress: Any, **kw: Any) -> Any:  # fmt: skip
        calls.append(list(holders))
        await release.wait()
        progress.bytes_fetched += 1000
        return store.add_file(src, name, kind)

    monkeypatch.setattr(service_module, "fetch_blob", fake_fetch)
    service = BlobService(
        store, me="me", is_member=lambda _n: True, sections=dict, address_of=lambda _n: None,
        peer_client=lambda: _Client(), set_section=_noop,  # type: ignore[arg-type,return-value]
    )  # fmt: skip
    digest = store.add_file(src, "x", "input").digest
    store.remove(digest)  # its digest known, no longer held
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: service.fetch(digest, ["a"], name="in", kind="input"))
        nursery.start_soon(lambda: service.fetch(digest, ["b"], name="in", kind="input"))
        await trio.testing.wait_all_tasks_blocked()
        release.set()
    assert calls == [["a"]] or calls == [["b"]]  # one transfer
    assert store.get(digest).complete and service.stats["fetched_bytes"] == 1000
