"""The lease service: the node's replica of the lease table, the owner election, and the
tasks this node runs.

Events in: membership events (who is gone, whose record changed), lease deltas and
submit acks on the application channel (`AppKind.LEASES`, `AppKind.LEASE_ACK`), the
push-pull section (`LeaseSection`), and the runner's `TaskExited`. Commands out: every
local delta is persisted (SQLite, WAL, synced, through the table's `persist`) before it
is broadcast; `runner.start/stop`; GPU allocations (Layer B shrinks while a task runs);
the draining status of our signed record. Queries: `rows`, `detail`, `explain`.

The election follows `leases.election`: every node places each task needing an owner
over its own view; the top-ranked one claims the next epoch, waits `settle_time`,
starts only if its claim stands, and stops at once if it loses. A lease whose owner
SWIM declares dead or left, or that has not been renewed for `lease_ttl` on our own
clock, is re-placed at the next epoch without the old owner. The owner renews every
`lease_renew_interval` and posts the signed result of its epoch when the process ends.
Placing and claiming live in `lease_claims`, what owning a task does in `lease_host`.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import trio

from swim import AppMessage, Event, Member, MemberState

from .._log import event, get_logger
from ..identity import NodeIdentity, verify_signature
from ..leases import (
    LeaseConfig,
    LeaseError,
    LeaseEvent,
    LeaseExpired,
    LeaseTable,
    TableStalled,
    TaskChanged,
    TaskCompacted,
    TaskEntry,
)
from ..leases.election import replacement_epoch
from ..leases.store import LeaseStore
from ..record import NodeRecord
from .app_channel import AppChannel, AppKind
from .lease_acks import ACKERS_MIN, SubmitAcks, ackers
from .lease_claims import LeaseClaims
from .lease_gossip import DeltaGossip
from .lease_host import LeaseHost
from .lease_view import (
    LeaseSection,
    entry_detail,
    entry_row,
    explain_view,
    find_entry,
    spec_from,
)
from .task_runner import TaskRunner

__all__ = ["ACK_TIMEOUT", "LeaseService", "SubmitError"]

#: Signature context of lease-table parts (specs, claims, progress, cancels).
LEASE_CONTEXT: Final = b"populi/lease/v1"
#: How long `submit` waits for its acknowledgements, seconds.
ACK_TIMEOUT: Final = 10.0
#: Pending tasks are placed again at least this often (views change without events).
PLACE_INTERVAL: Final = 1.0
#: Seconds after a start during which the stored table is loaded again as records
#: arrive (a part signed by another node verifies only once its record is known).
RELOAD_WINDOW: Final = 120.0

_log = get_logger("leases")
_GONE: Final = (MemberState.DEAD, MemberState.LEFT)


class SubmitError(TimeoutError):
    """`submit` could not be acknowledged as asked (one line for the API)."""


class LeaseService:
    """Args:
    config: the lease preset matched to the swim preset.
    identity: signs our claims, results, cancels and acks.
    store_path: ``STATE_DIR/leases.sqlite3`` (created 0600).
    runner: runs the processes (`TaskRunner`).
    channel: the application channel (kinds registered here).
    submit_acks: other members that must persist a submitted task before `submit`
        returns (capped at the live peers; 0 on a one-node mesh).
    """

    def __init__(
        self,
        config: LeaseConfig,
        identity: NodeIdentity,
        store_path: Path,
        *,
        runner: TaskRunner,
        channel: AppChannel,
        submit_acks: int = 1,
        ack_timeout: float = ACK_TIMEOUT,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.me = identity.node_id
        self._identity = identity
        self._runner = runner
        self._channel = channel
        self._submit_acks = submit_acks
        self._ack_timeout = ack_timeout
        fd = os.open(store_path, os.O_CREAT | os.O_RDWR, 0o600)
        os.close(fd)
        self._store = LeaseStore(store_path)
        self.table = LeaseTable(
            config, self.me, lambda data: identity.sign(LEASE_CONTEXT, data), self._verify,
            persist=self._store.put, forget=self._store.delete,
        )  # fmt: skip
        self.section = LeaseSection(self.table, self._handle, trio.current_time)
        self._members: Callable[[], list[Member]] = list
        self._record_of: Callable[[str], NodeRecord | None] = lambda _n: None
        self._allocate: Callable[[list[tuple[str, int]]], None] = lambda _a: None
        self._set_draining: Callable[[bool], Awaitable[None]] | None = None
        self.draining = False
        self._wake = trio.Event()
        self._acks = SubmitAcks(
            identity, channel, lambda node: self._record_of(node),
            interval=config.lease_renew_interval, span=config.lease_ttl,
        )  # fmt: skip
        self._host = LeaseHost(
            config, self.table, self.me, runner, record_of=lambda n: self._record_of(n),
            allocate=lambda a: self._allocate(a), gossip=self._gossip, local=self._local,
        )  # fmt: skip
        self._place_at = 0.0
        self._deltas = DeltaGossip(channel, config.lease_renew_interval, config.lease_ttl)
        self._claims = LeaseClaims(
            config, self.table, self.me, rng if rng is not None else random.Random(),
            members=lambda: self._members(), record_of=lambda n: self._record_of(n),
            draining=lambda: self.draining, gossip=self._gossip, local=self._local,
            recheck_at=self._recheck_at,
        )  # fmt: skip
        self._reload: list[TaskEntry] = []
        self._reload_at = self._reload_until = 0.0

    def attach(
        self,
        *,
        members: Callable[[], list[Member]],
        record_of: Callable[[str], NodeRecord | None],
        allocate: Callable[[list[tuple[str, int]]], None],
        set_draining: Callable[[bool], Awaitable[None]],
    ) -> None:
        """Membership and record queries; GPU allocations; our record's draining flag."""
        self._members, self._record_of = members, record_of
        self._allocate, self._set_draining = allocate, set_draining

    def _verify(self, node: str, data: bytes, sig: bytes) -> bool:
        if node == self.me:
            key = self._identity.public_key
        else:
            record = self._record_of(node)
            if record is None:
                return False
            key = record.public_key
        return verify_signature(key, LEASE_CONTEXT, data, sig)

    ####################################################################################
    # Running

    async def run(
        self,
        events: trio.MemoryReceiveChannel[Event],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        now = trio.current_time()
        entries, bad = self._store.load()
        self.table.load(entries, now)
        self._reload, self._reload_until = entries, now + RELOAD_WINDOW
        if bad:
            event(_log, 30, "leases.corrupt_rows", skipped=bad)
        self._channel.register(AppKind.LEASES, self._on_delta, self.section)
        self._channel.register(AppKind.LEASE_ACK, self._acks.on_ack)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, events)
                nursery.start_soon(self._exits)
                # Leases we held before a restart: the processes died with us; hand them
                # back so the next epoch re-places them (a node-side loss, not a retry).
                for e in self.table.held_by(self.me):
                    delta = self.table.release(e.task_id, now)
                    await self._gossip(f"l/{e.task_id}/{e.epoch}", delta)
                task_status.started()
                await self._loop()
        finally:
            self._store.close()

    async def _watch(self, events: trio.MemoryReceiveChannel[Event]) -> None:
        async for _ev in events:
            self._wake.set()

    async def _exits(self) -> None:
        async for exited in self._runner.exits:
            await self._host.on_exit(exited, trio.current_time())
            self._wake.set()

    async def _loop(self) -> None:
        while True:
            now = trio.current_time()
            deadline = now + PLACE_INTERVAL
            table_due = self.table.next_deadline()
            if table_due is not None and table_due > now:  # expired leases: handled below
                deadline = min(deadline, table_due)
            if self._host.running:
                deadline = min(deadline, self._host.renew_at)
            if self._deltas.pending:
                deadline = min(deadline, self._deltas.due)
            for _epoch, at in self._claims.settling.values():
                deadline = min(deadline, at + self.config.settle_time)
            with trio.move_on_at(deadline):
                await self._wake.wait()
            self._wake = trio.Event()
            await self._step(trio.current_time())

    def _recheck_at(self, when: float) -> None:
        self._place_at = min(self._place_at, when)

    async def _gossip(self, key: str, delta: bytes) -> None:
        await self._deltas.send(key, delta, trio.current_time())

    def _local(self, op: Callable[..., bytes], *args: Any) -> bytes | None:
        """A local table operation whose precondition may have lapsed while we awaited
        (a delta superseded our claim meanwhile): skipped and logged, never a crash."""
        try:
            return op(*args)
        except LeaseError as exc:
            event(_log, 20, "lease.skipped", op=op.__name__, reason=str(exc))
            return None

    def _handle(self, events: list[LeaseEvent]) -> None:
        """Events from a remote delta or a sync: queue acks for specs now on disk."""
        for ev in events:
            if not isinstance(ev, TaskChanged):
                continue
            spec = ev.entry.spec
            if (
                spec is not None
                and spec.submitted_by != self.me
                and self._acker(ev.task_id, spec.submitted_by)
            ):
                self._acks.persisted(ev.task_id)
            if ev.entry.needs_owner():
                self._place_at = 0.0  # place it now, not at the next interval
        if events:
            self._wake.set()

    def _acker(self, task_id: str, submitter: str) -> bool:
        """Whether we are one of the few members that ack this task (`lease_acks`)."""
        live = [m.name for m in self._members() if m.state not in _GONE] + [self.me]
        count = max(ACKERS_MIN, 2 * self._submit_acks)
        return self.me in ackers(task_id, live, submitter, count)

    async def _on_delta(self, message: AppMessage, body: bytes) -> None:
        events = self.table.apply(body, trio.current_time())
        if any(isinstance(e, TaskChanged) for e in events):
            # New to us: pass it on (the core does not re-gossip application broadcasts).
            await self._deltas.relay(message.key, body)
        self._handle(events)
        await self._acks.flush(trio.current_time())

    async def _step(self, now: float) -> None:
        await self._acks.flush(now)
        if self._reload and now >= self._reload_at:
            # Parts signed by others verify only once their records are known: load the
            # disk copy again as records arrive (merging is idempotent; nothing is lost
            # from the file meanwhile), for `RELOAD_WINDOW` after the start.
            self._reload_at = now + PLACE_INTERVAL
            self.table.load(self._reload, now)
            if now >= self._reload_until:
                self._reload = []
        await self._deltas.echo(now)
        gone = {m.name for m in self._members() if m.state in _GONE}
        for ev in self.table.tick(now, gone):
            if isinstance(ev, LeaseExpired):
                entry = self.table.get(ev.task_id)
                epoch = None if entry is None else replacement_epoch(entry, ev)
                if entry is not None and epoch is not None:
                    await self._claims.try_claim(entry, epoch, now, exclude={ev.owner})
            elif isinstance(ev, TableStalled):
                event(_log, 20, "leases.stalled", gap=round(ev.gap, 3))
                self._claims.hold(ev.until)
            elif isinstance(ev, TaskCompacted):
                self._acks.forget(ev.task_id)
                self._claims.why.pop(ev.task_id, None)
        for entry, epoch in self._claims.settled(now):
            await self._host.start(entry, epoch, now)
        await self._host.check(now)
        if now >= self._place_at:
            self._place_at = now + PLACE_INTERVAL
            await self._claims.place_pending(now)

    ####################################################################################
    # Commands (the API)

    async def submit(self, spec_fields: dict[str, Any]) -> dict[str, Any]:
        """Accept a task here; return once it is on our disk and acknowledged.

        Raises:
            ValueError: a bad spec (one line); nothing is stored.
            SubmitError: stored, but too few members acknowledged in time.
        """
        spec = spec_from(spec_fields, self.me, time.time())
        live = [m for m in self._members() if m.name != self.me and m.state not in _GONE]
        needed = min(self._submit_acks, len(live))
        tid, delta = self.table.submit(spec, trio.current_time())
        self._acks.expect(tid)
        await self._gossip(f"s/{tid}", delta)
        self._place_at = 0.0
        self._wake.set()
        acked = await self._acks.wait(tid, needed, self._ack_timeout)
        if acked < needed:
            raise SubmitError(
                f"task {tid} is stored on this node, but only {acked} of {needed} members"
                f" acknowledged it within {self._ack_timeout:.0f} s (it may still spread;"
                f" see populi-node task {tid})"
            )
        return {"id": tid, "acks": acked}

    async def cancel(self, task_id: str) -> dict[str, Any]:
        if self.table.get(task_id) is None:
            raise KeyError(f"no task {task_id} here (see populi-node tasks)")
        await self._gossip(f"c/{task_id}", self.table.cancel(task_id, trio.current_time()))
        self._wake.set()
        return {"id": task_id, "cancelled": True}

    async def drain(self, handoff: bool) -> dict[str, Any]:
        self.draining = True
        if self._set_draining is not None:
            await self._set_draining(True)
        if handoff:
            self._host.handoff()
        return {"draining": True, "handoff": handoff, "running": len(self._host.running)}

    async def undrain(self) -> dict[str, Any]:
        self.draining = False
        if self._set_draining is not None:
            await self._set_draining(False)
        self._wake.set()
        return {"draining": False}

    ####################################################################################
    # Queries

    def find(self, task_id: str) -> TaskEntry:
        """An entry by id or unique id prefix. Raises `KeyError` (one line)."""
        return find_entry(self.table, task_id)

    def rows(self) -> list[dict[str, Any]]:
        now = time.time()
        rows = [entry_row(e, self._why_of(e), now) for e in self.table]
        return sorted(rows, key=lambda r: (-(r["age"] or 0), r["id"]))

    def detail(self, task_id: str) -> dict[str, Any]:
        entry = self.find(task_id)
        return entry_detail(entry, self._why_of(entry))

    def explain(self, task_id: str) -> dict[str, Any]:
        entry = self.find(task_id)
        return explain_view(entry, self._claims.why.get(entry.task_id))

    def summary(self) -> dict[str, Any]:
        """``status``'s tasks section; ``stale_results_rejected`` counts results of
        superseded epochs fenced out (a late result from a lost owner)."""
        return {
            "draining": self.draining,
            "running": len(self._host.running),
            "known": len(self.table),
            "stale_results_rejected": self.table.statistics().stale_results_rejected,
        }

    def _why_of(self, entry: TaskEntry) -> str | None:
        return self._claims.why.get(entry.task_id) if entry.needs_owner() else None
