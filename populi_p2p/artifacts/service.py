"""`ArtifactService`: task inputs stored on submit, outputs held by k members, fetched
anywhere (docs/artifacts.md).

* **Submit** (``submit --input FILE|DIR[:NAME]``): each input is copied into the blob
  store here (a directory as one reproducible tar), named in the signed spec by hash
  and pinned (``in:<task>``) until the task has finished; the submit is acknowledged
  once k members hold them too (`keeper.Keeper.spread`).
* **Hold** (peer route ``POST HOLD_PATH``, the owner's outputs): a member asked to hold
  a task's outputs checks that the caller owns that epoch now (its granter record, or
  the lease table), that the outputs are the ones the spec declares, and that its share
  of the store for others' outputs has room; then fetches them from the caller (chunks
  and whole hash checked) and pins them for the retention. The answer is the job's
  state (``fetching``, ``held``, ``failed``); the owner asks again until it is held.
  A superseded epoch is refused (409) and counted.
* **Replicate** (the owner): ask members, the task's replicas first, until k of them
  hold every output (k = ``--output-replicas``, fewer when the mesh has fewer other
  live members).
* **Fetch** (``populi-node fetch TASK``): the accepted result names the outputs and
  their holders; fetch each from any holder and write it under the target dir.
* **Checkpoints** (`checkpoints.py`): a snapshot is held the same way (``"checkpoint":
  true`` in the hold request: one tar, for a task whose spec asks for checkpoints),
  pinned ``ckpt:<task>`` until the task has finished; a holder keeps the pins of the
  last two snapshots of a task it was asked to hold (and of the table's latest).
* **Sweep**: output pins past their retention are dropped (the blob removed when
  nothing else pins it); ``in:`` pins of finished tasks and ``run:`` pins that no run
  holds any more are dropped.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import httpx
import trio

from .._log import get_logger
from ..inference.peer_api import PeerRequest, PeerResponse, PeerRoutes
from ..inference.peer_client import peer_base_url
from ..leases import TaskEntry, TaskOutput, TaskSpec
from ..leases._spec import INPUT_NAME
from ..leases.grants import Ended, GrantRecord
from .checkpoints import CHECKPOINT_DIR, CHECKPOINT_KIND, CHECKPOINT_PIN
from .files import OutputError, extract_tar, pack_dir
from .keeper import Keeper
from .runner import INPUT_KIND, OUTPUT_KIND, RUN_PIN, output_pin

if TYPE_CHECKING:
    from ..blobs.service import BlobService
    from ..inference.peer_client import PeerClient

__all__ = ["HOLD_PATH", "INPUT_PIN", "ArtifactService", "InputsNotHeld"]

HOLD_PATH: Final = "/populi/v1/artifacts/hold"
#: Pin of a task's inputs on the node that accepted it, until the task has finished.
INPUT_PIN: Final = "in:"
#: The input pin's prefix while a submit waits for its replicas.
SUBMITTING: Final = "submitting-"
#: Hold jobs remembered (running and ended) at most; past it the oldest ended go.
HOLD_JOBS_MAX: Final = 256
#: Hold jobs fetching at once at most; past it the answer is 503 (ask another member).
HOLD_RUNNING_MAX: Final = 16
#: Share of the quota that others' outputs may take here (the rest: models, inputs).
OUTPUT_SHARE: Final = 0.5
#: Output blobs held here at most (any quota): the catalogue stays small.
OUTPUT_BLOBS_MAX: Final = 4096
#: Seconds between the owner's asks to a member holding its outputs.
ASK_EVERY: Final = 0.3
#: Seconds between sweeps of pins.
SWEEP_EVERY: Final = 5.0
#: Seconds a checkpoint hold request waits for its fetch before it answers (a small
#: snapshot is then held in one round trip).
CHECKPOINT_HOLD_WAIT: Final = 2.0
#: Snapshots of one task a holder keeps pinned (besides the table's latest).
CHECKPOINTS_KEPT: Final = 2
_log = get_logger("artifacts")


class InputsNotHeld(TimeoutError):
    """A submit's inputs are not held by k members in time (the API's 504; the task
    stands)."""


class ArtifactService:
    """Args:
    blobs: the blob service, once it runs.
    me: this node's id.
    k: members besides the owner that must hold a result's outputs.
    retention: seconds outputs stay pinned.
    is_live: whether a node is a current member (alive or suspect).
    live_members: the live members other than us.
    grant_of: our granter record of a task (None: not a replica of it).
    entry_of: the lease table's entry of a task.
    submit: the lease service's submit.
    address_of: a member's peer address.
    peer_client: signed calls (None until the peer API runs).
    running: task ids whose runs here still hold ``run:`` pins.
    """

    def __init__(
        self, *, blobs: Callable[[], BlobService | None], me: str, k: int, retention: float,
        is_live: Callable[[str], bool], live_members: Callable[[], list[str]],
        grant_of: Callable[[str], GrantRecord | None],
        entry_of: Callable[[str], TaskEntry | None],
        submit: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
        address_of: Callable[[str], tuple[str, int] | None],
        peer_client: Callable[[], PeerClient | None],
        running: Callable[[], set[str]],
    ) -> None:  # fmt: skip
        self._blobs = blobs
        self.me = me
        self.k = k
        self.retention = retention
        self._is_live, self._live_members = is_live, live_members
        self._grant_of, self._entry_of = grant_of, entry_of
        self._submit = submit
        self._address_of, self._peer_client = address_of, peer_client
        self._running = running
        # (task, epoch, snapshot sha256 or "" for outputs) -> the hold job
        self._jobs: dict[tuple[str, int, str], dict[str, Any]] = {}
        self._snapshots: dict[str, list[bytes]] = {}  # task -> snapshots held, oldest first
        self._submitting: set[str] = set()  # pins of submits waiting for their replicas
        self._nursery: trio.Nursery | None = None
        self.keeper = Keeper(
            blobs=blobs, me=me, k=k, retention=retention, is_live=is_live,
            live_members=live_members, entry_of=entry_of, address_of=address_of,
            peer_client=peer_client, room=self._room,
        )  # fmt: skip
        self.stats = dict.fromkeys((
            "holds_refused_stale", "holds_refused_not_owner", "holds_refused_room",
            "holds_refused_bad", "holds_refused_not_member", "held_outputs", "expired",
            "held_checkpoints",
        ), 0)  # fmt: skip

    def _store(self) -> Any:
        blobs = self._blobs()
        if blobs is None:
            raise LookupError("the node is still starting; try again in a second")
        return blobs

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.keeper.run)
            task_status.started()
            while True:
                await trio.sleep(SWEEP_EVERY)
                if self._blobs() is not None:
                    self.sweep(time.time())

    def register_peer_routes(self, routes: PeerRoutes) -> None:
        routes.add("POST", HOLD_PATH, self._serve_hold)
        self.keeper.register_peer_routes(routes)

    def statistics(self) -> dict[str, Any]:
        return {**self.stats, **self.keeper.stats, "k": self.k, "holding": len(self._jobs)}

    ####################################################################################
    # Submit with inputs

    async def submit(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The lease service's submit, after storing ``input_files`` (``[{"path",
        "name"}]``, absolute paths) as blobs named in ``inputs``; pinned until the task
        has finished. Raises ValueError (one line) for a bad input."""
        files = fields.pop("input_files", None) if isinstance(fields, dict) else None
        if not files:
            return await self._submit(fields)
        if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
            raise ValueError('input_files must be a list of {"path", "name"}')
        blobs = self._store()
        inputs = list(fields.get("inputs", []))
        digests: list[bytes] = []
        for item in files:
            entry, unpack = await self._add_input(blobs, item)
            digests.append(entry.digest)
            row = {"name": item["name"], "sha256": entry.hex, "size": entry.size}
            inputs.append({**row, "unpack": unpack})
        # Kept while the submit waits for its replicas, then until the task finished.
        waiting = f"{INPUT_PIN}{SUBMITTING}{secrets.token_hex(4)}"
        self._submitting.add(waiting)
        for digest in digests:
            blobs.store.pin(digest, waiting)
        try:
            answer = await self._submit({**fields, "inputs": inputs})
            for digest in digests:
                blobs.store.pin(digest, INPUT_PIN + answer["id"])
        finally:
            self._submitting.discard(waiting)
            for digest in digests:
                blobs.store.unpin(digest, waiting)
        return {**answer, "input_holders": await self._spread_inputs(answer["id"])}

    async def _spread_inputs(self, tid: str) -> dict[str, list[str]]:
        """Have k members (the task's replicas first) hold each input of a task just
        accepted here; {sha256: its holders, us first}.

        Raises:
            InputsNotHeld: fewer than k held one within the time (the task stands).
        """
        entry = self._entry_of(tid)
        spec = None if entry is None else entry.spec
        if spec is None:
            return {}
        targets = self.targets(spec)
        need = min(self.k, len(targets))
        holders: dict[str, list[str]] = {}

        async def spread(sha: str) -> None:
            holders[sha] = [self.me, *await self.keeper.spread(tid, sha, targets, need)]

        async with trio.open_nursery() as nursery:
            for sha in dict.fromkeys(i.sha256 for i in spec.inputs):
                nursery.start_soon(spread, sha)
        short = {sha: h for sha, h in holders.items() if len(h) <= need}
        if short:
            lines = ", ".join(f"{sha[:12]} by {len(h) - 1}" for sha, h in sorted(short.items()))
            raise InputsNotHeld(
                f"task {tid} is accepted, but its inputs are held by fewer than {need} other"
                f" members ({lines}); it runs while this node or a holder lives"
            )
        self.keeper.stats["inputs_spread"] += len(holders)
        return holders

    async def sources(self, spec: TaskSpec, sha256: str) -> list[str]:
        """Whom an owner fetches an input from: the members that hold it now, then the
        submitter and the task's replicas."""
        named = [spec.submitted_by, *spec.replicas]
        try:
            found = (await self.keeper.holders_now([sha256]))[sha256]
        except LookupError:
            found = []
        return [n for n in dict.fromkeys([*found, *named]) if n != self.me]

    async def holders(self, query: Any) -> dict[str, Any]:
        """``GET /v1/artifacts/holders?task=ID``: who holds each blob of a task now."""
        task = query.get("task") if isinstance(query, dict) else None
        if isinstance(task, list):
            task = task[-1] if task else None
        if not isinstance(task, str):
            raise ValueError("give the task (?task=ID)")
        return await self.keeper.task_holders(self._find(task))

    async def _add_input(self, blobs: BlobService, item: dict[str, Any]) -> tuple[Any, bool]:
        path, name = item.get("path"), item.get("name")
        if not isinstance(path, str) or not os.path.isabs(path):
            raise ValueError("--input: give the file's or directory's absolute path")
        if not isinstance(name, str) or not INPUT_NAME.fullmatch(name):
            raise ValueError(f"--input {path}: the name {name!r} must be 1..64 of [A-Za-z0-9._-]")
        if os.path.isdir(path):
            tmp = blobs.store.root / "partial" / f"in-{os.getpid()}-{id(item)}.tar"
            try:
                await trio.to_thread.run_sync(pack_dir, Path(path), tmp)
                entry = await trio.to_thread.run_sync(blobs.store.add_file, tmp, name, INPUT_KIND)
            except OutputError as exc:
                raise ValueError(f"--input {path}: {exc}") from None
            finally:
                tmp.unlink(missing_ok=True)
            return entry, True
        if not os.path.isfile(path):
            raise ValueError(f"--input {path}: no such file or directory")
        row = await blobs.add({"path": path, "name": name, "kind": INPUT_KIND})
        return blobs.store.get(bytes.fromhex(row["hash"])), False

    ####################################################################################
    # Hold: a member keeps an owner's outputs

    def _refuse(self, why: str, status: int, line: str) -> PeerResponse:
        self.stats[f"holds_refused_{why}"] += 1
        return PeerResponse(status, json.dumps({"error": line}).encode())

    async def _serve_hold(self, request: PeerRequest) -> PeerResponse:
        if not self._is_live(request.caller):
            return self._refuse("not_member", 403, "only a current member may ask")
        try:
            body = json.loads(request.body[: 64 * 1024])
            tid, epoch = str(body["task"]), int(body["epoch"])
            outputs = [TaskOutput(*o) for o in body["outputs"]]
            checkpoint = body.get("checkpoint", False) is True
        except (ValueError, KeyError, TypeError) as exc:
            return self._refuse("bad", 400, f"bad hold request: {exc}")
        key = (tid, epoch, outputs[0].sha256 if checkpoint and outputs else "")
        job = self._jobs.get(key)
        if job is None or job["owner"] != request.caller:
            spec, why = self._owned_by(tid, epoch, request.caller)
            if spec is None:
                stale = why.startswith("stale")
                return self._refuse("stale" if stale else "not_owner", 409, why)
            bad = _undeclared(spec, outputs, checkpoint)
            if bad:
                return self._refuse("bad", 400, bad)
            room = self._room(sum(o.size for o in outputs), len(outputs))
            if room is not None:
                return self._refuse("room", 503, room)
            job = {"owner": request.caller, "row": {"state": "fetching"}, "ended": False,
                   "done": trio.Event()}  # fmt: skip
            self._remember(key, job)
            assert self._nursery is not None
            self._nursery.start_soon(self._hold, tid, request.caller, outputs, job, checkpoint)
        if checkpoint:  # small and often: answer once held, in one round trip
            with trio.move_on_after(CHECKPOINT_HOLD_WAIT):
                await job["done"].wait()
        return PeerResponse(200, json.dumps(job["row"]).encode())

    def _owned_by(self, tid: str, epoch: int, caller: str) -> tuple[TaskSpec | None, str]:
        """The task's spec when `caller` owns `epoch` of it now, else why not."""
        rec = self._grant_of(tid)
        if rec is not None:
            if rec.epoch > epoch:
                return None, f"stale epoch {epoch}: epoch {rec.epoch} was granted since"
            if rec.epoch == epoch and rec.owner == caller and rec.ended is Ended.NO:
                return rec.spec, ""
        entry = self._entry_of(tid)
        cur = None if entry is None else entry.current
        if entry is None or entry.spec is None or cur is None:
            return None, f"task {tid} is not known here"
        if cur.epoch > epoch:
            return None, f"stale epoch {epoch}: the table holds epoch {cur.epoch}"
        if cur.epoch != epoch or cur.owner != caller or entry.finished():
            return None, f"{caller[:12]} does not own epoch {epoch} of task {tid[:12]} here"
        return entry.spec, ""

    def _room(self, size: int, count: int) -> str | None:
        """Why others' outputs of `size` bytes may not be held here (None: they may)."""
        store = self._store().store
        kinds = (OUTPUT_KIND, CHECKPOINT_KIND, INPUT_KIND)
        held = [e for e in store.entries() if e.kind in kinds]
        if len(held) + count > OUTPUT_BLOBS_MAX:
            return f"holds {len(held)} output blobs already (at most {OUTPUT_BLOBS_MAX})"
        if store.quota and sum(e.size for e in held) + size > store.quota * OUTPUT_SHARE:
            return f"outputs may take {OUTPUT_SHARE:.0%} of the {store.quota}-byte blob quota"
        return None

    def _remember(self, key: tuple[str, int, str], job: dict[str, Any]) -> None:
        self._jobs[key] = job
        while len(self._jobs) > HOLD_JOBS_MAX:
            old = next((k for k, j in self._jobs.items() if j["ended"]), None)
            if old is None:
                break
            del self._jobs[old]

    async def _hold(
        self, tid: str, owner: str, outputs: list[TaskOutput], job: dict[str, Any],
        checkpoint: bool = False,
    ) -> None:  # fmt: skip
        from ..blobs.fetcher import FetchError
        from ..blobs.store import QuotaError

        blobs = self._store()
        pin = output_pin(tid, time.time() + self.retention)
        kind, name = OUTPUT_KIND, f"{tid[:16]}-out"
        if checkpoint:
            pin, kind, name = CHECKPOINT_PIN + tid, CHECKPOINT_KIND, f"{tid[:16]}-ckpt"
        try:
            for out in outputs:
                digest = bytes.fromhex(out.sha256)
                await blobs.fetch(digest, [owner], name=name, kind=kind)
                blobs.store.pin(digest, pin)
                if checkpoint:
                    self._keep_latest(tid, digest)
            job["row"] = {"state": "held"}
            self.stats["held_checkpoints" if checkpoint else "held_outputs"] += len(outputs)
        except (FetchError, QuotaError, ValueError, LookupError, OSError) as exc:
            job["row"] = {"state": "failed", "error": str(exc)[:300]}
        job["ended"] = True
        job["done"].set()

    def _keep_latest(self, tid: str, digest: bytes) -> None:
        """Unpin the snapshots of `tid` held here before the last `CHECKPOINTS_KEPT`,
        except the one the table names as the latest."""
        held = self._snapshots.setdefault(tid, [])
        if digest in held:
            held.remove(digest)
        held.append(digest)
        entry = self._entry_of(tid)
        latest = None if entry is None or entry.checkpoint is None else entry.checkpoint.sha256
        while len(held) > CHECKPOINTS_KEPT:
            old = held.pop(0)
            if old.hex() != latest:
                self._store().store.unpin(old, CHECKPOINT_PIN + tid)

    ####################################################################################
    # Replicate: the owner has its outputs held

    def targets(self, spec: TaskSpec) -> list[str]:
        """Whom to ask, in order: the task's live replicas, then the other live members."""
        live = set(self._live_members()) - {self.me}
        first = [r for r in spec.replicas if r in live]
        return first + sorted(live - set(first))

    async def replicate(
        self, tid: str, epoch: int, spec: TaskSpec, outputs: list[TaskOutput], *,
        checkpoint: bool = False,
    ) -> list[str]:  # fmt: skip
        """Have k members besides us hold every output (or the one snapshot of the
        checkpoint dir); the holders, us first.

        Raises:
            OutputError: every member asked refused or failed (one line).
        """
        fields: dict[str, Any] = {"task": tid, "epoch": epoch,
                                  "outputs": [o.to_wire() for o in outputs]}  # fmt: skip
        if checkpoint:
            fields["checkpoint"] = True
        body = json.dumps(fields).encode()
        targets = self.targets(spec)
        need = min(self.k, len(targets))
        held: list[str] = []
        failed: dict[str, str] = {}
        while len(held) < need:
            asking = [t for t in targets if t not in held and t not in failed]
            asking = asking[: need - len(held)]
            if not asking:
                lines = "; ".join(f"{n[:12]}: {w}" for n, w in failed.items())
                raise OutputError(f"held by {len(held)} of {need} members ({lines})")
            for target in asking:
                state, error = await self._ask(target, body)
                if state == "held":
                    held.append(target)
                elif state == "failed":
                    failed[target] = error
            if len(held) < need:
                await trio.sleep(ASK_EVERY)
        return [self.me, *held]

    async def _ask(self, target: str, body: bytes) -> tuple[str, str]:
        client, address = self._peer_client(), self._address_of(target)
        if client is None or address is None:
            return "failed", "no peer address"
        try:
            resp = await client.call(target, peer_base_url(*address), "POST", HOLD_PATH, body)
            answer = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            return "failed", repr(exc)[:200]
        if resp.status_code == 409:  # superseded: no member will hold it for us
            raise OutputError(str(answer.get("error", "stale epoch")))
        if resp.status_code != 200 or not isinstance(answer, dict):
            return "failed", str(answer.get("error", resp.status_code))[:200]
        return str(answer.get("state", "failed")), str(answer.get("error", ""))

    ####################################################################################
    # Fetch: ``populi-node fetch TASK --to DIR``

    async def fetch(self, body: Any) -> dict[str, Any]:
        """Fetch a finished task's outputs from any holder into ``to`` (absolute)."""
        from ..blobs.fetcher import FetchError
        from ..blobs.store import QuotaError

        task, to = (body.get("task"), body.get("to")) if isinstance(body, dict) else (None, None)
        if not isinstance(task, str) or not isinstance(to, str) or not os.path.isabs(to):
            raise ValueError("give the task and the target directory's absolute path")
        entry = self._find(task)
        result = entry.accepted_result
        if result is None or not result.outputs:
            raise LookupError(
                f"task {entry.task_id[:12]} has no stored outputs (see populi-node task;"
                " outputs come with a succeeded result)"
            )
        blobs = self._store()
        rows = []
        for out in result.outputs:
            target = Path(to) / out.path
            if os.path.lexists(target):
                raise ValueError(f"{target} exists: remove it or pass --to another directory")
            digest = bytes.fromhex(out.sha256)
            holders = [h for h in result.holders if h != self.me]
            try:
                await blobs.fetch(digest, holders, name=f"{entry.task_id[:16]}-out",
                                  kind=OUTPUT_KIND)  # fmt: skip
            except (FetchError, QuotaError) as exc:
                raise LookupError(f"output {out.path}: {exc}") from None
            blob = blobs.store.path(digest)
            if blob is None:
                raise LookupError(f"output {out.path} vanished from the store")
            target.parent.mkdir(parents=True, exist_ok=True)
            place = extract_tar if out.unpack else shutil.copyfile
            await trio.to_thread.run_sync(place, blob, target)
            rows.append({"path": out.path, "sha256": out.sha256, "size": out.size,
                         "dir": out.unpack, "to": str(target)})  # fmt: skip
        return {"task": entry.task_id, "outputs": rows, "holders": list(result.holders)}

    def _find(self, task: str) -> TaskEntry:
        entry = self._entry_of(task)
        if entry is None:
            raise LookupError(f"no task {task} here (give the full id; see populi-node tasks)")
        return entry

    ####################################################################################
    # Sweep

    def sweep(self, now: float) -> None:
        """Drop pins that ran out: outputs past retention (the blob too, when nothing
        else pins it), inputs of finished tasks, runs that ended."""
        store = self._store().store
        running = self._running()
        for entry in store.entries():
            for pin in list(entry.pins):
                if _expired(pin, now) or self._input_done(pin) or self._checkpoint_done(pin) or (
                    pin.startswith(RUN_PIN) and pin[len(RUN_PIN):] not in running
                ):  # fmt: skip
                    store.unpin(entry.digest, pin)
            removable = entry.kind in (OUTPUT_KIND, CHECKPOINT_KIND)
            if removable and not entry.pins and entry.complete:
                try:
                    store.remove(entry.digest)
                    self.stats["expired"] += 1
                except (LookupError, ValueError):
                    pass

    def _checkpoint_done(self, pin: str) -> bool:
        """A snapshot pin of a finished (or forgotten) task."""
        if not pin.startswith(CHECKPOINT_PIN):
            return False
        tid = pin[len(CHECKPOINT_PIN) :]
        entry = self._entry_of(tid)
        if entry is None or entry.finished():
            self._snapshots.pop(tid, None)
            return True
        return False

    def _input_done(self, pin: str) -> bool:
        """An input pin of a finished (or unknown) task, or of a submit no longer
        waiting (a restart)."""
        if not pin.startswith(INPUT_PIN):
            return False
        if pin.startswith(INPUT_PIN + SUBMITTING):
            return pin not in self._submitting
        entry = self._entry_of(pin[len(INPUT_PIN) :])
        return entry is None or entry.finished()


def _undeclared(spec: TaskSpec, outputs: list[TaskOutput], checkpoint: bool) -> str:
    """Why a hold request names what the spec does not allow ("" when it does not)."""
    if checkpoint:
        if spec.checkpoint_every is None:
            return "the task's spec asks for no checkpoints"
        if len(outputs) != 1 or outputs[0].path != CHECKPOINT_DIR or not outputs[0].unpack:
            return f"a checkpoint is one tar of {CHECKPOINT_DIR}"
        return ""
    if len(outputs) > len(spec.outputs) or any(o.path not in spec.outputs for o in outputs):
        return "outputs the task's spec does not declare"
    return ""


def _expired(pin: str, now: float) -> bool:
    parts = pin.split(":")
    return len(parts) == 3 and parts[0] == "out" and parts[2].isdigit() and int(parts[2]) < now


def parse_input_arg(arg: str) -> dict[str, str]:
    """``FILE|DIR[:NAME]`` as ``{"path", "name"}`` (absolute path; name: the base name)."""
    path, colon, name = arg.rpartition(":")
    if not colon or "/" in name:
        path, name = arg, ""
    absolute = os.path.abspath(path)
    name = name or os.path.basename(absolute.rstrip("/"))
    return {"path": absolute, "name": name}
