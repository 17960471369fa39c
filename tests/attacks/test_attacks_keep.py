"""Attacks on the keep and held routes (docs/artifacts.md, "Re-replication"): a member
cannot make another store a blob no task's table entry needs, cannot stretch an
output's retention, cannot run more fetches at once than the cap, and a held query
costs at most `HELD_QUERY_MAX` look-ups."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import trio

from populi_p2p.artifacts.keeper import HELD_PATH, HELD_QUERY_MAX, KEEP_PATH, KEEP_RUNNING_MAX
from populi_p2p.inference.peer_api import PeerRequest
from populi_p2p.leases import TaskOutput, TaskResult
from tests.artifacts.test_keeper import IN, _entry, keep, keeper


async def test_a_member_cannot_have_blobs_kept_that_no_task_needs(tmp_path: Path) -> None:
    entries = {"t": _entry(), "done": _entry(task_id="done", done=True)}
    k, blobs = keeper(tmp_path, entries)
    async with trio.open_nursery() as nursery:
        await nursery.start(k.run)
        for request in (keep("n1", os.urandom(32).hex()), keep("n1", IN, task="done"),
                        keep("n1", IN, task="nope"), keep("n9", IN)):  # fmt: skip
            assert (await k._serve_keep(request)).status in (403, 404)
        assert blobs.fetched == [] and blobs.store.entries() == []
        assert k.stats["keeps_refused_unwanted"] == 3 and k.stats["keeps_refused_not_member"] == 1
        nursery.cancel_scope.cancel()


async def test_a_keep_cannot_stretch_an_outputs_retention(tmp_path: Path) -> None:
    src = tmp_path / "o"
    src.write_bytes(b"output")
    k, blobs = keeper(tmp_path, {})
    entry = blobs.store.add_file(src, "o", "output")
    result = TaskResult(0, outputs=(TaskOutput("out", entry.hex, 6),), holders=("n1", "n2"))
    k._entry_of = {"t": _entry(accepted_result=result, done=True)}.get  # type: ignore[assignment]
    body = {"task": "t", "sha256": entry.hex, "until": time.time() + 10**9}
    request = PeerRequest("n1", "POST", KEEP_PATH, "", json.dumps(body).encode())
    assert (await k._serve_keep(request)).status == 200
    (pin,) = blobs.store.get(entry.digest).pins
    assert int(pin.split(":")[2]) <= time.time() + k.retention + 1, pin
    nan = PeerRequest("n1", "POST", KEEP_PATH, "", b'{"task": "t", "sha256": "%s", "until": NaN}'
                      % entry.hex.encode())  # fmt: skip
    assert (await k._serve_keep(nan)).status == 400 and k.stats["keeps_refused_bad"] == 1


async def test_keeps_past_the_running_cap_are_turned_away(tmp_path: Path) -> None:
    k, blobs = keeper(tmp_path, {})
    never = trio.Event()

    async def slow_fetch(*args: object, **kw: object) -> None:
        await never.wait()

    blobs.fetch = slow_fetch  # type: ignore[method-assign]
    entries = {f"t{i}": _entry(task_id=f"t{i}") for i in range(KEEP_RUNNING_MAX + 1)}
    k._entry_of = entries.get  # type: ignore[assignment]
    async with trio.open_nursery() as nursery:
        await nursery.start(k.run)
        statuses = []
        for tid in entries:
            with trio.move_on_after(0.01):  # the answer waits for the fetch: do not
                statuses.append((await k._serve_keep(keep("n1", IN, task=tid))).status)
        assert statuses == [503] and k.stats["keeps_refused_busy"] == 1
        nursery.cancel_scope.cancel()


async def test_a_held_query_looks_up_at_most_its_bound(tmp_path: Path) -> None:
    k, blobs = keeper(tmp_path, {})
    looked: list[bytes] = []
    real_get = blobs.store.get

    def counting_get(digest: bytes):  # type: ignore[no-untyped-def]
        looked.append(digest)
        return real_get(digest)

    blobs.store.get = counting_get  # type: ignore[method-assign]
    ask = {"sha256": [os.urandom(32).hex() for _ in range(200)]}
    request = PeerRequest("n1", "POST", HELD_PATH, "", json.dumps(ask).encode())
    answer = await k._serve_held(request)
    assert answer.status == 200 and len(looked) == HELD_QUERY_MAX
    huge = PeerRequest("n1", "POST", HELD_PATH, "", b'{"sha256": ["' + b"a" * 10**6)
    assert (await k._serve_held(huge)).status == 400  # read up to 16 KiB, then refused
