"""`Checkpointer` and the holders' side of checkpoints: a snapshot is stored, held and
recorded (once per change), the previous one unpinned; the latest record of an earlier
epoch is restored and recorded under the new one; a holder keeps the last snapshots
of a task pinned and the sweep releases them once the task has finished."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import trio

from populi_p2p.artifacts.checkpoints import (
    CHECKPOINT_DIR,
    CHECKPOINT_KIND,
    CHECKPOINT_PIN,
    REQUEST_FILE,
    Checkpointer,
    CheckpointRun,
)
from populi_p2p.artifacts.service import HOLD_PATH
from populi_p2p.inference.peer_api import PeerRequest
from populi_p2p.leases import Checkpoint, Requirements, TaskKind, TaskOutput, TaskSpec
from populi_p2p.leases.grants import GrantRecord

from .test_service import _Blobs, service

SPEC = TaskSpec(TaskKind.BATCH, Requirements(), ["x"], submitted_by="n0", checkpoint_every=0.0)
TID = "t" * 32


def _checkpointer(tmp: Path, latest: Checkpoint | None = None):
    blobs = _Blobs(tmp / "blobs")
    recorded: list[Checkpoint] = []
    held: list[list[TaskOutput]] = []

    async def record(tid: str, ck: Checkpoint) -> None:
        recorded.append(ck)

    async def replicate(tid: str, epoch: int, spec: TaskSpec, outs: list[TaskOutput]) -> list[str]:
        held.append(outs)
        return ["me", "h1", "h2"]

    ckp = Checkpointer(me="me", blobs=lambda: blobs, latest=lambda t: latest,  # type: ignore[arg-type,return-value]
                       record=record, replicate=replicate)  # fmt: skip
    return ckp, blobs, recorded, held


def _pins(blobs: _Blobs) -> dict[str, list[str]]:
    return {e.hex: list(e.pins) for e in blobs.store.entries()}


async def test_a_snapshot_is_stored_held_and_recorded_once_per_change(tmp_path: Path) -> None:
    ckp, blobs, recorded, held = _checkpointer(tmp_path)
    work = tmp_path / "work"
    (work / CHECKPOINT_DIR).mkdir(parents=True)
    (work / CHECKPOINT_DIR / "step").write_text("1")
    run = CheckpointRun(TID, 3, SPEC, work)
    assert await ckp.snapshot(run)
    assert await ckp.snapshot(run)  # unchanged: nothing sent again
    (work / CHECKPOINT_DIR / "step").write_text("2")
    assert await ckp.snapshot(run)
    assert [(r.epoch, r.seq, r.taken_in, r.holders) for r in recorded] == [
        (3, 1, 3, ("me", "h1", "h2")), (3, 2, 3, ("me", "h1", "h2"))]  # fmt: skip
    assert len(held) == 2 and held[0][0].path == CHECKPOINT_DIR and held[0][0].unpack
    pins = _pins(blobs)
    assert pins[recorded[1].sha256] == [CHECKPOINT_PIN + TID]
    assert pins[recorded[0].sha256] == []  # superseded: released
    assert ckp.stats["checkpoints_taken"] == 2
    run.deadline = 0.0  # the lease ran out on our clock: no snapshot
    (work / CHECKPOINT_DIR / "step").write_text("3")
    assert not await ckp.snapshot(run) and len(recorded) == 2


async def test_the_latest_snapshot_is_restored_and_recorded_under_the_new_epoch(
    tmp_path: Path,
) -> None:
    first, blobs, recorded, _ = _checkpointer(tmp_path)
    work = tmp_path / "w1"
    (work / CHECKPOINT_DIR).mkdir(parents=True)
    (work / CHECKPOINT_DIR / "step").write_text("47")
    (work / CHECKPOINT_DIR / REQUEST_FILE).write_text("")
    assert await first.snapshot(CheckpointRun(TID, 1, SPEC, work))
    latest = recorded[-1]
    second, _, again, _ = _checkpointer(tmp_path, latest)
    second._blobs = lambda: blobs  # the same store: the blob is held here
    run = CheckpointRun(TID, 2, SPEC, tmp_path / "w2")
    await second.restore(run, tmp_path / "staging" / "ck")
    assert (tmp_path / "staging" / "ck" / "step").read_text() == "47"
    assert not (tmp_path / "staging" / "ck" / REQUEST_FILE).exists()
    assert run.restored == latest and second.stats["checkpoints_restored"] == 1
    (start,) = again
    assert (start.epoch, start.seq, start.sha256, start.taken_in) == (2, 0, latest.sha256, 1)
    assert start.holders[0] == "me"
    nothing, _, fresh, _ = _checkpointer(tmp_path / "other")
    await nothing.restore(CheckpointRun(TID, 1, SPEC, work), tmp_path / "s2" / "ck")
    assert fresh == [Checkpoint(1, 0, "me")] and (tmp_path / "s2" / "ck").is_dir()


def _hold(sha: str) -> PeerRequest:
    body = {"task": "t", "epoch": 1, "outputs": [[CHECKPOINT_DIR, sha, 5, True]],
            "checkpoint": True}  # fmt: skip
    return PeerRequest("n1", "POST", HOLD_PATH, "", json.dumps(body).encode())


async def test_a_holder_keeps_the_last_snapshots_and_releases_them_at_the_end(
    tmp_path: Path,
) -> None:
    spec = attrs.evolve(SPEC, replicas=("n1", "n2", "n3"))
    grants = {"t": GrantRecord("t", spec, b"", epoch=1, owner="n1")}
    svc, blobs = service(tmp_path, grants)
    shas = []
    for i in range(3):
        source = tmp_path / f"snap{i}"
        source.write_text(f"snapshot {i}")
        shas.append(blobs.store.add_file(source, f"s{i}", CHECKPOINT_KIND).hex)
    finished: dict[str, Any] = {"done": False}

    class _Entry:
        checkpoint = None

        def finished(self) -> bool:
            return bool(finished["done"])

    svc._entry_of = lambda t: _Entry()  # type: ignore[assignment,return-value]
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        for sha in shas:
            answer = await svc._serve_hold(_hold(sha))
            assert json.loads(answer.body)["state"] == "held", answer.body  # one round trip
        pins = _pins(blobs)
        assert [pins[s] for s in shas] == [[], ["ckpt:t"], ["ckpt:t"]]
        svc.sweep(0.0)
        assert [s for s in shas if s in _pins(blobs)] == shas[1:]  # the unpinned one went
        finished["done"] = True
        svc.sweep(0.0)
        assert _pins(blobs) == {}  # finished: released, and removed
        nursery.cancel_scope.cancel()
