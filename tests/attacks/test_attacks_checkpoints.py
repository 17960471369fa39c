"""Attacks on checkpoints (docs/artifacts.md, "Checkpoints"): a stale owner's late
snapshot, a snapshot signed by a node that did not own its epoch, a snapshot held for
a task that asks for none, and a checkpoint dir that links to the daemon's files."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import trio

from populi_p2p.artifacts.checkpoints import CHECKPOINT_DIR, _pack
from populi_p2p.artifacts.files import OutputError
from populi_p2p.artifacts.service import HOLD_PATH
from populi_p2p.inference.peer_api import PeerRequest
from populi_p2p.leases import Checkpoint
from populi_p2p.leases.grants import GrantRecord
from populi_p2p.leases.wire import encode_entries
from tests.artifacts.test_service import SHA, _Blobs, _spec, service
from tests.leases.helpers import fake_sign, spec, table


def _ck_hold(caller: str, epoch: int) -> PeerRequest:
    """A request to hold one snapshot of task ``t``'s checkpoint dir."""
    body = {"task": "t", "epoch": epoch, "outputs": [[CHECKPOINT_DIR, SHA, 5, True]],
            "checkpoint": True}  # fmt: skip
    return PeerRequest(caller, "POST", HOLD_PATH, "", json.dumps(body).encode())


def _owned_by_b():
    """Table a (a replica) and b, b owning epoch 1 of a task a accepted."""
    a, b = table("a"), table("b")
    tid, delta = a.submit(spec(0, by="a"), now=0.0)
    b.apply(delta, 0.0)
    a.apply(b.claim(tid, 1, 0, "", 1.0), 1.0)
    return a, b, tid


def test_a_stale_owners_late_snapshot_is_refused_and_counted() -> None:
    a, b, tid = _owned_by_b()
    a.apply(b.record_checkpoint(tid, Checkpoint(1, 1, "b", SHA, 9, ("b", "c"), 1), 2.0), 2.0)
    late = b.record_checkpoint(tid, Checkpoint(1, 2, "b", SHA, 9, ("b", "c"), 1), 3.0)
    c = table("c")  # b is cut off; c owns epoch 2 and records what it restored
    c.apply(a.full_delta(tid), 3.0)
    a.apply(c.claim(tid, 2, 0, "", 4.0), 4.0)
    a.apply(c.record_checkpoint(tid, Checkpoint(2, 0, "c", SHA, 9, ("c", "b"), 1), 4.0), 4.0)
    a.apply(late, 5.0)  # b's snapshot, signed while it owned epoch 1, arrives late
    held = a.get(tid).checkpoint
    assert held is not None and (held.epoch, held.owner) == (2, "c")
    assert a.statistics().checkpoints_refused_stale == 1


def test_a_snapshot_signed_by_a_member_that_did_not_own_the_epoch_is_refused() -> None:
    a, b, tid = _owned_by_b()
    forged = Checkpoint(1, 5, "m", SHA, 9, ("m",), 1)  # insider m, with its own key
    forged = attrs.evolve(forged, signature=fake_sign("m")(forged.signed_bytes(tid)))
    a.apply(encode_entries([attrs.evolve(b.get(tid), checkpoint=forged)]), 2.0)
    assert a.get(tid).checkpoint is None
    assert a.statistics().checkpoints_refused_not_owner == 1


async def test_a_stale_owners_late_snapshot_is_not_held(tmp_path: Path) -> None:
    ckpt = attrs.evolve(_spec(), checkpoint_every=0.0)
    grants = {"t": GrantRecord("t", ckpt, b"", epoch=2, owner="n3")}
    svc, blobs = service(tmp_path, grants)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        answer = await svc._serve_hold(_ck_hold("n1", 1))
        assert answer.status == 409 and b"stale epoch 1" in answer.body  # type: ignore[operator]
        assert svc.stats["holds_refused_stale"] == 1 and blobs.fetched == []
        nursery.cancel_scope.cancel()


async def test_no_snapshot_is_held_for_a_task_that_asks_for_none(tmp_path: Path) -> None:
    grants = {"t": GrantRecord("t", _spec(), b"", epoch=1, owner="n1")}
    svc, blobs = service(tmp_path, grants)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        answer = await svc._serve_hold(_ck_hold("n1", 1))
        assert answer.status == 400, answer
        assert "asks for no checkpoints" in json.loads(answer.body)["error"]
        assert svc.stats["holds_refused_bad"] == 1 and blobs.fetched == []
        nursery.cancel_scope.cancel()


def test_a_checkpoint_dir_cannot_read_the_daemons_files_through_a_link(tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_text("node key")
    work = tmp_path / "work"
    (work / CHECKPOINT_DIR).mkdir(parents=True)
    (work / CHECKPOINT_DIR / "state").symlink_to(secret)
    blobs = _Blobs(tmp_path / "blobs")
    with pytest.raises(OutputError, match="symbolic link"):
        _pack(blobs, work, tmp_path / "t.tar", "t" * 32)  # type: ignore[arg-type]
    assert blobs.store.entries() == []
