"""`ArtifactRunner`: a task's inputs before its start and its outputs after its end.

It is the node's `TaskRunner` around the deployment runner (which is around the
executor). A task with no inputs and no outputs (and every deployed replica) passes
straight through. For the others, on the owner:

1. *inputs*: each input blob is fetched from any holder (the members that hold it now,
   then the accepting node and the task's replicas: chunks and whole hash checked,
   docs/models.md) and pinned
   (``run:<task>``) while the task runs; a directory's tar is unpacked into a staging
   dir. Then the process is started, and before it can run (its supervisor spawns it
   at the next checkpoint) the inputs are placed in ``work/inputs``, which the task
   finds as ``$POPULI_INPUT_DIR``. A stop, or a lease that lapses, meanwhile ends the
   task with no process; a fetch that fails is a failed start (tried elsewhere).
2. *outputs*: when the command exits 0, each declared output is read without following
   links (`files.open_output`), stored as a blob (pinned for the retention), and
   held by k other members (`ArtifactService.replicate`). Only then does the end go
   to the lease service, with the outputs and their holders: the signed result names
   them. The lease is still held meanwhile (the owner renews it), so a stop, a fence
   or a superseded claim still ends the epoch as it would the process: the late
   outputs are then never posted (fencing by the epoch, docs/leases.md).
3. *checkpoints* (`checkpoints.Checkpointer`): the latest snapshot restored before the
   start (``$POPULI_CHECKPOINT_DIR``, ``$POPULI_RESUMED_FROM``), snapshots while the
   process runs, and one after it ended on a handoff drain, before the end is posted.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs
import trio

from .._log import event, get_logger
from ..executor.runner import TaskExited, TaskRunner
from ..leases import Checkpoint, TaskOutput, TaskSpec
from .checkpoints import CheckpointRun
from .files import OutputError, extract_tar, open_output, place_file

if TYPE_CHECKING:
    from ..blobs.service import BlobService
    from .checkpoints import Checkpointer

__all__ = ["INPUT_DIR", "OUTPUT_KIND", "RUN_PIN", "ArtifactRunner", "artifact_runner"]

#: The task's inputs, in its work dir (``$POPULI_INPUT_DIR``).
INPUT_DIR: Final = "inputs"
#: Pin of a task's inputs on its owner while it runs.
RUN_PIN: Final = "run:"
#: Blob kinds (never advertised in the record: results and specs name the holders).
INPUT_KIND: Final = "input"
OUTPUT_KIND: Final = "output"
#: Seconds the owner tries to have its outputs held by k members before the epoch
#: fails (and is retried).
REPLICATE_TIMEOUT: Final = 300.0
_log = get_logger("artifacts")

#: ``replicate(task_id, epoch, spec, outputs) -> holders`` (owner first). Raises
#: `OutputError` when k members could not be had in time.
Replicate = Callable[[str, int, TaskSpec, list[TaskOutput]], Awaitable[list[str]]]


class Replicator(Protocol):
    """What has outputs held (`ArtifactService`; typed here, not imported)."""

    async def replicate(
        self, tid: str, epoch: int, spec: TaskSpec, outputs: list[TaskOutput], *,
        checkpoint: bool = False,
    ) -> list[str]: ...  # fmt: skip

    async def sources(self, spec: TaskSpec, sha256: str) -> list[str]: ...


#: ``sources(spec, sha256) -> members``: whom to fetch an input from, in order.
Sources = Callable[[TaskSpec, str], Awaitable[list[str]]]


class CheckpointTable(Protocol):
    """Where checkpoints are recorded (`LeaseService`; typed here, not imported)."""

    async def record_checkpoint(self, task_id: str, checkpoint: Checkpoint) -> None: ...

    def latest_checkpoint(self, task_id: str) -> Checkpoint | None: ...


@attrs.define
class _Run:
    """One task of ours with inputs or outputs, from its start to its posted end."""

    task_id: str
    epoch: int
    spec: TaskSpec
    deadline: float | None
    started: bool = False  # the process was handed to the inner runner
    stop: str = ""  # why it was stopped while not running a process
    pinned: list[bytes] = attrs.field(factory=list)
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    began: float = attrs.field(factory=time.time)
    checkpoint: CheckpointRun | None = None  # a task submitted with checkpoints


class ArtifactRunner:
    """Args:
    inner: the runner of processes (the deployment runner).
    tasks_dir: the executor's tasks dir (``tasks_dir/<task>/<epoch>/work``).
    me: this node's id.
    blobs: the blob service, once it runs (None before).
    replicate: has the outputs held by k members (`ArtifactService.replicate`).
    retention: seconds outputs stay pinned (`NodeConfig.output_retention`).
    checkpoints: snapshots and restores (None: tasks asking for them fail to start).
    sources: whom to fetch an input from (None: the submitter, then the replicas).
    """

    def __init__(
        self, inner: TaskRunner, *, tasks_dir: Path, me: str,
        blobs: Callable[[], BlobService | None], replicate: Replicate, retention: float,
        checkpoints: Checkpointer | None = None, sources: Sources | None = None,
    ) -> None:  # fmt: skip
        self._inner = inner
        self._sources = sources
        self.checkpoints = checkpoints
        self._tasks_dir = tasks_dir
        self._me = me
        self._blobs = blobs
        self.replicate = replicate
        self._retention = retention
        self._send, self.exits = trio.open_memory_channel[TaskExited](float("inf"))
        self.runs: dict[str, _Run] = {}
        self._nursery: trio.Nursery | None = None
        self.stats = dict.fromkeys(("inputs_fetched", "outputs_stored", "outputs_refused"), 0)

    ####################################################################################
    # TaskRunner

    def start(
        self, task_id: str, epoch: int, spec: TaskSpec, gpu_uuids: list[str], *,
        deadline: float | None = None,
    ) -> None:  # fmt: skip
        checkpointed = spec.checkpoint_every is not None
        if spec.deployment is not None or not (spec.inputs or spec.outputs or checkpointed):
            self._inner.start(task_id, epoch, spec, gpu_uuids, deadline=deadline)
            return
        run = self.runs[task_id] = _Run(task_id, epoch, spec, deadline)
        if checkpointed:
            work = self.work_dir(task_id, epoch)
            run.checkpoint = CheckpointRun(task_id, epoch, spec, work, deadline=deadline)
        assert self._nursery is not None, "the artifact runner is not running"
        self._nursery.start_soon(self._bring_up, run, gpu_uuids)

    def stop(self, task_id: str, reason: str, grace: float | None = None) -> None:
        run = self.runs.get(task_id)
        if run is not None and (not run.started or run.stop == "outputs"):
            run.stop = reason
            run.scope.cancel()
            return
        self._inner.stop(task_id, reason, grace)

    def fence(self, task_id: str, epoch: int, deadline: float) -> None:
        run = self.runs.get(task_id)
        if run is not None and run.epoch == epoch:
            run.deadline = deadline
            if run.checkpoint is not None:
                run.checkpoint.deadline = deadline
        self._inner.fence(task_id, epoch, deadline)

    async def reap_leftovers(self) -> list[tuple[str, int]]:
        return await self._inner.reap_leftovers()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._forward)
            task_status.started()

    def work_dir(self, task_id: str, epoch: int) -> Path:
        return self._tasks_dir / task_id / str(epoch) / "work"

    ####################################################################################
    # Inputs

    async def _blob_service(self) -> BlobService:
        blobs = self._blobs()
        while blobs is None:  # the node is still starting
            await trio.sleep(0.1)
            blobs = self._blobs()
        return blobs

    async def _bring_up(self, run: _Run, gpus: list[str]) -> None:
        from ..blobs.fetcher import FetchError
        from ..blobs.store import QuotaError

        staging = self._tasks_dir / ".inputs" / f"{run.task_id}-{run.epoch}"
        ck_staging = self._tasks_dir / ".inputs" / f"{run.task_id}-{run.epoch}.ckpt"
        failure = ""
        ready = False
        with run.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_fence, run)
                try:
                    await self._stage(run, staging)
                    if run.checkpoint is not None:
                        await self._restore(run.checkpoint, ck_staging)
                    ready = True
                except (FetchError, QuotaError, OutputError, LookupError, OSError,
                        ValueError) as exc:  # fmt: skip
                    failure = f"input: {exc}" if str(exc) else type(exc).__name__
                nursery.cancel_scope.cancel()
        if not ready:
            self._unpin(run)
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(ck_staging, ignore_errors=True)
            self.runs.pop(run.task_id, None)
            reason = "cancelled" if run.stop else "start_failed"
            await self._send.send(TaskExited(
                run.task_id, run.epoch, None, reason, b"", failure.encode()[-200:], run.began,
                time.time(), detail=run.stop or failure,
            ))  # fmt: skip
            return
        work = self.work_dir(run.task_id, run.epoch)
        env = {"POPULI_INPUT_DIR": str(work / INPUT_DIR)} if run.spec.inputs else {}
        if run.checkpoint is not None:
            env.update(_checkpoint_env(run.checkpoint, work))
        spec = attrs.evolve(run.spec, env={**run.spec.env, **env})
        run.started = True
        self._inner.start(run.task_id, run.epoch, spec, gpus, deadline=run.deadline)
        # No checkpoint between the start (which made the work dir) and this: the
        # process is spawned only once we yield, with its inputs in place.
        if staging.is_dir() and work.is_dir():
            os.rename(staging, work / INPUT_DIR)
        shutil.rmtree(staging, ignore_errors=True)
        if run.checkpoint is not None and ck_staging.is_dir() and work.is_dir():
            self.checkpoints_of().place(ck_staging, work)
            assert self._nursery is not None
            self._nursery.start_soon(self.checkpoints_of().watch, run.checkpoint)
        shutil.rmtree(ck_staging, ignore_errors=True)

    def checkpoints_of(self) -> Checkpointer:
        assert self.checkpoints is not None, "checkpoints are not wired"
        return self.checkpoints

    async def _restore(self, run: CheckpointRun, staging: Path) -> None:
        if self.checkpoints is None:
            raise LookupError("this node does not run checkpointed tasks")
        await self.checkpoints.restore(run, staging)

    async def _stage(self, run: _Run, staging: Path) -> None:
        """Fetch, pin and lay out every input under `staging`."""
        blobs = await self._blob_service()
        spec = run.spec
        if not spec.inputs:
            return
        await trio.to_thread.run_sync(shutil.rmtree, staging, True)
        staging.mkdir(parents=True, mode=0o755)
        os.chmod(staging.parent, 0o711)
        named = [spec.submitted_by, *spec.replicas]
        named = [h for i, h in enumerate(named) if h != self._me and h not in named[:i]]
        for item in spec.inputs:
            digest = bytes.fromhex(item.sha256)
            holders = named
            held = blobs.store.get(digest)
            if self._sources is not None and (held is None or not held.complete):
                holders = await self._sources(spec, item.sha256)
            await blobs.fetch(digest, holders, name=item.name, kind=INPUT_KIND)
            blobs.store.pin(digest, RUN_PIN + run.task_id)
            run.pinned.append(digest)
            self.stats["inputs_fetched"] += 1
            path = blobs.store.path(digest)
            if path is None:
                raise LookupError(f"input {item.name} vanished from the store after its fetch")
            place = extract_tar if item.unpack else place_file
            await trio.to_thread.run_sync(place, path, staging / item.name)

    async def _watch_fence(self, run: _Run) -> None:
        """A lease that lapses before the process runs (or while its outputs are being
        stored) ends the epoch as ``fenced``."""
        while True:
            await trio.sleep(0.2)
            if run.deadline is not None and time.monotonic() >= run.deadline:
                run.stop = "fenced"
                run.scope.cancel()

    def _unpin(self, run: _Run) -> None:
        blobs = self._blobs()
        if blobs is not None:
            for digest in run.pinned:
                blobs.store.unpin(digest, RUN_PIN + run.task_id)
        run.pinned.clear()

    ####################################################################################
    # Outputs

    async def _forward(self) -> None:
        async for ended in self._inner.exits:
            run = self.runs.get(ended.task_id)
            if run is None or run.epoch != ended.epoch or not run.started:
                await self._send.send(ended)
                continue
            self._unpin(run)
            if run.checkpoint is not None:
                run.checkpoint.scope.cancel()
            handoff = run.checkpoint is not None and ended.detail == "handoff"
            if not handoff and not (run.spec.outputs and ended.succeeded):
                self.runs.pop(run.task_id, None)
                await self._send.send(ended)
                continue
            run.stop, run.scope = "outputs", trio.CancelScope()
            assert self._nursery is not None
            self._nursery.start_soon(self._handoff if handoff else self._finish, run, ended)

    async def _handoff(self, run: _Run, ended: TaskExited) -> None:
        """A drain stopped the process: snapshot its checkpoint dir (the lease is still
        ours until the end is posted), then hand the end on."""
        assert run.checkpoint is not None
        with run.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_fence, run)
                await self.checkpoints_of().snapshot(run.checkpoint)
                nursery.cancel_scope.cancel()
        self.runs.pop(run.task_id, None)
        await self._send.send(ended)

    async def _finish(self, run: _Run, ended: TaskExited) -> None:
        """Store and replicate the outputs, then hand the end on (with them, or as a
        failure saying why, or as the stop that came meanwhile)."""
        out: TaskExited | None = None
        failure = ""
        with run.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_fence, run)
                try:
                    outputs, notes = await self._store_outputs(run)
                    with trio.fail_after(REPLICATE_TIMEOUT):
                        holders = await self.replicate(run.task_id, run.epoch, run.spec, outputs)
                    tail = (ended.stdout_tail + notes.encode())[-200:]
                    out = attrs.evolve(ended, outputs=tuple(outputs), holders=tuple(holders),
                                       stdout_tail=tail)  # fmt: skip
                except (OutputError, OSError, ValueError, LookupError) as exc:
                    failure = f"outputs: {exc}"
                except trio.TooSlowError:
                    failure = f"outputs: not held by k members in {REPLICATE_TIMEOUT:.0f} s"
                nursery.cancel_scope.cancel()
        self.runs.pop(run.task_id, None)
        if out is None and run.stop not in ("", "outputs"):
            out = attrs.evolve(ended, reason="cancelled", detail=run.stop)
        elif out is None:
            self.stats["outputs_refused"] += 1
            out = attrs.evolve(ended, reason="outputs", exit_code=1, detail=failure)
        event(_log, 20, "artifacts.ended", task=run.task_id, epoch=run.epoch,
              outputs=len(out.outputs), holders=len(out.holders), why=out.detail)  # fmt: skip
        await self._send.send(out)

    async def _store_outputs(self, run: _Run) -> tuple[list[TaskOutput], str]:
        """Each declared output as a blob here, pinned for the retention; a missing one
        is noted (one line each) and left out."""
        blobs = await self._blob_service()
        work = self.work_dir(run.task_id, run.epoch)
        outputs: list[TaskOutput] = []
        notes = ""
        pin = output_pin(run.task_id, time.time() + self._retention)
        for path in run.spec.outputs:
            tmp = blobs.store.root / "partial" / f"out-{run.task_id}-{run.epoch}.tar"
            try:
                entry, unpack = await trio.to_thread.run_sync(
                    _add_output, blobs, work, path, tmp, run.task_id
                )
            except OutputError as exc:
                notes += f"\n[populi] output {exc}"
                continue
            blobs.store.pin(entry.digest, pin)
            outputs.append(TaskOutput(path, entry.hex, entry.size, unpack))
            self.stats["outputs_stored"] += 1
        if not outputs:
            raise OutputError(f"none of the declared outputs could be stored{notes}")
        return outputs, notes


def _checkpoint_env(run: CheckpointRun, work: Path) -> dict[str, str]:
    """``$POPULI_CHECKPOINT_DIR``, and ``$POPULI_RESUMED_FROM`` when one was restored."""
    from .checkpoints import CHECKPOINT_DIR

    env = {"POPULI_CHECKPOINT_DIR": str(work / CHECKPOINT_DIR)}
    if run.restored is not None:
        env["POPULI_RESUMED_FROM"] = str(run.restored.taken_in)
    return env


def output_pin(task_id: str, expires: float) -> str:
    """The pin that keeps a task's outputs until `expires` (realtime seconds)."""
    return f"out:{task_id}:{int(expires)}"


def _add_output(blobs: BlobService, work: Path, path: str, tmp: Path, task_id: str) -> Any:
    """(the blob entry, whether a directory's tar) of one output (a worker thread)."""
    with open_output(work, path, tmp) as (source, unpack):
        name = f"{task_id[:16]}-{path.replace('/', '_')}"[:64]
        return blobs.store.add_file(source, name, OUTPUT_KIND), unpack


def artifact_runner(
    inner: TaskRunner, *, state_dir: Path, me: str, blobs: Callable[[], BlobService | None],
    service: Callable[[], Replicator | None], retention: float,
    table: Callable[[], CheckpointTable | None],
) -> ArtifactRunner:  # fmt: skip
    """The node's task runner: inputs, outputs and checkpoints around `inner`."""
    from .checkpoints import Checkpointer

    def replicator() -> Replicator:
        artifacts = service()
        if artifacts is None:
            raise LookupError("the node is still starting")
        return artifacts

    def leases() -> CheckpointTable:
        found = table()
        if found is None:
            raise LookupError("the node is still starting")
        return found

    async def replicate(
        tid: str, epoch: int, spec: TaskSpec, outputs: list[TaskOutput]
    ) -> list[str]:
        return await replicator().replicate(tid, epoch, spec, outputs)

    async def sources(spec: TaskSpec, sha256: str) -> list[str]:
        return await replicator().sources(spec, sha256)

    async def replicate_checkpoint(
        tid: str, epoch: int, spec: TaskSpec, outputs: list[TaskOutput]
    ) -> list[str]:
        return await replicator().replicate(tid, epoch, spec, outputs, checkpoint=True)

    async def record(tid: str, checkpoint: Checkpoint) -> None:
        await leases().record_checkpoint(tid, checkpoint)

    checkpoints = Checkpointer(
        me=me, blobs=blobs, latest=lambda tid: leases().latest_checkpoint(tid), record=record,
        replicate=replicate_checkpoint,
    )  # fmt: skip
    return ArtifactRunner(
        inner, tasks_dir=state_dir / "tasks", me=me, blobs=blobs, replicate=replicate,
        retention=retention, checkpoints=checkpoints, sources=sources,
    )  # fmt: skip
