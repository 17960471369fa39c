"""The lease service: the trio driver of this node's `LeaseAgent`, and its queries.

All the rules of ownership live in `populi_p2p.leases.agent` (sans-IO, the same object
the simulator drives). This service only carries its commands out and feeds it input:

* **In:** agent messages (`AppKind.LEASE_AGENT`, sent to one member with swim's
  `send_app`), lease-table deltas (`AppKind.LEASES`) and the push-pull section
  (`LeaseSection`), the executor's `TaskExited`, and time (`tick` at
  `next_deadline`, and whenever membership changes).
* **Out:** `SendTo` and `Gossip` on the channel; `StartTask`, `FenceTask`, `StopTask`
  to the executor (deadlines turned into `time.monotonic()` values, which the task's
  wrapper enforces by itself); GPU allocations (Layer B shrinks while a task runs);
  `Acknowledged` wakes the `submit` or `cancel` that waits for it.
* **Durability:** `STATE/leases.sqlite3` (0600): the table's entries and the granter
  records, committed before anything that follows from them leaves (`_flusher`: a
  group commit, one fsync per batch, in a worker thread).
* **Restart:** the executor first kills whatever a previous run left (`reap_leftovers`);
  then the agent loads its records and releases the epochs it held, and proposes
  nothing until `READY_AFTER` has passed (records of the others arrive meanwhile).
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Final

import trio

from swim import AppMessage, Event, Member, MemberState

from ..._log import event, get_logger
from ...api import ConflictError, ForbiddenError
from ...executor.results import result_of
from ...executor.runner import TaskExited, TaskRunner
from ...observe.sources import TaskStatistics
from ...services.app_channel import AppChannel, AppKind
from ...trust.identity import NodeIdentity, verify_signature
from ...trust.record import NodeRecord
from .. import (
    Checkpoint,
    LeaseConfig,
    LeaseEvent,
    LeaseTable,
    TaskChanged,
    TaskEntry,
    TaskPhase,
    TaskResult,
    TaskSpec,
)
from .._cancel import OperatorCheck, OperatorProof, no_operators
from .._entry import CHECKPOINT_REFUSALS, Phase
from ..agent import LeaseAgent
from ..agent_commands import (
    Acknowledged,
    AgentCommand,
    FenceTask,
    Gossip,
    SendTo,
    StartTask,
    StopTask,
)
from ..grants import Refusal
from ..placement import Candidate
from ..reliability import prior_reliability
from ..store import LeaseStore
from .trace import LeaseTrace
from .view import (
    LeaseSection,
    build_candidates,
    entry_detail,
    entry_row,
    explain_view,
    find_entry,
    pick_gpus,
    spec_from,
)

__all__ = ["ACK_TIMEOUT", "LeaseService", "SubmitError", "hands_back"]

#: Signature context of lease-table parts and agent messages.
LEASE_CONTEXT: Final = b"populi/lease/v1"
#: How long `submit` and `cancel` wait for a majority of the task's replicas, seconds.
ACK_TIMEOUT: Final = 10.0
#: Seconds after a start before the agent proposes anything: the records of the
#: members it knows arrive meanwhile, so it places over a verified view.
READY_AFTER: Final = 1.0
#: Seconds after a start during which the stored table is loaded again as records
#: arrive (a part signed by another node verifies only once its record is known).
RELOAD_WINDOW: Final = 120.0
#: Stop reasons that hand the epoch back rather than end the task.
_RELEASES: Final = ("handoff", "shutdown", "fenced")

_log = get_logger("leases")
_GONE: Final = (MemberState.DEAD, MemberState.LEFT)


def hands_back(exited: TaskExited) -> TaskResult | None:
    """The result to post for a task's end, or None when the end was not the task's
    doing (a shutdown, a handoff, a lapsed lease): the epoch is released and no retry
    is counted."""
    released = exited.reason == "shutdown" or (
        exited.reason == "cancelled" and exited.detail in _RELEASES
    )
    return None if released else result_of(exited)


class SubmitError(TimeoutError):
    """`submit` or `cancel` could not be acknowledged as asked (one line for the API)."""


class LeaseService:
    """Args:
    config: the lease preset matched to the swim preset.
    identity: signs our messages, claims, results and cancels.
    store_path: ``STATE_DIR/leases.sqlite3`` (created 0600).
    runner: runs the processes (`TaskRunner`).
    channel: the application channel (kinds registered here).
    members: the membership's members (`MembershipService.members`).
    record_of: a member's verified record (the roster's record book).
    allocate: GPU allocations, ``[(uuid, vram)]`` (`GpuService.allocate`).
    set_draining: our record's draining flag (`RecordPublisher.set_draining`).
    send: ``send(member, key, payload)``, an application message to one member
        (`MembershipService.send_app`).
    check_operator: checks operator proofs on cancels (`operator.operator_checker`).
    """

    def __init__(
        self,
        config: LeaseConfig,
        identity: NodeIdentity,
        store_path: Path,
        *,
        runner: TaskRunner,
        channel: AppChannel,
        members: Callable[[], list[Member]],
        record_of: Callable[[str], NodeRecord | None],
        allocate: Callable[[list[tuple[str, int]]], None],
        set_draining: Callable[[bool], Awaitable[None]],
        send: Callable[[str, str, bytes], Awaitable[None]],
        ack_timeout: float = ACK_TIMEOUT,
        rng: random.Random | None = None,
        check_operator: OperatorCheck = no_operators,
    ) -> None:
        self.config = config
        self.me = identity.node_id
        self._identity = identity
        self._runner = runner
        self._channel = channel
        self._ack_timeout = ack_timeout
        fd = os.open(store_path, os.O_CREAT | os.O_RDWR, 0o600)
        os.close(fd)
        self._store = LeaseStore(store_path, deferred=True)  # see `_flusher`
        self._commit_lock = trio.Lock()
        #: Commands (and `_durable` waiters) held until the next group commit.
        self._outbox: list[list[AgentCommand] | trio.Event] = []
        self._flush = trio.Event()
        self._trace = LeaseTrace(self.me)  # POPULI_LEASE_TRACE (benchmarks only)
        sign = lambda data: identity.sign(LEASE_CONTEXT, data)  # noqa: E731
        self.table = LeaseTable(
            config, self.me, sign, self._verify,
            persist=self._put_entry, forget=self._store.delete, check_operator=check_operator,
        )  # fmt: skip
        self.agent = LeaseAgent(
            config, self.me, sign, self._verify,
            members=self._live, candidates=self._candidates,
            rng=rng if rng is not None else random.Random(), table=self.table,
            persist_grant=self._store.put_grant, forget_grant=self._store.delete_grant,
            check_operator=check_operator,
        )  # fmt: skip
        self._from_peer = False  # while applying a peer's delta or push-pull state
        self.section = LeaseSection(self.table, self._on_sync, trio.current_time, self._received)
        self._members, self._record_of = members, record_of
        self._allocate, self._set_draining, self._send = allocate, set_draining, send
        self._wake = trio.Event()
        self._waiters: dict[tuple[str, str], tuple[trio.Event, list[Acknowledged]]] = {}
        self._held: dict[str, list[tuple[str, int]]] = {}  # task -> (gpu uuid, vram)
        self._reload: list[TaskEntry] = []
        self._reload_at = self._reload_until = self._ready_at = 0.0
        self.send_failures = 0
        #: Task processes started here, and how those that ended here ended.
        self.task_starts = 0
        self.task_exits = dict.fromkeys(("succeeded", "failed", "released"), 0)

    def _put_entry(self, entry: TaskEntry) -> None:
        """Store a table entry. Fsynced only when it holds an end of ours (a result or
        a release, written before a majority of the replicas agreed and gossiped only
        then: a restart must find it to send it again); every other entry is relaxed
        (`store.py`): a peer's, or a change of ours that leaves at once (a submit, a
        claim, a cancel after agreement), which the others then hold."""
        cur = entry.current
        ours = cur is not None and cur.owner == self.me and cur.phase >= Phase.RELEASED
        self._store.put(entry, relaxed=self._from_peer or not ours)

    @contextlib.contextmanager
    def _received(self) -> Iterator[None]:
        self._from_peer = True
        try:
            yield
        finally:
            self._from_peer = False

    @property
    def draining(self) -> bool:
        return self.agent.draining

    def _verify(self, node: str, data: bytes, sig: bytes) -> bool:
        if node == self.me:
            key = self._identity.public_key
        else:
            record = self._record_of(node)
            if record is None:
                return False
            key = record.public_key
        return verify_signature(key, LEASE_CONTEXT, data, sig)

    def _live(self) -> list[str]:
        return [m.name for m in self._members() if m.state not in _GONE] + [self.me]

    def _candidates(self, spec: TaskSpec, reliability: dict[str, float] | Any) -> list[Candidate]:
        return build_candidates(
            self._members(), self._record_of, reliability, prior_reliability(self.config),
            me=self.me, draining=self.agent.draining, accepting=spec.submitted_by,
        )  # fmt: skip

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
        grants, bad_grants = self._store.load_grants()
        if bad or bad_grants:
            event(_log, 30, "leases.corrupt_rows", skipped=bad + bad_grants)
        self.agent.load(grants, entries, now)
        self.agent.ready = False
        self._ready_at = now + READY_AFTER
        self._reload, self._reload_until = entries, now + RELOAD_WINDOW
        self._channel.register(AppKind.LEASES, self._on_delta, self.section)
        self._channel.register(AppKind.LEASE_AGENT, self._on_message)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, events)
                nursery.start_soon(self._flusher)
                nursery.start_soon(self._exits)
                # What a previous run left is dead before its epochs are handed back.
                await self._runner.reap_leftovers()
                await self._execute(self.agent.release_held(trio.current_time()))
                task_status.started()
                await self._loop()
        finally:
            with trio.CancelScope(shield=True):
                async with self._commit_lock:  # no commit of another task in flight
                    self._store.close()
            self._trace.close()

    async def _watch(self, events: trio.MemoryReceiveChannel[Event]) -> None:
        async for _ev in events:
            self._wake.set()

    async def _exits(self) -> None:
        async for exited in self._runner.exits:
            await self._on_exit(exited)

    async def _on_exit(self, exited: TaskExited) -> None:
        tid = exited.task_id
        if self._held.pop(tid, None):
            self._allocate([a for held in self._held.values() for a in held])
        event(_log, 20, "task.exited", task=tid, epoch=exited.epoch, code=exited.exit_code,
              reason=exited.reason, detail=exited.detail)  # fmt: skip
        now = trio.current_time()
        result = hands_back(exited)
        outcome = "released" if result is None else "failed" if result.exit_code else "succeeded"
        self.task_exits[outcome] += 1
        await self._execute(self.agent.task_exited(tid, exited.epoch, result, now))

    async def _loop(self) -> None:
        while True:
            now = trio.current_time()
            deadline = now + 1.0
            due = self.agent.next_deadline()
            if due is not None:
                deadline = min(deadline, due)
            if not self.agent.ready:
                deadline = min(deadline, self._ready_at)
            with trio.move_on_at(deadline):
                await self._wake.wait()
            self._wake = trio.Event()
            woke = trio.current_time()
            await self._step(woke)
            if self._trace.enabled:
                late, took = woke - deadline, trio.current_time() - woke
                if late > 0.02 or took > 0.02:
                    self._trace.note("step", late_ms=round(late * 1000), ms=round(took * 1000))

    async def _step(self, now: float) -> None:
        if not self.agent.ready and now >= self._ready_at:
            self.agent.ready = True
        if self._reload and now >= self._reload_at:
            # Parts signed by others verify only once their records are known: load the
            # disk copy again as records arrive (merging is idempotent).
            self._reload_at = now + 1.0
            self.table.load(self._reload, now)
            if now >= self._reload_until:
                self._reload = []
        await self._execute(self.agent.tick(now))

    ####################################################################################
    # Commands of the agent

    def _monotonic(self, deadline: float) -> float:
        """An agent (trio clock) deadline as a `time.monotonic()` value, which the
        task's wrapper compares with the same system clock."""
        return time.monotonic() + (deadline - trio.current_time())

    async def _execute(self, commands: list[AgentCommand]) -> None:
        """Queue `commands` for the next group commit (`_flusher`): nothing leaves
        before the records it follows from are on disk. Renewals and their answers
        follow from none (`SendTo.after_commit`) and leave at once, so an owner's
        lease does not wait on its replicas' disks. Returns without waiting for a
        commit, so a handler never holds up the next message behind an fsync."""
        now: list[AgentCommand] = [
            c for c in commands if isinstance(c, SendTo) and not c.after_commit
        ]
        if now:
            commands = [c for c in commands if not (isinstance(c, SendTo) and not c.after_commit)]
            await self._carry_out(now)
        if commands or self._store.written > self._store.committed:
            self._outbox.append(commands)
            self._flush.set()

    async def _durable(self) -> None:
        """Return once every record written so far is on disk."""
        done = trio.Event()
        self._outbox.append(done)
        self._flush.set()
        await done.wait()

    async def _flusher(self) -> None:
        """The group commit. Agent calls write only to the store's buffer and queue
        their commands (`_execute`); this task takes the queue, then commits every row
        written until then in one transaction (its fsync in a worker thread, so the
        event loop keeps receiving and the next batch fills meanwhile; a batch of
        peers' entries only is committed at once, without one), then carries the batch
        out in order. Each command thus leaves after what it follows from is
        durable, as with a commit per record, at one fsync per batch."""
        while True:
            await self._flush.wait()
            self._flush = trio.Event()
            batch, self._outbox = self._outbox, []
            async with self._commit_lock:
                rows, upto = self._store.take()  # after the batch: covers its writes
                t0 = time.perf_counter()
                # Staged here (no waiting); only an fsync goes to a worker thread (a
                # thread per commit would hand the GIL back and forth per statement).
                fsync = bool(rows) and self._store.stage(rows)
                if fsync:
                    await trio.to_thread.run_sync(self._store.finish)
                elif rows:
                    self._store.finish()
                self._store.committed = upto
            if self._trace.enabled and rows:
                took = round((time.perf_counter() - t0) * 1000, 2)
                self._trace.note("commit", rows=len(rows), ms=took, fsync=fsync)
            for item in batch:
                if isinstance(item, trio.Event):
                    item.set()
                else:
                    await self._carry_out(item)

    async def _carry_out(self, commands: list[AgentCommand]) -> None:
        for cmd in commands:
            match cmd:
                case SendTo(node, payload):
                    await self._send_to(node, payload)
                case Gossip(key, payload):
                    await self._channel.broadcast(AppKind.LEASES, key, payload)
                case StartTask():
                    await self._start(cmd)
                case FenceTask(tid, epoch, deadline):
                    self._runner.fence(tid, epoch, self._monotonic(deadline))
                case StopTask(tid, _epoch, reason):
                    self._runner.stop(tid, reason, grace=0.0 if reason == "fenced" else None)
                case Acknowledged(tid, what):
                    waiter = self._waiters.get((what, tid))
                    if waiter is not None:
                        waiter[1].append(cmd)
                        waiter[0].set()
        if commands:
            self._wake.set()

    async def _send_to(self, node: str, payload: bytes) -> None:
        self._trace.message("out", node, payload)
        try:
            await self._send(node, "", bytes([AppKind.LEASE_AGENT]) + payload)
        except ValueError:  # not a member (yet, or any more): the agent repeats
            self.send_failures += 1

    async def _start(self, cmd: StartTask) -> None:
        """Our lease stands: allocate GPUs and start the process, fenced at once."""
        tid, epoch, spec = cmd.task_id, cmd.epoch, cmd.spec
        busy = {uuid for held in self._held.values() for uuid, _ in held}
        gpus = pick_gpus(self._record_of(self.me), busy, spec.requirements)
        if gpus is None:  # our view moved since placement: hand it back at once
            now = trio.current_time()
            await self._execute(self.agent.task_exited(tid, epoch, None, now))
            return
        self._held[tid] = gpus
        self._allocate([a for held in self._held.values() for a in held])
        event(_log, 20, "task.started", task=tid, epoch=epoch, gpus=len(gpus))
        self._trace.note("start", task=tid, epoch=epoch)
        self.task_starts += 1
        self._runner.start(
            tid, epoch, spec, [uuid for uuid, _ in gpus], deadline=self._monotonic(cmd.deadline)
        )

    ####################################################################################
    # Input

    async def _on_message(self, message: AppMessage, body: bytes) -> None:
        self._trace.message("in", message.source, body)
        # The core delivers an App only from the packet envelope's verified signer.
        await self._execute(self.agent.receive(body, trio.current_time(), message.source))

    async def _on_delta(self, message: AppMessage, body: bytes) -> None:
        with self._received():
            changed, commands = self.agent.apply_delta(body, trio.current_time())
        if changed:  # new to us: pass it on (the core does not re-gossip broadcasts)
            await self._channel.broadcast(AppKind.LEASES, message.key, body)
        await self._execute(commands)

    def _on_sync(self, events: list[LeaseEvent]) -> None:
        if any(isinstance(ev, TaskChanged) for ev in events):
            self._wake.set()

    async def _acknowledged(
        self, what: str, tid: str, commands: list[AgentCommand], timeout: float
    ) -> Acknowledged | None:
        """Carry out `commands` and wait for the agent's `Acknowledged` (None: timeout)."""
        done, got = self._waiters[(what, tid)] = (trio.Event(), [])
        try:
            await self._execute(commands)
            with trio.move_on_after(timeout):
                await done.wait()
        finally:
            del self._waiters[(what, tid)]
        return got[0] if got else None

    ####################################################################################
    # Commands (the API)

    async def submit(self, spec_fields: dict[str, Any]) -> dict[str, Any]:
        """Accept a task here; return once a majority of its replicas stored it.

        Raises:
            ValueError: a bad spec (one line); nothing is stored.
            SubmitError: stored here, but its replicas did not acknowledge in time.
        """
        spec = spec_from(spec_fields, self.me, time.time())
        self._trace.note("submit")
        tid, commands = self.agent.submit(spec, trio.current_time())
        self._trace.note("offered", task=tid)
        ack = await self._acknowledged("submit", tid, commands, self._ack_timeout)
        self._trace.note("acked", task=tid, ok=ack is not None and ack.refusal is None)
        if ack is None or ack.refusal is not None:
            entry = self.table.get(tid)
            replicas = entry.spec.replicas if entry is not None and entry.spec else ()
            raise SubmitError(
                f"task {tid} is stored on this node, but a majority of its replicas"
                f" ({', '.join(r[:12] for r in replicas)}) did not acknowledge it within"
                f" {self._ack_timeout:.0f} s (it is offered again; see populi-node task {tid})"
            )
        return {"id": tid, "acks": ack.acks}

    async def cancel(self, task_id: str, operator: OperatorProof | None = None) -> dict[str, Any]:
        """Cancel once a majority of the task's replicas recorded it. Only the accepting
        node may, or any node given an operator's proof (`operator`).

        Raises:
            KeyError: no such task here. ConflictError: it already finished.
            ForbiddenError: this node may not cancel it (one line: who may, and how).
            SubmitError: the replicas did not answer in time.
        """
        if self.table.get(task_id) is None:
            raise KeyError(f"no task {task_id} here (see populi-node tasks)")
        # A cancel that meets a live lease is final once its owner is done with the
        # epoch, or the lease lapsed (an owner that died): up to a whole wait more.
        config = self.agent.config
        timeout = self._ack_timeout + config.lease_ttl * config.clock_margin
        commands = self.agent.cancel(task_id, trio.current_time(), operator)
        ack = await self._acknowledged("cancel", task_id, commands, timeout)
        if ack is None:
            raise SubmitError(
                f"task {task_id}: a majority of its replicas did not confirm the cancel"
                f" within {timeout:.0f} s (it is sent again until they do)"
            )
        if ack.refusal is not None:
            raise (ForbiddenError if ack.forbidden else ConflictError)(ack.refusal)
        return {"id": task_id, "cancelled": True}

    def latest_checkpoint(self, task_id: str) -> Checkpoint | None:
        """The latest checkpoint record of a task in our table."""
        entry = self.table.get(task_id)
        return None if entry is None else entry.checkpoint

    async def record_checkpoint(self, task_id: str, checkpoint: Checkpoint) -> None:
        """Record (signed, durable) and gossip the latest snapshot of a task we own.

        Raises:
            LeaseError: we do not hold its live lease of that epoch any more.
        """
        delta = self.table.record_checkpoint(task_id, checkpoint, trio.current_time())
        await self._durable()
        await self._channel.broadcast(AppKind.LEASES, f"k/{task_id}", delta)

    async def drain(self, handoff: bool) -> dict[str, Any]:
        self.agent.draining = True
        await self._set_draining(True)
        if handoff:
            await self._execute(self.agent.handoff())
        return {"draining": True, "handoff": handoff, "running": len(self.agent.running())}

    async def undrain(self) -> dict[str, Any]:
        self.agent.draining = False
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
        return explain_view(entry, self.agent.why.get(entry.task_id))

    def summary(self) -> dict[str, Any]:
        """``status``'s tasks section: what runs here, and the agent's counters
        (refused grants and renewals by reason, fenced owners, decode errors)."""
        return {
            "draining": self.agent.draining,
            "running": len(self.agent.running()),
            "known": len(self.table),
            "stale_results_rejected": self.table.statistics().stale_results_rejected,
            "cancels_refused": self.table.statistics().cancels_refused,
            **{
                f"checkpoints_refused_{why}": getattr(
                    self.table.statistics(), f"checkpoints_refused_{why}"
                )
                for why in CHECKPOINT_REFUSALS
            },
            "agent": self.agent.statistics(),
        }

    def statistics(self) -> TaskStatistics:
        """What ``/metrics`` shows of tasks and leases (`observe.work_collector`)."""
        by_phase = {phase.value: 0 for phase in TaskPhase}
        for entry in self.table:
            by_phase[entry.phase.value] += 1
        agent = self.agent.statistics()
        refused = {
            r.name.lower(): agent.get(f"grants_refused_{r.name.lower()}", 0) for r in Refusal
        }
        return TaskStatistics(
            by_phase=by_phase, starts=self.task_starts, exits=dict(self.task_exits),
            claims={"won": agent.get("grants_won", 0), "lost": agent.get("grants_lost", 0)},
            grants_refused=refused, fenced=agent.get("fenced", 0), held=agent.get("owned", 0),
        )  # fmt: skip

    def _why_of(self, entry: TaskEntry) -> str | None:
        return self.agent.why.get(entry.task_id) if entry.needs_owner() else None
