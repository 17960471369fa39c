"""`ArtifactService`: who may have outputs held here (the owner of the current epoch,
the declared outputs, within the share of the quota), k capped by the mesh, the sweep
of expired and finished pins."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import trio

from populi_p2p.artifacts.runner import OUTPUT_KIND, output_pin
from populi_p2p.artifacts.service import HOLD_PATH, ArtifactService
from populi_p2p.blobs.store import BlobStore
from populi_p2p.inference.peer_api import PeerRequest
from populi_p2p.leases import Requirements, TaskKind, TaskOutput, TaskSpec
from populi_p2p.leases.grants import Ended, GrantRecord

SHA = "ab" * 32


class _Blobs:
    def __init__(self, root: Path, quota: int = 0) -> None:
        self.store = BlobStore(root, quota)
        self.fetched: list[tuple[bytes, list[str]]] = []

    async def fetch(self, digest: bytes, holders: list[str], **kw: Any) -> None:
        self.fetched.append((digest, holders))


def _spec() -> TaskSpec:
    return TaskSpec(TaskKind.BATCH, Requirements(), ["x"], submitted_by="n0",
                    replicas=("n1", "n2", "n3"), outputs=["out"])  # fmt: skip


LIVE = ("n1", "n2", "n3")


def service(
    tmp: Path, grants: dict[str, GrantRecord], *, quota: int = 0, live: tuple[str, ...] = LIVE
) -> tuple[ArtifactService, _Blobs]:
    blobs = _Blobs(tmp / "blobs", quota)

    async def submit(fields: dict[str, Any]) -> dict[str, Any]:
        return {"id": "t"}

    return ArtifactService(
        blobs=lambda: blobs, me="n2", k=2, retention=60.0, is_live=lambda n: n in live,  # type: ignore[arg-type,return-value]
        live_members=lambda: list(live), grant_of=grants.get, entry_of=lambda t: None,
        submit=submit, address_of=lambda n: None, peer_client=lambda: None,
        running=lambda: set(),
    ), blobs  # fmt: skip


def hold(caller: str, epoch: int, outputs: list[list[Any]] | None = None) -> PeerRequest:
    body = {"task": "t", "epoch": epoch, "outputs": outputs or [["out", SHA, 5, False]]}
    return PeerRequest(caller, "POST", HOLD_PATH, "", json.dumps(body).encode())


async def test_only_the_current_owner_has_its_declared_outputs_held(tmp_path: Path) -> None:
    grants = {"t": GrantRecord("t", _spec(), b"", epoch=3, owner="n1")}
    svc, blobs = service(tmp_path, grants)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        assert (await svc._serve_hold(hold("n9", 3))).status == 403  # not a member
        assert (await svc._serve_hold(hold("n3", 3))).status == 409  # not the owner
        bad = hold("n1", 3, [["other", SHA, 5, False]])
        assert (await svc._serve_hold(bad)).status == 400  # not declared
        answer = await svc._serve_hold(hold("n1", 3))
        assert answer.status == 200
        for _ in range(100):
            if json.loads((await svc._serve_hold(hold("n1", 3))).body)["state"] != "fetching":
                break
            await trio.sleep(0.01)
        assert blobs.fetched == [(bytes.fromhex(SHA), ["n1"])]  # from the owner only
        assert svc.stats["holds_refused_not_member"] == 1
        assert svc.stats["holds_refused_not_owner"] == 1
        grants["t"].ended = Ended.SUCCEEDED  # an epoch that ended holds nothing new
        assert (await svc._serve_hold(hold("n1", 3, [["out", "cd" * 32, 5, False]]))).status
        nursery.cancel_scope.cancel()


async def test_others_outputs_take_at_most_their_share_of_the_quota(tmp_path: Path) -> None:
    grants = {"t": GrantRecord("t", _spec(), b"", epoch=1, owner="n1")}
    svc, _ = service(tmp_path, grants, quota=1000)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        big = hold("n1", 1, [["out", SHA, 501, False]])
        assert (await svc._serve_hold(big)).status == 503
        assert svc.stats["holds_refused_room"] == 1
        nursery.cancel_scope.cancel()


def test_k_is_capped_by_the_live_members_and_replicas_come_first(tmp_path: Path) -> None:
    svc, _ = service(tmp_path, {}, live=("n9", "n3", "n1"))
    assert svc.targets(_spec()) == ["n1", "n3", "n9"]  # replicas in spec order, then others
    alone, _ = service(tmp_path / "b", {}, live=())
    assert trio.run(alone.replicate, "t", 1, _spec(), [TaskOutput("out", SHA, 1)]) == ["n2"]


def test_the_sweep_drops_expired_outputs_and_ended_runs(tmp_path: Path) -> None:
    svc, blobs = service(tmp_path, {})
    src = tmp_path / "f"
    src.write_bytes(b"old output")
    entry = blobs.store.add_file(src, "o", OUTPUT_KIND)
    blobs.store.pin(entry.digest, output_pin("t", time.time() - 1))
    kept = tmp_path / "g"
    kept.write_bytes(b"input in use")
    used = blobs.store.add_file(kept, "i", "input")
    blobs.store.pin(used.digest, "run:gone-task")
    svc.sweep(time.time())
    assert blobs.store.get(entry.digest) is None and svc.stats["expired"] == 1
    assert blobs.store.get(used.digest).pins == []  # no run holds it: evictable again
