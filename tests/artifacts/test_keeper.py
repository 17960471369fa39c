"""`Keeper`: what the table needs kept (`wanted`), who may have it kept here (a live
member, a blob the table needs, within the share of the quota), the ``held`` query
(complete and pinned only), the spread to k members, and the repair pass (only the
lowest holder repairs, up to k + 1 copies)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from populi_p2p.artifacts.keeper import HELD_PATH, KEEP_PATH, Keeper, wanted
from populi_p2p.blobs.store import BlobStore
from populi_p2p.inference.peer_api import PeerRequest
from populi_p2p.leases import (
    BlobInput,
    Checkpoint,
    Requirements,
    TaskKind,
    TaskOutput,
    TaskResult,
    TaskSpec,
)

CONTENT = b"the input"
IN, OUT, CK = hashlib.sha256(CONTENT).hexdigest(), "bb" * 32, "cc" * 32


@attrs.define
class _Entry:
    """The parts of a `TaskEntry` the keeper reads."""

    task_id: str = "t"
    spec: TaskSpec | None = None
    checkpoint: Checkpoint | None = None
    accepted_result: TaskResult | None = None
    done: bool = False

    def finished(self) -> bool:
        return self.done


def _entry(**kw: Any) -> _Entry:
    spec = TaskSpec(TaskKind.BATCH, Requirements(), ["x"], submitted_by="n0",
                    replicas=("n1", "n2", "n3"), inputs=[BlobInput("data", IN, 10)],
                    outputs=["out"], checkpoint_every=0.0)  # fmt: skip
    return _Entry(spec=spec, **kw)


def _result() -> TaskResult:
    return TaskResult(0, outputs=(TaskOutput("out", OUT, 20),), holders=("n1", "n2"))


class _Blobs:
    def __init__(self, root: Path, quota: int = 0) -> None:
        self.store = BlobStore(root, quota)
        self.fetched: list[tuple[bytes, list[str]]] = []
        self.src = root.parent / "src"

    async def fetch(self, digest: bytes, holders: list[str], *, name: str, kind: str) -> None:
        self.fetched.append((digest, holders))
        self.src.write_bytes(CONTENT)  # the "fetched" blob
        self.store.add_file(self.src, name, kind)


def keeper(tmp: Path, entries: dict[str, Any], *, live: tuple[str, ...] = ("n1", "n2", "n3"),
           me: str = "n2", quota: int = 0, peers: Any = None) -> tuple[Keeper, _Blobs]:  # fmt: skip
    blobs = _Blobs(tmp / "blobs", quota)

    def room(size: int, count: int) -> str | None:
        return "full" if quota and size > quota // 2 else None

    k = Keeper(blobs=lambda: blobs, me=me, k=2, retention=60.0, is_live=lambda n: n in live,  # type: ignore[arg-type,return-value]
               live_members=lambda: [n for n in live if n != me], entry_of=entries.get,
               address_of=lambda n: ("127.0.0.1", 1), peer_client=lambda: None,
               room=room)  # fmt: skip
    if peers is not None:
        k._call = peers  # type: ignore[method-assign]
    return k, blobs


def keep(caller: str, sha: str, task: str = "t") -> PeerRequest:
    return PeerRequest(
        caller, "POST", KEEP_PATH, "", json.dumps({"task": task, "sha256": sha}).encode()
    )


def test_the_table_wants_inputs_and_snapshots_until_the_end_and_outputs_after() -> None:
    ck = Checkpoint(3, 1, "n1", CK, 5, ("n1",), 3)
    running = _entry(checkpoint=ck)
    assert wanted(running, IN) == ("input", 10)  # type: ignore[arg-type]
    assert wanted(running, CK) == ("checkpoint", 5)  # type: ignore[arg-type]
    assert wanted(running, OUT) is None  # type: ignore[arg-type]
    done = _entry(checkpoint=ck, accepted_result=_result(), done=True)
    assert wanted(done, OUT) == ("output", 20)  # type: ignore[arg-type]
    assert wanted(done, IN) is None and wanted(done, CK) is None  # type: ignore[arg-type]
    assert wanted(None, IN) is None


async def test_a_member_keeps_only_what_the_table_needs(tmp_path: Path) -> None:
    entries = {"t": _entry()}
    k, blobs = keeper(tmp_path, entries)
    async with trio.open_nursery() as nursery:
        await nursery.start(k.run)
        assert (await k._serve_keep(keep("n9", IN))).status == 403  # not a member
        assert (await k._serve_keep(keep("n1", OUT))).status == 404  # no result yet
        assert (await k._serve_keep(keep("n1", IN, task="other"))).status == 404
        bad = PeerRequest("n1", "POST", KEEP_PATH, "", b'{"task": "t", "sha256": "zz"}')
        assert (await k._serve_keep(bad)).status == 400
        answer = await k._serve_keep(keep("n3", IN))
        assert answer.status == 200 and json.loads(answer.body)["state"] == "held"  # type: ignore[arg-type]
        # From the caller first, then the holders the table names (not us).
        assert blobs.fetched == [(bytes.fromhex(IN), ["n3", "n0", "n1"])]
        assert blobs.store.get(bytes.fromhex(IN)).pins == ["in:t"]
        assert k.stats["keeps_refused_not_member"] == 1
        assert k.stats["keeps_refused_unwanted"] == 2 and k.stats["kept"] == 1
        nursery.cancel_scope.cancel()


async def test_others_blobs_kept_here_stay_within_the_share(tmp_path: Path) -> None:
    k, blobs = keeper(tmp_path, {"t": _entry()}, quota=16)
    async with trio.open_nursery() as nursery:
        await nursery.start(k.run)
        assert (await k._serve_keep(keep("n1", IN))).status == 503  # 10 bytes > 16 / 2
        assert k.stats["keeps_refused_room"] == 1 and blobs.fetched == []
        nursery.cancel_scope.cancel()


async def test_held_names_only_complete_pinned_blobs(tmp_path: Path) -> None:
    k, blobs = keeper(tmp_path, {})
    src = tmp_path / "f"
    src.write_bytes(b"kept")
    kept = blobs.store.add_file(src, "a", "output")
    blobs.store.pin(kept.digest, "out:t:9999999999")
    src.write_bytes(b"loose")
    loose = blobs.store.add_file(src, "b", "output")
    ask = {"sha256": [kept.hex, loose.hex, "00" * 32]}
    answer = await k._serve_held(PeerRequest("n1", "POST", HELD_PATH, "", json.dumps(ask).encode()))
    assert json.loads(answer.body) == {"held": [kept.hex]}  # type: ignore[arg-type]


def _fake_peers(held: dict[str, set[str]], asked: list[str]) -> Any:
    """Members that answer ``held`` from `held` and hold whatever they are asked to."""

    async def call(target: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == HELD_PATH:
            return 200, {"held": [s for s in body["sha256"] if target in held.get(s, set())]}
        asked.append(target)
        held.setdefault(body["sha256"], set()).add(target)
        return 200, {"state": "held"}

    return call


async def test_repair_brings_back_k_plus_one_copies_from_the_lowest_holder(tmp_path: Path) -> None:
    entries = {"t": _entry(accepted_result=_result(), done=True)}
    held: dict[str, set[str]] = {}
    asked: list[str] = []
    # n1 (the lowest holder: it repairs) and n4 live; n2, the other holder, is dead.
    k, blobs = keeper(tmp_path, entries, live=("n1", "n3", "n4"), me="n1",
                      peers=_fake_peers(held, asked))  # fmt: skip
    src = tmp_path / "f"
    src.write_bytes(b"output")
    entry = blobs.store.add_file(src, "o", "output")
    result = TaskResult(0, outputs=(TaskOutput("out", entry.hex, 6),), holders=("n2", "n1"))
    entries["t"].accepted_result = result
    blobs.store.pin(entry.digest, f"out:t:{int(time.time()) + 60}")
    assert await k.repair() == 0
    assert sorted(asked) == ["n3", "n4"]  # the replica n3 first, then up to 3 copies
    assert k.stats["repaired"] == 2
    asked.clear()
    assert await k.repair() == 0 and asked == []  # three copies: nothing to do
    # Not the lowest holder: n0 holds it too, so n1 leaves the repair to n0.
    other, oblobs = keeper(tmp_path / "o", entries, live=("n0", "n1", "n3", "n4"), me="n1",
                           peers=_fake_peers({entry.hex: {"n0"}}, asked))  # fmt: skip
    e2 = oblobs.store.add_file(src, "o", "output")
    oblobs.store.pin(e2.digest, f"out:t:{int(time.time()) + 60}")
    assert await other.repair() == 0 and asked == []


async def test_spread_replaces_a_member_that_fails(tmp_path: Path) -> None:
    async def call(target: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        return (200, {"state": "held"}) if target != "n1" else (200, {"state": "failed"})

    k, _ = keeper(tmp_path, {}, peers=call)
    got = await k.spread("t", IN, ["n1", "n3", "n4"], 2)
    assert sorted(got) == ["n3", "n4"]


def test_a_pass_looks_at_live_snapshots_and_inputs_not_superseded_ones(tmp_path: Path) -> None:
    entries: dict[str, Any] = {}
    k, blobs = keeper(tmp_path, entries)
    src = tmp_path / "f"
    digests = {}
    for name, body, pin in (("latest", b"snap 2", "ckpt:t"), ("older", b"snap 1", "ckpt:t"),
                            ("input", CONTENT, "in:t"), ("gone", b"snap x", "ckpt:u")):  # fmt: skip
        src.write_bytes(body)
        digests[name] = blobs.store.add_file(src, name, "checkpoint").hex
        blobs.store.pin(bytes.fromhex(digests[name]), pin)
    ck = Checkpoint(3, 2, "n1", digests["latest"], 6, ("n1", "n2"), 3)
    entries["t"] = _entry(checkpoint=ck)
    entries["u"] = _entry(task_id="u", done=True)  # finished: its snapshot is not needed
    assert k._candidates() == {
        digests["latest"]: ("t", "checkpoint", None),
        digests["input"]: ("t", "input", None),
    }
