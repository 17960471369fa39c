"""`Checkpointer`: a task's checkpoint dir, snapshotted on its owner and restored on the
next one (docs/artifacts.md, "Checkpoints").

A task submitted with ``--checkpoint`` or ``--checkpoint-every`` finds an empty (or
restored) directory at ``$POPULI_CHECKPOINT_DIR``, and ``$POPULI_RESUMED_FROM`` (the
epoch whose run wrote the snapshot) when it was restored. On the owner:

* **Snapshot**: when the task touches ``$POPULI_CHECKPOINT_DIR/.request`` (the owner
  removes it as it takes the snapshot: a task that waits for it to go knows one was
  taken), every ``checkpoint_every`` seconds, and after the process ended on a handoff
  drain. The dir is packed as one reproducible tar without following any link
  (`files.open_output`), stored as a blob (pinned ``ckpt:<task>``), held by k members
  (`ArtifactService.replicate`, the same k and the same checks as outputs), then
  recorded under the owner's epoch, signed, in the lease table (`Checkpoint`: only the
  latest is kept). A snapshot identical to the last one recorded is not sent again.
* **Restore**, before the start: the latest record's blob is fetched from its holders
  (whole hash checked), pinned, and unpacked into the checkpoint dir; then the owner
  records, under its own epoch, what it restored (or that it restored nothing), so a
  late snapshot of an earlier epoch is refused everywhere. A restore whose fetch fails
  is a failed start (tried again, elsewhere), as for an input.

A snapshot is only taken while the lease is live on our clock, and the table refuses a
record for an epoch we no longer hold. What is in the dir when the owner packs it is
what is kept: write a file fully, then rename it into the dir, then ask.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from .._log import event, get_logger
from ..leases import Checkpoint, LeaseError, TaskOutput, TaskSpec
from ..leases._entry import OUTPUT_HOLDERS_MAX
from .files import OutputError, extract_tar, open_output

if TYPE_CHECKING:
    from ..blobs.service import BlobService

__all__ = [
    "CHECKPOINT_DIR",
    "CHECKPOINT_KIND",
    "CHECKPOINT_PIN",
    "REQUEST_FILE",
    "CheckpointRun",
    "Checkpointer",
]

#: The task's checkpoint dir, in its work dir (``$POPULI_CHECKPOINT_DIR``).
CHECKPOINT_DIR: Final = "checkpoint"
#: The file a task touches (in its checkpoint dir) to ask for a snapshot.
REQUEST_FILE: Final = ".request"
#: Blob kind of snapshots (never advertised: the table names the holders).
CHECKPOINT_KIND: Final = "checkpoint"
#: Pin of a task's snapshots, on the owner and the holders, until the task finished.
CHECKPOINT_PIN: Final = "ckpt:"
#: Seconds between looks for the request file.
POLL_EVERY: Final = 0.05
#: Seconds one snapshot may take (pack, store, held by k, recorded) before it is
#: given up (counted; the next one tries again).
SNAPSHOT_TIMEOUT: Final = 60.0
_log = get_logger("artifacts")

#: ``replicate(task, epoch, spec, [the snapshot]) -> holders`` (us first).
Replicate = Callable[[str, int, TaskSpec, list[TaskOutput]], Awaitable[list[str]]]


@attrs.define
class CheckpointRun:
    """One epoch of a checkpointed task on its owner."""

    task_id: str
    epoch: int
    spec: TaskSpec
    work: Path
    #: The record restored at the start (None: nothing was).
    restored: Checkpoint | None = None
    seq: int = 0  # of the last record made
    sha256: str = ""  # of the last snapshot recorded (or restored)
    pinned: str = ""  # our own snapshot pinned last (unpinned when superseded)
    deadline: float | None = None  # the lease's end on `time.monotonic()`
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


class Checkpointer:
    """Args:
    me: this node's id.
    blobs: the blob service, once it runs.
    latest: the lease table's checkpoint record of a task.
    record: records one of ours (`LeaseService.record_checkpoint`; raises LeaseError).
    replicate: has a snapshot held by k members.
    """

    def __init__(
        self, *, me: str, blobs: Callable[[], BlobService | None],
        latest: Callable[[str], Checkpoint | None],
        record: Callable[[str, Checkpoint], Awaitable[None]], replicate: Replicate,
    ) -> None:  # fmt: skip
        self._me = me
        self._blobs = blobs
        self._latest = latest
        self._record = record
        self._replicate = replicate
        self.stats = dict.fromkeys(
            ("checkpoints_taken", "checkpoints_restored", "checkpoints_failed"), 0
        )

    def _store(self) -> BlobService:
        blobs = self._blobs()
        if blobs is None:
            raise LookupError("the node is still starting")
        return blobs

    ####################################################################################
    # Restore (before the start)

    async def restore(self, run: CheckpointRun, staging: Path) -> None:
        """Fetch the latest snapshot of an earlier epoch into `staging` (made here, even
        when there is nothing to restore), pinned; then record what we start from.

        Raises:
            FetchError, QuotaError, OutputError, LookupError: the snapshot could not
                be had (a failed start).
        """
        ck = self._latest(run.task_id)
        await trio.to_thread.run_sync(_clear, staging)
        staging.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
        if ck is None or not ck.sha256 or ck.epoch >= run.epoch:
            staging.mkdir(mode=0o755)
            await self._record_start(run, None)
            return
        blobs = self._store()
        began = time.monotonic()
        digest = bytes.fromhex(ck.sha256)
        holders = [h for h in ck.holders if h != self._me]
        held = blobs.store.get(digest)
        local = held is not None and held.complete
        await blobs.fetch(digest, holders, name=f"{run.task_id[:16]}-ckpt", kind=CHECKPOINT_KIND)
        blobs.store.pin(digest, CHECKPOINT_PIN + run.task_id)
        path = blobs.store.path(digest)
        if path is None:
            raise LookupError("the checkpoint vanished from the store after its fetch")
        await trio.to_thread.run_sync(extract_tar, path, staging)
        (staging / REQUEST_FILE).unlink(missing_ok=True)
        run.restored, run.sha256, run.pinned = ck, ck.sha256, ck.sha256
        self.stats["checkpoints_restored"] += 1
        event(_log, 20, "checkpoint.restored", task=run.task_id, epoch=run.epoch,
              taken_in=ck.taken_in, size=ck.size,
              seconds=round(time.monotonic() - began, 4), local=local)  # fmt: skip
        await self._record_start(run, ck)

    async def _record_start(self, run: CheckpointRun, ck: Checkpoint | None) -> None:
        """Record under our epoch what we restored (or nothing): a late snapshot of an
        earlier epoch is then older than the record every replica holds."""
        if ck is None:
            start = Checkpoint(run.epoch, 0, self._me)
        else:
            holders = list(dict.fromkeys([self._me, *ck.holders]))[:OUTPUT_HOLDERS_MAX]
            start = Checkpoint(run.epoch, 0, self._me, ck.sha256, ck.size, holders, ck.taken_in)
        try:
            await self._record(run.task_id, start)
        except LeaseError as exc:  # the lease moved on meanwhile: the start is stopped
            event(_log, 30, "checkpoint.start_not_recorded", task=run.task_id, why=str(exc))

    @staticmethod
    def place(staging: Path, work: Path) -> Path:
        """Move the staged dir into the work dir, owned like the work dir (the task's
        user); no checkpoint comes between this and the process's first step."""
        target = work / CHECKPOINT_DIR
        os.rename(staging, target)
        st = os.stat(work)
        for root, dirs, files in os.walk(target):
            for name in (root, *(os.path.join(root, n) for n in dirs + files)):
                os.chown(name, st.st_uid, st.st_gid, follow_symlinks=False)
        return target

    ####################################################################################
    # Snapshots (while the process runs, and after it on a handoff)

    async def watch(self, run: CheckpointRun) -> None:
        """Take a snapshot when the task asks and every ``checkpoint_every`` seconds,
        until cancelled (the process ended)."""
        every = run.spec.checkpoint_every or 0.0
        due = time.monotonic() + every if every > 0 else None
        request = run.work / CHECKPOINT_DIR / REQUEST_FILE
        with run.scope:
            while True:
                await trio.sleep(POLL_EVERY)
                asked = await trio.to_thread.run_sync(_take_request, request)
                now = time.monotonic()
                if asked or (due is not None and now >= due):
                    await self.snapshot(run)
                    due = time.monotonic() + every if every > 0 else None

    async def snapshot(self, run: CheckpointRun) -> bool:
        """Pack, store, have held by k members and record the dir now; False (counted,
        logged) when that failed or the lease is no longer ours."""
        from ..blobs.store import QuotaError

        if run.deadline is not None and time.monotonic() >= run.deadline:
            return False
        why = ""
        try:
            with trio.fail_after(SNAPSHOT_TIMEOUT):
                await self._snapshot(run)
            return True
        except (OutputError, OSError, ValueError, LookupError, QuotaError) as exc:
            why = str(exc) or type(exc).__name__
        except trio.TooSlowError:
            why = f"not held and recorded within {SNAPSHOT_TIMEOUT:.0f} s"
        self.stats["checkpoints_failed"] += 1
        event(_log, 30, "checkpoint.failed", task=run.task_id, epoch=run.epoch, why=why[:200])
        return False

    async def _snapshot(self, run: CheckpointRun) -> None:
        blobs = self._store()
        tmp = blobs.store.root / "partial" / f"ckpt-{run.task_id}-{run.epoch}.tar"
        entry = await trio.to_thread.run_sync(_pack, blobs, run.work, tmp, run.task_id)
        if entry.hex == run.sha256:
            return  # unchanged since the last record
        pin = CHECKPOINT_PIN + run.task_id
        blobs.store.pin(entry.digest, pin)
        snapshot = TaskOutput(CHECKPOINT_DIR, entry.hex, entry.size, True)
        try:
            holders = await self._replicate(run.task_id, run.epoch, run.spec, [snapshot])
            record = Checkpoint(run.epoch, run.seq + 1, self._me, entry.hex, entry.size,
                                holders[:OUTPUT_HOLDERS_MAX], run.epoch)  # fmt: skip
            await self._record(run.task_id, record)
        except BaseException:
            if entry.hex != run.pinned:
                blobs.store.unpin(entry.digest, pin)
            raise
        if run.pinned and run.pinned != entry.hex:
            blobs.store.unpin(bytes.fromhex(run.pinned), pin)
        run.seq, run.sha256, run.pinned = run.seq + 1, entry.hex, entry.hex
        self.stats["checkpoints_taken"] += 1
        event(_log, 20, "checkpoint.recorded", task=run.task_id, epoch=run.epoch,
              seq=run.seq, size=entry.size, holders=len(holders))  # fmt: skip


def _clear(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _take_request(request: Path) -> bool:
    """Whether the task asked for a snapshot (the request is consumed)."""
    try:
        os.unlink(request)
    except FileNotFoundError:
        return False
    except OSError:  # not a file we may remove (a directory, say): ignored, not asked
        return False
    return True


def _pack(blobs: BlobService, work: Path, tmp: Path, task_id: str) -> Any:
    """The checkpoint dir as a blob, read without following links (a worker thread)."""
    with open_output(work, CHECKPOINT_DIR, tmp) as (source, unpack):
        if not unpack:
            raise OutputError(f"{CHECKPOINT_DIR} is not a directory")
        return blobs.store.add_file(source, f"{task_id[:16]}-ckpt", CHECKPOINT_KIND)
