"""The tasks this node owns: start them, renew their leases, stop them when the table
says so, and post the signed result of each epoch (split from the lease service).

Events in: a claim that settled (`start`), the runner's `TaskExited` (`on_exit`), the
service's steps (`check`). Commands out: `runner.start/stop`, GPU allocations (Layer B
shrinks while a task runs), lease deltas (running, renewals, results, releases)
through the service's `gossip`. The service's election decides *whether* we own a
task; this decides what owning it does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .._log import event, get_logger
from ..leases import LeaseConfig, LeaseTable, TaskEntry
from ..leases.election import claim_stands, must_stop
from ..record import NodeRecord
from .lease_view import pick_gpus
from .task_results import result_of
from .task_runner import TaskExited, TaskRunner

__all__ = ["LeaseHost"]

_log = get_logger("leases")


class LeaseHost:
    """Args:
    config, table, me: the lease service's.
    runner: runs the processes.
    record_of: our own signed record (for the GPUs we may allocate).
    allocate: the GPU allocations of everything running here, each time they change.
    gossip: persist-then-broadcast of a local delta (`key`, `delta`).
    local: a local table operation that may have lapsed (None, logged) or a delta.
    """

    def __init__(
        self,
        config: LeaseConfig,
        table: LeaseTable,
        me: str,
        runner: TaskRunner,
        *,
        record_of: Callable[[str], NodeRecord | None],
        allocate: Callable[[list[tuple[str, int]]], None],
        gossip: Callable[[str, bytes], Awaitable[None]],
        local: Callable[..., bytes | None],
    ) -> None:
        self.config, self.table, self.me, self.runner = config, table, me, runner
        self._record_of, self._allocate = record_of, allocate
        self._gossip, self._local = gossip, local
        self.running: dict[str, int] = {}  # started here: epoch
        self.renew_at = 0.0
        self._held: dict[str, list[tuple[str, int]]] = {}  # task -> (gpu uuid, vram)

    async def start(self, entry: TaskEntry, epoch: int, now: float) -> None:
        """Our claim settled: allocate GPUs, mark the epoch running, start the process."""
        tid, spec = entry.task_id, entry.spec
        assert spec is not None
        busy = {uuid for held in self._held.values() for uuid, _ in held}
        gpus = pick_gpus(self._record_of(self.me), busy, spec.requirements)
        if gpus is None:  # our view moved since placement: hand it back at once
            delta = self._local(self.table.release, tid, now)
            if delta is not None:
                await self._gossip(f"l/{tid}/{epoch}", delta)
            return
        delta = self._local(self.table.mark_running, tid, now)
        if delta is None:
            return
        await self._gossip(f"l/{tid}/{epoch}", delta)
        self.running[tid] = epoch
        self.renew_at = min(self.renew_at, now + self.config.lease_renew_interval)
        self._held[tid] = gpus
        self._allocate([a for held in self._held.values() for a in held])
        event(_log, 20, "task.started", task=tid, epoch=epoch, gpus=len(gpus))
        self.runner.start(tid, epoch, spec, [uuid for uuid, _ in gpus])

    async def check(self, now: float) -> None:
        """Stop what we no longer own (cancelled, superseded); renew what we still do."""
        for tid, epoch in list(self.running.items()):
            entry = self.table.get(tid)
            if entry is None or must_stop(entry, self.me, epoch):
                cancelled = entry is not None and entry.cancel is not None
                self.runner.stop(tid, "cancelled" if cancelled else "superseded")
                del self.running[tid]
        if self.running and now >= self.renew_at:
            self.renew_at = now + self.config.lease_renew_interval
            for tid, epoch in list(self.running.items()):
                delta = self._local(self.table.renew, tid, now)
                if delta is not None:
                    await self._gossip(f"l/{tid}/{epoch}", delta)

    def handoff(self) -> None:
        """Stop everything running here; each epoch is released, not failed."""
        for tid in list(self.running):
            self.runner.stop(tid, "handoff")

    async def on_exit(self, exited: TaskExited, now: float) -> None:
        """Free what the task held; post its result, or release a node-side loss."""
        tid = exited.task_id
        if self.running.get(tid) == exited.epoch:
            del self.running[tid]
        if self._held.pop(tid, None):
            self._allocate([a for held in self._held.values() for a in held])
        event(_log, 20, "task.exited", task=tid, epoch=exited.epoch, code=exited.exit_code,
              reason=exited.reason, detail=exited.detail)  # fmt: skip
        entry = self.table.get(tid)
        if entry is None or not claim_stands(entry, self.me, exited.epoch):
            return  # cancelled or superseded: our result would be fenced out anyway
        handoff = exited.reason == "cancelled" and exited.detail == "handoff"
        delta: Any
        if handoff or exited.reason == "shutdown":
            # Not the task's doing: re-placed at the next epoch, no retry counted.
            delta = self.table.release(tid, now)
        else:
            delta = self.table.post_result(tid, result_of(exited), now)
        await self._gossip(f"l/{tid}/{exited.epoch}", delta)
