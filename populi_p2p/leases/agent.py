"""`LeaseAgent`: all of one node's lease logic, as a sans-IO state machine.

Each task names a small replica set in its spec (`TaskSpec.replicas`); those members are
its **granters** (`grants.py`, records in `GranterBook`), and each grants every epoch at
most once. The accepting node offers a task to its replicas (acknowledged once a
majority stored it); one node proposes an owner per epoch and tells it (`Own`) once a
majority granted; the owner renews all its leases with each replica once per interval
and starts a task only once a majority renewed it, its executor killing it by the
lease's end by itself; an end (result, release, cancel) counts once a majority recorded
it as final, and then goes into the `LeaseTable` (a CRDT, gossiped) that every node
shows. Decisions come only from the granters. docs/leases.md, "Ownership by agreement",
tells the whole of it and why.

Inputs: `receive`, `submit`, `cancel`, `task_exited`, `apply_delta`, `tick(now)`;
outputs: `agent_commands`. No clock, socket or trio: the node's `LeaseService` and the
simulator drive this same object.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import Final

import attrs

from ._cancel import OperatorProof, cancel_refusal_line, may_cancel
from ._entry import Phase, TaskEntry, TaskResult
from ._spec import TaskSpec
from .agent_base import AgentBase
from .agent_commands import (
    Acknowledged,
    AgentCommand,
    FenceTask,
    StartTask,
    StopTask,
)
from .agent_state import Owned, Pending, Proposal
from .agent_wire import (
    AgentMessage,
    Finish,
    FinishAnswer,
    GrantAnswer,
    GrantRequest,
    Offer,
    OfferAck,
    Own,
    Renew,
    RenewAnswer,
    RenewDigest,
    SpecWanted,
    decode,
)
from .grants import (
    EPOCH_MAX,
    EPOCH_STEP_MAX,
    Ended,
    GrantRecord,
    Refusal,
    on_finish,
    on_grant,
    on_renew,
)
from .placement import Placement, committed_resources, failed_nodes, place
from .placement import replica_nodes as deployment_nodes
from .quorum import can_still_reach_quorum, epoch_vouched, is_quorum, neighbours, replicas_for
from .reliability import earned_reliability
from .renewals import lease_digest, refused_for_good, renewable, renewed_all, steady_round
from .wire import DecodeError, encode_entries

__all__ = ["LeaseAgent", "replicas_for"]

#: A pending task is placed again at least this often (views change without events).
PLACE_INTERVAL: Final = 1.0
#: After k lost proposals in a row the next waits up to 2^min(k-1, this) renewal
#: intervals more, at random: proposers that split the votes stop meeting.
LOSS_BACKOFF_DOUBLINGS: Final = 3

#: The ends an owner writes into the table, as the granters record them.
_ENDS: Final = {
    Phase.RELEASED: Ended.RELEASED,
    Phase.FAILED: Ended.FAILED,
    Phase.SUCCEEDED: Ended.SUCCEEDED,
}
#: A granter's record of a cancel, final or still settling: its owner stops the run.
_CANCELS: Final = (Ended.CANCELLED, Ended.CANCELLING)

Replicas = tuple[str, ...]


class LeaseAgent(AgentBase):
    """All of one node's lease logic (the arguments: `AgentBase`)."""

    ####################################################################################
    # Inputs from the node

    def load(
        self, records: Collection[GrantRecord], entries: Collection[TaskEntry], now: float
    ) -> None:
        """After a restart: our granter records (each lease counted live again for a
        whole wait, since we cannot know when we last renewed it) and the table."""
        self.book.load(records, now)
        self.table.load(entries, now)

    def submit(self, spec: TaskSpec, now: float) -> tuple[str, list[AgentCommand]]:
        """Accept a task here: choose its replicas, sign, offer it to them. An
        `Acknowledged("submit")` follows once a majority holds it."""
        live = set(self._members()) | {self.me}
        spec = attrs.evolve(spec, replicas=self._replica_set(spec, live, now))
        signature = spec.sign(self._sign)
        tid, delta = self.table.submit(spec, now)
        self._offers[tid] = (spec, signature)
        out: list[AgentCommand] = [self._gossip(f"s/{tid}", delta, now)]
        pending = self._pending[("offer", tid)] = Pending(
            "offer", 0, Ended.NO, spec.replicas, now + self.config.lease_ttl
        )
        out += self._repeat(tid, pending, now)
        if self.ready and tid not in self._retry_at:  # not yet proposed: see `_decided`
            out += self._propose(tid, 1, set(), now)
        return tid, out

    def _replica_set(self, spec: TaskSpec, live: set[str], now: float) -> Replicas:
        """The member we place the task on (the **primary**), then its rendezvous
        `quorum.neighbours`: an owner renews with every replica node each round, so sets
        drawn per owner (not per task) keep that to `replica_count - 1` nodes whatever
        the tasks and members. An even set decides with half of it, its primary
        included: in a mesh of two the machine that runs the work needs nobody else.
        If nothing fits now, the task's own rendezvous set."""
        count = self.config.replica_count
        chosen = self._placement(spec.task_id(), spec, set(), now, set()).chosen
        if chosen is None or chosen not in live:
            return replicas_for(spec.task_id(), live, count)
        return (chosen, *neighbours(chosen, live, count - 1))

    def cancel(
        self, task_id: str, now: float, operator: OperatorProof | None = None
    ) -> list[AgentCommand]:
        """Ask the replicas to cancel; `Acknowledged("cancel")` says how it went. Only
        the accepting node, or one given an operator's `operator` proof, may: any other
        is refused here at once, as the replicas would refuse it.

        Raises:
            KeyError: no spec of this task here.
        """
        known = self.spec_of(task_id)
        if known is None:
            raise KeyError(f"no task {task_id} here (see populi-node tasks)")
        spec = known[0]
        why = may_cancel(task_id, spec, self.me, operator, self._check_operator, fresh=True)
        if why is not None:
            self._count("cancels_refused_here")
            line = cancel_refusal_line(task_id, spec, None if operator is None else why)
            return [Acknowledged(task_id, "cancel", 0, line, forbidden=True)]
        return self._ask_cancel(task_id, spec, now, operator)

    def _ask_cancel(
        self, tid: str, spec: TaskSpec, now: float, operator: OperatorProof | None = None
    ) -> list[AgentCommand]:
        entry, rec = self.table.get(tid), self.grants.get(tid)
        epoch = rec.epoch if rec is not None else 0 if entry is None else entry.epoch
        epoch = min(epoch, EPOCH_MAX)  # a cancel's epoch is informational
        pending = self._pending[("cancel", tid)] = Pending(
            "cancel", epoch, Ended.CANCELLED, spec.replicas, now + 4 * self._wait,
            operator=None if spec.submitted_by == self.me else operator,
        )  # fmt: skip
        out, cur = self._repeat(tid, pending, now), None if entry is None else entry.current
        if cur is not None and cur.owner not in (*spec.replicas, self.me) and cur.epoch:
            out += self._to(cur.owner, Finish(tid, epoch, Ended.CANCELLED, 0, operator), now)
        return out

    def task_exited(
        self, task_id: str, epoch: int, result: TaskResult | None, now: float
    ) -> list[AgentCommand]:
        """A task we started ended: `result`, or None for a release (handoff, shutdown,
        no GPU free after all). The end counts once a majority of replicas has it."""
        owned = self._owned.get(task_id)
        if owned is None or owned.epoch != epoch:
            self._count("exits_unowned")
            return []
        del self._owned[task_id]
        self._owned_before[task_id] = max(self._owned_before.get(task_id, 0), epoch)
        if owned.stopping in ("cancelled", "superseded"):
            return []  # nothing to post: someone else's decision ended it
        if result is None or owned.stopping in ("fenced", "handoff"):
            ended = Ended.RELEASED
        else:
            ended = Ended.SUCCEEDED if result.exit_code == 0 else Ended.FAILED
        failures = owned.failures + (ended is Ended.FAILED)
        if ended is Ended.FAILED and result is not None and result.final:
            failures = max(failures, owned.spec.retry_limit + 1)  # no retry can mend it
        pending = self._pending[("finish", task_id)] = Pending(
            "finish", epoch, ended, owned.spec.replicas, now + 4 * self._wait,
            failures=failures,
        )  # fmt: skip
        # Written here first (durable, not yet gossiped): if we die before a majority
        # answers, the restart finds it and sends it again (`release_held`).
        if ended is Ended.RELEASED:
            pending.delta = self._table_local(lambda: self.table.release(task_id, now))
        else:
            assert result is not None
            pending.delta = self._table_local(lambda: self.table.post_result(task_id, result, now))
        return self._repeat(task_id, pending, now)

    def handoff(self) -> list[AgentCommand]:
        """Stop everything running here (a drain with handoff): each epoch is released."""
        out: list[AgentCommand] = []
        for tid, o in self._owned.items():
            if o.started and not o.stopping:
                o.stopping = "handoff"
                out.append(StopTask(tid, o.epoch, "handoff"))
        return out

    def release_held(self, now: float) -> list[AgentCommand]:
        """After a restart, once the executor killed what survived us: release the
        epochs the table says we held (granted again without a wait), and send again
        the ends we wrote but may not have had agreed before we died."""
        out: list[AgentCommand] = []
        for entry in list(self.table):
            cur, tid = entry.current, entry.task_id
            known = self.spec_of(tid)
            if cur is None or cur.owner != self.me or known is None or tid in self._owned:
                continue
            if cur.phase in (Phase.CLAIMED, Phase.RUNNING):
                ended = Ended.RELEASED
                delta = self._table_local(functools.partial(self.table.release, tid, now))
            elif cur.phase in _ENDS and entry.cancel is None:
                ended, delta = _ENDS[cur.phase], self.table.full_delta(tid)
            else:
                continue
            pending = self._pending[("finish", tid)] = Pending(
                "finish", cur.epoch, ended, known[0].replicas, now + 4 * self._wait,
                failures=entry.failures_to_report(), delta=delta,
            )  # fmt: skip
            out += self._repeat(tid, pending, now)
        return out

    def apply_delta(self, delta: bytes, now: float) -> tuple[bool, list[AgentCommand]]:
        """A lease-table delta from gossip: (changed our table, commands). A cancel
        for a task we run stops it at once."""
        events = self.table.apply(delta, now)
        out: list[AgentCommand] = []
        for tid, o in list(self._owned.items()):
            entry = self.table.get(tid)
            if entry is not None and entry.cancel is not None and not o.stopping:
                out += self._stop_cancelled(tid, o, now)
        return bool(events), out

    ####################################################################################
    # Messages

    def receive(self, payload: bytes, now: float, sender: str) -> list[AgentCommand]:
        """A message from `sender`, the verified signer of the packet it came in (it has
        no signature or sender of its own); junk is dropped and counted."""
        try:
            msg = decode(payload)
        except DecodeError:
            self._count("decode_errors")
            return []
        return self._dispatch(sender, msg, now)

    def _dispatch(self, sender: str, msg: AgentMessage, now: float) -> list[AgentCommand]:
        match msg:
            case Offer():
                return self._on_offer(sender, msg, now)
            case OfferAck(tid):
                return self._on_answer(sender, ("offer", tid), 0, Ended.NO, now)
            case GrantRequest():
                return self._on_grant_request(sender, msg, now)
            case GrantAnswer():
                return self._on_grant_answer(sender, msg, now)
            case Own():
                return self._on_own(sender, msg, now)
            case Renew():
                return self._on_renew(sender, msg, now)
            case RenewDigest():
                return self._on_renew_digest(sender, msg, now)
            case RenewAnswer():
                return self._on_renew_answer(sender, msg, now)
            case Finish():
                return self._on_finish(sender, msg, now)
            case FinishAnswer(tid, epoch, ended, refusal, final):
                what = "cancel" if ended is Ended.CANCELLED else "finish"
                if what == "cancel" and not refusal and final is Ended.CANCELLING:
                    return []  # recorded, not final yet: asked again next round
                if what == "cancel" and ("cancel", tid) not in self._pending:
                    return self._resume_cancel(tid, final, now)
                return self._on_answer(sender, (what, tid), refusal, final, now, epoch)
            case SpecWanted(tid):
                known = self.spec_of(tid)
                return [] if known is None else [self._send(sender, Offer(*known))]
        return []  # pragma: no cover

    ####################################################################################
    # Granter side

    def _keep(self, spec: TaskSpec, signature: bytes, now: float) -> GrantRecord | None:
        tid = spec.task_id()
        if tid in self.grants:
            return self.grants[tid]
        rec = self.book.keep(spec, signature, now)
        if isinstance(rec, str):
            self._count(rec)
            return None
        self._check_at = min(self._check_at, now)
        if self.table.get(tid) is None:
            self.table.apply(encode_entries([TaskEntry(tid, spec, signature)]), now)
        return rec

    def _on_offer(self, sender: str, msg: Offer, now: float) -> list[AgentCommand]:
        spec = msg.spec
        if self.me not in spec.replicas or not spec.verify(msg.spec_signature, self._verify):
            self._count("offers_refused")
            return []
        tid = spec.task_id()
        if self._keep(spec, msg.spec_signature, now) is None:
            return []
        out = self._to(sender, OfferAck(tid), now)
        early = self._early.take(tid)
        if early is not None and now < early[2] + self.config.lease_ttl:
            out += self._on_grant_request(early[0], early[1], now)
        return out

    def _on_grant_request(self, sender: str, msg: GrantRequest, now: float) -> list[AgentCommand]:
        tid = msg.task_id
        rec = self.grants.get(tid)
        if rec is None and not self.book.compacted(tid) and self._early.hold(sender, msg, now):
            # The first epoch's request travels right behind its offer and may overtake
            # it: answered once the offer arrives (`_on_offer`), within `lease_ttl`.
            self._count("grants_held_early")
            return self._to(sender, SpecWanted(tid), now)
        if rec is None:
            self._count("grants_refused_unknown")
            unknown = GrantAnswer(tid, msg.epoch, msg.owner, Refusal.UNKNOWN, 0, 0.0, 0)
            return self._to(sender, unknown, now) + self._to(sender, SpecWanted(tid), now)
        before = (rec.epoch, rec.owner, rec.ended)
        refusal = on_grant(rec, self.me, msg.epoch, msg.owner, now, self._wait, self._take_up)
        if refusal is not None:
            self._count(f"grants_refused_{refusal.name.lower()}")
        elif before != (rec.epoch, rec.owner, rec.ended):
            self._persist(rec)
        live = rec.live(now, self._wait, self._take_up)
        answer = GrantAnswer(tid, msg.epoch, msg.owner, refusal or 0, rec.epoch, live, rec.failures)
        return self._to(sender, answer, now)

    def _on_renew(self, sender: str, msg: Renew, now: float) -> list[AgentCommand]:
        refused: list[tuple[str, int]] = []
        for tid, epoch in msg.leases:
            rec = self.grants.get(tid)
            if rec is None:
                refused.append((tid, Refusal.UNKNOWN))
                continue
            before = (rec.epoch, rec.owner, rec.ended)
            refusal = on_renew(rec, epoch, sender, now)
            if refusal is not None:
                self._count(f"renewals_refused_{refusal.name.lower()}")
                refused.append((tid, refusal))
            elif before != (rec.epoch, rec.owner, rec.ended):
                self._persist(rec)
        return self._to(sender, RenewAnswer(msg.seq, tuple(refused)), now)

    def _on_renew_digest(self, sender: str, msg: RenewDigest, now: float) -> list[AgentCommand]:
        """Renew every lease granted to `sender` here, if its digest names that very set
        (and say so, unless the digest is quiet)."""
        pairs = renewable(self.grants, sender)
        if len(pairs) != msg.count or lease_digest(pairs) != msg.digest:
            self._count("renew_digests_missed")
            return self._to(sender, RenewAnswer(msg.seq, (), missed=True), now)
        for tid, epoch in pairs:
            on_renew(self.grants[tid], epoch, sender, now)  # granted to it: renews
        if msg.quiet:
            self._count("renew_digests_quiet")
            return []
        return self._to(sender, RenewAnswer(msg.seq, ()), now)

    def _on_finish(self, sender: str, msg: Finish, now: float) -> list[AgentCommand]:
        tid = msg.task_id
        rec, o = self.grants.get(tid), self._owned.get(tid)
        if rec is None and o is not None and msg.ended is Ended.CANCELLED and not o.stopping:
            # A cancel of a run we own: stop now, if it is the canceller's.
            why = may_cancel(tid, o.spec, sender, msg.operator, self._check_operator, fresh=True)
            return self._stop_cancelled(tid, o, now) if why is None else []
        if rec is None:
            self._count("finishes_refused_unknown")
            unknown = FinishAnswer(tid, msg.epoch, msg.ended, Refusal.UNKNOWN, Ended.NO)
            return self._to(sender, unknown, now)
        before = (rec.epoch, rec.owner, rec.ended, rec.failures)
        operator = (
            msg.operator is not None
            and sender != rec.spec.submitted_by
            and (self._check_operator(tid, msg.operator, True) is None)
        )  # checked only when it matters: two signatures to verify
        refusal = on_finish(
            rec, msg.epoch, sender, msg.ended, msg.failures, operator=operator, now=now,
            wait=self._wait,
        )  # fmt: skip
        if refusal is not None:
            self._count(f"finishes_refused_{refusal.name.lower()}")
        elif before != (rec.epoch, rec.owner, rec.ended, rec.failures):
            self.book.changed(rec)
            if msg.ended is Ended.CANCELLED:  # the canceller's answer is on its way
                self._nudge_at.setdefault(tid, now + self._wait)
                rec.cancelled_by = sender
        self._check_at = min(self._check_at, now)
        final = rec.ended if rec.closed else Ended.NO
        out = self._to(sender, FinishAnswer(tid, msg.epoch, msg.ended, refusal or 0, final), now)
        if before[2] is Ended.CANCELLING and rec.final:
            out += self._cancel_settled(rec, now)
        owned = self._owned.get(tid)
        if rec.ended in _CANCELS and owned is not None and not owned.stopping:
            out += self._stop_cancelled(tid, owned, now)
        return out

    def _cancel_settled(self, rec: GrantRecord, now: float) -> list[AgentCommand]:
        """A cancel is final here: the accepting node hears at once, and again while
        the table it shows lacks the cancel (`_check`): a canceller that restarted or
        gave up asking finishes it from that (`_resume_cancel`)."""
        self._check_at = min(self._check_at, now)
        self._nudge_at[rec.task_id] = now + self._wait
        answer = FinishAnswer(rec.task_id, rec.epoch, Ended.CANCELLED, 0, Ended.CANCELLED)
        return self._to(rec.cancelled_by or rec.spec.submitted_by, answer, now)

    def _resume_cancel(self, tid: str, final: Ended, now: float) -> list[AgentCommand]:
        """A granter holds our cancel as final, and we ask nobody: ask again, so the
        cancel reaches the table once a majority answers."""
        known, entry = self.spec_of(tid), self.table.get(tid)
        if final is not Ended.CANCELLED or known is None or known[0].submitted_by != self.me:
            return []
        if entry is not None and entry.cancel is not None:
            return []
        return self._ask_cancel(tid, known[0], now)

    ####################################################################################
    # Repeated messages: offers, finishes, cancels

    def _repeat(self, tid: str, p: Pending, now: float) -> list[AgentCommand]:
        """(Re)send `p` to every replica that has not answered it."""
        out: list[AgentCommand] = []
        p.resend_at = now + self.config.lease_renew_interval
        for node in p.replicas:
            if node in p.acks or node in p.refused:
                continue
            if p.what == "offer":
                out += self._to(node, Offer(*self._offers[tid]), now)
            else:
                out += self._to(node, Finish(tid, p.epoch, p.ended, p.failures, p.operator), now)
            if p.done and p.what != "offer":
                break  # already decided: one nudge a round is enough
        return out

    def _on_answer(
        self, sender: str, key: tuple[str, str], refusal: int, final: Ended, now: float,
        epoch: int | None = None,
    ) -> list[AgentCommand]:  # fmt: skip
        p = self._pending.get(key)
        if p is None or sender not in p.replicas:
            return []
        if epoch is not None and epoch != p.epoch and key[0] != "cancel":
            return []  # (a cancel's epoch is informational)
        what, tid = key
        if refusal:
            p.refused[sender] = refusal
        else:
            p.acks.add(sender)
        out: list[AgentCommand] = []
        if not p.done and is_quorum(p.replicas, p.acks):
            p.done = True
            out += self._decided(what, tid, p, now)
        elif not p.done and not can_still_reach_quorum(p.replicas, p.refused):
            p.done = True
            out += self._refused(what, tid, p, final)
        if len(p.acks) + len(p.refused) == len(p.replicas):
            del self._pending[key]
        return out

    def _decided(self, what: str, tid: str, p: Pending, now: float) -> list[AgentCommand]:
        out: list[AgentCommand] = []
        if what == "offer":
            out.append(Acknowledged(tid, "submit", len(p.acks)))
            # Usually proposed at submit, behind the offer (a replica then stores and
            # grants in one commit); here if not (the agent was not ready then).
            if self.ready and tid not in self._retry_at:
                out += self._propose(tid, 1, set(), now)
        elif what == "cancel":
            out.append(Acknowledged(tid, "cancel", len(p.acks)))
            cancel = functools.partial(self.table.cancel, tid, now, p.operator)
            out += self._table_op(tid, cancel, f"c/{tid}", now)
        elif p.delta is not None:
            out.append(self._gossip(f"l/{tid}", p.delta, now))
        self._check_at = min(self._check_at, now)
        return out

    def _refused(self, what: str, tid: str, p: Pending, final: Ended) -> list[AgentCommand]:
        self._count(f"{what}_refused")
        known = self.spec_of(tid)
        if what == "cancel" and Refusal.NOT_CANCELLER in p.refused.values() and known:
            line = cancel_refusal_line(tid, known[0], "its replicas refused the operator key"
                                       if p.operator is not None else None)  # fmt: skip
            return [Acknowledged(tid, "cancel", len(p.acks), line, forbidden=True)]
        if what == "cancel":
            reason = (
                f"task {tid} already {final.name.lower()}; nothing to cancel"
                if final is not Ended.NO else f"task {tid}: its replicas refused the cancel"
            )  # fmt: skip
            return [Acknowledged(tid, "cancel", len(p.acks), reason)]
        if what == "offer":
            return [Acknowledged(tid, "submit", len(p.acks), f"task {tid}: replicas refused it")]
        return []  # a superseded result: fenced out, never shown

    ####################################################################################
    # Proposer side

    def _placement(
        self, tid: str, spec: TaskSpec, avoid: set[str], now: float, failed_on: set[str]
    ) -> Placement:
        """Over our view, preferring nodes the task has not failed on (the table's
        history, and the owner a granter saw fail, which the table may not show yet),
        then nodes other than `avoid` (an owner whose lease lapsed: it may be cut off,
        or it may never have heard it was granted); each only while another fits."""
        entry = self.table.get(tid)
        rel = earned_reliability(self.table.outcomes(), now, self.config)
        candidates = self._candidates(spec, rel)
        committed = committed_resources([e for e in self.table if e.task_id != tid])
        failed = (failed_nodes(entry) if entry is not None else frozenset()) | failed_on
        held = [(t, r.spec, r.owner) for t, r in self.grants.items() if r.ended is Ended.NO]
        held += [(t, k[0], p.owner) for t, p in self._proposals.items() if (k := self.spec_of(t))]
        spread = deployment_nodes(tid, spec, self.table, held)  # a deployment's other replicas
        tries = [(failed, avoid), (frozenset(), avoid), (frozenset(), set())]
        for failed_here, exclude in [*tries, tries[0]]:
            p = place(spec, candidates, config=self.config, rng=self._rng, committed=committed,
                      failed_on=failed_here, exclude=exclude, spread=spread)  # fmt: skip
            if p.chosen is not None:
                return p
        return p

    def _propose(
        self, tid: str, epoch: int, exclude: set[str], now: float,
        failed_on: set[str] | None = None,
    ) -> list[AgentCommand]:  # fmt: skip
        """Place the task over our view and ask its replicas to grant `epoch` to the
        node ranked first."""
        known = self.spec_of(tid)
        if known is None or tid in self._proposals:
            return []
        spec = known[0]
        p = self._placement(tid, spec, exclude, now, failed_on or set())
        self.why[tid] = p.explain() if p.chosen is None else f"placed: {p.explain()}"
        if p.chosen is None:
            self._retry_at[tid] = now + PLACE_INTERVAL
            return []
        owner = p.chosen
        if epoch == 1 and spec.replicas[0] in p.ranked:
            owner = spec.replicas[0]  # placed there at submit (`_replica_set`); still fits
        prop = self._proposals[tid] = Proposal(
            epoch, owner, spec.replicas, p.explain(), give_up_at=now + self.config.lease_ttl
        )
        self._count("proposals")
        return self._ask(tid, prop, now)

    def _ask(self, tid: str, prop: Proposal, now: float) -> list[AgentCommand]:
        prop.resend_at = now + self.config.lease_renew_interval
        out: list[AgentCommand] = []
        for node in prop.replicas:
            if node in prop.granted or node in prop.refused:
                continue
            if node == self.me and not is_quorum(prop.replicas, prop.granted | {node}):
                continue  # our own grant last (`_on_grant_answer`)
            out += self._to(node, GrantRequest(tid, prop.epoch, prop.owner), now)
            if tid not in self._proposals:
                break  # answered and decided meanwhile (our own grant)
        return out

    def _on_grant_answer(self, sender: str, msg: GrantAnswer, now: float) -> list[AgentCommand]:
        tid = msg.task_id
        prop = self._proposals.get(tid)
        if prop is None or (msg.epoch, msg.owner) != (prop.epoch, prop.owner):
            return []
        if sender not in prop.replicas:
            return []
        prop.held[sender] = min(msg.held_epoch, EPOCH_MAX - 1)
        if msg.refusal:
            prop.refused[sender] = msg.refusal
            prop.wait = max(prop.wait, msg.live_for)
        else:
            prop.granted.add(sender)
        prop.failures = max(prop.failures, msg.failures)
        mine = self.me in prop.replicas and self.me not in (*prop.granted, *prop.refused)
        request = GrantRequest(tid, prop.epoch, prop.owner)
        if is_quorum(prop.replicas, prop.granted):
            del self._proposals[tid]
            self._losses.pop(tid, None)
            self._count("grants_won")
            # Not again before the owner could have let the lease lapse: a repeat would
            # be granted alike (same epoch, same owner) and reach the owner late.
            self._retry_at[tid] = now + self._wait
            known = self.spec_of(tid)
            assert known is not None
            # Decided without our vote: our record follows, so the owner renews here too.
            out = self._to(self.me, request, now) if mine else []
            return out + self._to(prop.owner, Own(tid, prop.epoch, *known, prop.failures), now)
        if not can_still_reach_quorum(prop.replicas, prop.refused):
            return self._lost(tid, prop, now)
        if mine and is_quorum(prop.replicas, prop.granted | {self.me}):
            # Our own vote completes a majority. Asked only now: a proposal the others
            # refuse then moves no epoch of ours, and a granter that proposed in vain
            # each lease (its own lease unrenewed, the owner renewing elsewhere) no
            # longer drifts above the others for as long as the task runs.
            return self._to(self.me, request, now)
        return []

    def _lost(self, tid: str, prop: Proposal, now: float) -> list[AgentCommand]:
        """No majority: try again later, past what the granters hold and wait for."""
        del self._proposals[tid]
        self._count("grants_lost")
        # The next proposal goes above the epochs the replicas told us they hold: a
        # proposer that went on from its own record alone could leave the replicas'
        # epochs spread wider than a granter may jump (`EPOCH_STEP_MAX`), and then no
        # epoch gets a majority again (seen: 20 daemons, 1,000 tasks, none running).
        # Above those that liars cannot have made up (`epoch_vouched`): one insider
        # answering 2^62 would otherwise push the honest granters apart.
        self._epoch_seen[tid] = max(self._epoch_seen.get(tid, 0), *prop.held.values(), 0)
        rec = self.grants.get(tid)
        vouched = epoch_vouched(prop.replicas, prop.held, 0 if rec is None else rec.epoch)
        self._epoch_learned[tid] = max(self._epoch_learned.get(tid, 0), vouched)
        finished = [node for node, r in prop.refused.items() if r == Refusal.FINISHED]
        if is_quorum(prop.replicas, finished):
            self._settled.add(tid)  # final at a majority: nothing can be granted again
            return []
        live = [node for node, r in prop.refused.items() if r == Refusal.LEASE_LIVE]
        if is_quorum(prop.replicas, live) or finished:
            # A majority renews an owner, or a replica holds an end: progress, so the
            # rank delay starts over. (A granter whose own record is above the owner's
            # epoch never sees the lease live itself, and one that missed an end sees
            # it open: both proposed in vain every wait.)
            self._need_since[tid] = now + max(prop.wait, self.config.lease_renew_interval)
        # Proposers that keep splitting the votes back off at random, further each time.
        losses = self._losses[tid] = self._losses.get(tid, 0) + 1
        step = self.config.lease_renew_interval
        jitter = self._rng.uniform(0.0, step * 2 ** min(losses - 1, LOSS_BACKOFF_DOUBLINGS))
        self._retry_at[tid] = now + max(prop.wait, step) + jitter
        return []

    def _check(self, now: float) -> list[AgentCommand]:
        """Propose for every task that needs an owner and that we should propose for:
        as its accepting node (epoch 1), as its first live replica, or as the k-th
        live one after k x `lease_ttl` without progress."""
        out: list[AgentCommand] = []
        live = set(self._members()) | {self.me}
        nxt = now + max(PLACE_INTERVAL, self.config.lease_renew_interval)
        for tid, rec in self.grants.items():
            ending = self._pending.get(("finish", tid))  # ours (a restart's release)
            busy = tid in self._proposals or tid in self._owned or tid in self._settled
            if rec.ended is Ended.CANCELLED and now >= self._nudge_at.get(tid, 0.0):
                entry = self.table.get(tid)
                if entry is None or entry.cancel is None:  # its canceller may be gone
                    rec.cancelled_by = ""  # the accepting node, from now on
                    out += self._cancel_settled(rec, now)
            if rec.closed or busy or (ending is not None and not ending.done):
                # Not before our end is agreed: a proposal the granters see first meets
                # a live lease and waits it out (traced: 4 s more after a restart).
                self._need_since.pop(tid, None)
                continue
            entry = self.table.get(tid)
            if entry is not None and entry.cancel is not None:
                # The table shows a cancel only once a majority held it final: no epoch
                # is granted again, though our own record missed it.
                self._settled.add(tid)
                continue
            live_for = rec.live(now, self._wait, self._take_up)
            first = rec.epoch == 0 and rec.spec.submitted_by in live
            if first:
                live_for = max(live_for, rec.heard_at + self.config.first_grant_wait - now)
            if live_for > 0:
                self._need_since.pop(tid, None)
                nxt = min(nxt, now + live_for)
                continue
            expired = {rec.owner} if rec.epoch and rec.ended is Ended.NO else set()
            # The owner whose lease lapsed is dead, cut off or stalled: not the one to
            # propose, though it may still look live (with sets drawn per owner it is
            # often the primary). Every granter of its epoch names the same owner.
            proposers = [r for r in rec.spec.replicas if r in live and r not in expired]
            rank = proposers.index(self.me) if self.me in proposers else len(proposers)
            # Progress restarts the count: a grant or renewal here since we started it.
            # An epoch that ended (released, as a restarted owner does at once, or
            # failed) holds no lease: no wait for it (the first proposer then goes at
            # once, not `lease_ttl` after the restart that counted it live again).
            since = self._need_since.setdefault(tid, now)
            if rec.ended is Ended.NO:
                since = max(since, rec.heard_at + self._wait)
            due = max(since + rank * self.config.lease_ttl, self._retry_at.get(tid, 0.0))
            if now < due:
                nxt = min(nxt, due)
                continue
            ours = max(rec.epoch, 0 if entry is None else entry.epoch)
            # What replicas told us counts only as far as they vouch for it, and only
            # within a granter's jump of our own record: an insider replica answering
            # 2^62 cannot stall the task.
            seen = min(self._epoch_learned.get(tid, 0), ours + EPOCH_STEP_MAX - 1)
            epoch = max(ours, seen) + 1
            failed = {rec.owner} if rec.ended is Ended.FAILED else set()
            out += self._propose(tid, epoch, expired, now, failed)
        for tid, (_spec, _sig) in self._offers.items():  # first epochs we still owe
            entry = self.table.get(tid)
            if tid in self.grants or tid in self._proposals or entry is None:
                continue
            if self._epoch_seen.get(tid, 0) >= 1:
                continue  # a replica holds a first epoch: later ones are the replicas' to propose
            due = self._retry_at.get(tid, 0.0)
            owed = entry.epoch == 0 and not entry.finished() and ("offer", tid) not in self._pending
            if owed and now >= due:
                out += self._propose(tid, 1, set(), now)
        self._check_at = nxt
        return out

    ####################################################################################
    # Owner side

    def _on_own(self, sender: str, msg: Own, now: float) -> list[AgentCommand]:
        tid = msg.task_id
        if msg.spec.task_id() != tid or not msg.spec.verify(msg.spec_signature, self._verify):
            self._count("owns_refused")
            return []
        have = self._owned.get(tid)
        if have is not None and (have.epoch >= msg.epoch or have.started):
            # An older run of ours still holds the task (its renewals are refused now, so
            # it fences itself); a later epoch is granted again once this one lapses.
            self._count("owns_busy" if have.epoch < msg.epoch else "owns_repeated")
            return []
        entry = self.table.get(tid)
        ran = entry is not None and any(
            c.owner == self.me and c.epoch >= msg.epoch and c.phase >= Phase.RELEASED
            for c in entry.claims
        )  # what survives a restart of `_owned_before`
        if msg.epoch <= self._owned_before.get(tid, 0) or ran:
            # A late or repeated `Own` of an epoch we already ran and ended: the proposer
            # won the same grant again before it heard. Running it again would re-run a
            # task that may have succeeded (found by the simulator, leases-starved).
            self._count("owns_stale")
            return []
        if self.table.get(tid) is None:
            self.table.apply(encode_entries([TaskEntry(tid, msg.spec, msg.spec_signature)]), now)
        if self.draining:  # granted while we began to drain: hand it back at once
            pending = self._pending[("finish", tid)] = Pending(
                "finish", msg.epoch, Ended.RELEASED, msg.spec.replicas, now + 4 * self._wait
            )
            return self._repeat(tid, pending, now)
        self._owned[tid] = Owned(msg.epoch, msg.spec, self.why.get(tid, ""), now, msg.failures)
        self._renew_at = now  # renew at once: the task starts after this round
        return self._renew(now)

    def _renewing(self) -> dict[str, list[tuple[str, int]]]:
        """Per replica, the (task, epoch) leases we hold and renew there, but those it
        refused for good (`renewals.refused_for_good`), which would spoil its digest."""
        held = {(t, o.epoch) for t, o in self._owned.items() if not o.stopping}
        self._not_granted = {n: p & held for n, p in self._not_granted.items() if p & held}
        per_node: dict[str, list[tuple[str, int]]] = {}
        for tid, o in self._owned.items():
            for node in o.spec.replicas if (tid, o.epoch) in held else ():
                if (tid, o.epoch) not in self._not_granted.get(node, ()):
                    per_node.setdefault(node, []).append((tid, o.epoch))
        return per_node

    def _renew(self, now: float) -> list[AgentCommand]:
        """One round: every lease we hold, renewed with each of its replicas (by
        digest where the replica renewed the same set before: `renewals`)."""
        per_node = self._renewing()
        self._renew_at = now + self.config.lease_renew_interval if per_node else None
        # After a round that renewed everything, ask only a majority to answer.
        replicas = {t: o.spec.replicas for t, o in self._owned.items()}
        quiet = (self.me, replicas) if self._steady else None
        self._steady, self._round_at = False, now
        # All built first: our own answer, handled at once, may end a lease.
        messages = self._rounds.messages(per_node, now, quiet)
        out: list[AgentCommand] = []
        for node, msg in messages:
            out += self._to(node, msg, now)
        return out

    def _on_renew_answer(self, sender: str, msg: RenewAnswer, now: float) -> list[AgentCommand]:
        part = self._rounds.answered(sender, msg)
        if part is None:
            return []
        if msg.missed:
            # The replica holds another set: the full list at once, as part of the same
            # round (its `at`, which is earlier than this resend: conservative).
            full = self._rounds.full(sender, self._renewing().get(sender, []), part.at)
            return [cmd for node, m in full for cmd in self._to(node, m, now)]
        at = part.at
        refused = dict(msg.refused)
        out: list[AgentCommand] = []
        for tid, epoch in part.pairs:
            o = self._owned.get(tid)
            if o is None or o.stopping or o.epoch != epoch:
                continue
            refusal = refused.get(tid)
            if refusal is None:
                out += self._renewed(tid, o, sender, at, now)
            elif refused_for_good(refusal, early=at < o.since + self.config.lease_renew_interval):
                self._not_granted.setdefault(sender, set()).add((tid, epoch))
                if refusal in (Refusal.FINISHED, Refusal.SUPERSEDED):
                    # One granter alone may hold an end that no majority agreed (a result
                    # whose other answers were lost): only a majority ends our run early.
                    o.superseded_by.add(sender)
                    if not is_quorum(o.spec.replicas, o.superseded_by):
                        continue
                    if refusal == Refusal.FINISHED:
                        out += self._stop_cancelled(tid, o, now)
                    else:
                        out += self._stop(tid, o, "superseded")
        ends = [o.lease_until for o in self._owned.values() if not o.stopping]
        self._renew_at = steady_round(self._renew_at, at, ends, self.config)
        self._steady = self._steady or (at >= self._round_at and renewed_all(at, ends, self.config))
        return out

    def _renewed(self, tid: str, o: Owned, node: str, at: float, now: float) -> list[AgentCommand]:
        if at < o.since:
            return []  # a round sent before this ownership began (an earlier one's)
        acks = self._acks.setdefault((tid, o.epoch, at), set())
        acks.add(node)
        if not is_quorum(o.spec.replicas, acks) or at + self.config.lease_ttl <= o.lease_until:
            return []
        o.lease_until = at + self.config.lease_ttl
        if now >= o.lease_until:
            return []
        if o.started:
            return [FenceTask(tid, o.epoch, o.lease_until)]
        o.started = True
        entry = self.table.get(tid)
        if entry is None or entry.epoch < o.epoch:
            self._table_local(lambda: self.table.claim(tid, o.epoch, 0, o.why, now))
        out = self._table_op(tid, lambda: self.table.mark_running(tid, now), f"l/{tid}", now)
        # And the whole entry, spec included: a member that missed the submit (its
        # accepting node died right after) learns the task from its owner. (A spec too
        # big for gossip travels by push-pull instead.)
        out += self._table_op(tid, lambda: self.table.full_delta(tid), f"s/{tid}", now)
        out.append(StartTask(tid, o.epoch, o.spec, o.lease_until))
        return out

    def _stop_cancelled(self, tid: str, o: Owned, now: float) -> list[AgentCommand]:
        """Stop a run a cancel ended, and release its epoch to the replicas: a cancel
        waiting on our lease is final now. We never start this epoch again (in memory,
        and in the table, persisted, once the run had started)."""
        epoch = o.epoch
        self._owned_before[tid] = max(self._owned_before.get(tid, 0), epoch)
        delta = None
        if o.started:
            delta = self._table_local(functools.partial(self.table.release, tid, now))
        out = self._stop(tid, o, "cancelled")
        pending = self._pending[("finish", tid)] = Pending(
            "finish", epoch, Ended.RELEASED, o.spec.replicas, now + 4 * self._wait,
            delta=delta,
        )  # fmt: skip
        return out + self._repeat(tid, pending, now)

    def _stop(self, tid: str, o: Owned, reason: str) -> list[AgentCommand]:
        o.stopping = reason
        if not o.started:
            del self._owned[tid]
            return []
        return [StopTask(tid, o.epoch, reason)]

    ####################################################################################
    # Time

    def tick(self, now: float) -> list[AgentCommand]:
        """Renew, fence, repeat what is unanswered, and propose what needs an owner."""
        out: list[AgentCommand] = []
        for tid, o in list(self._owned.items()):
            if o.stopping:
                continue
            if o.started and now >= o.lease_until:
                self._count("fenced")
                out += self._stop(tid, o, "fenced")
            elif not o.started and now >= o.since + self.config.lease_ttl:
                del self._owned[tid]  # no majority renewed it in time: never started
        for rec in self.book.settle(now):
            out += self._cancel_settled(rec, now)
        if self._renew_at is not None and now >= self._renew_at:
            out += self._renew(now)
        out += self._echoes(now)
        self._acks = {
            k: v for k, v in self._acks.items() if k[2] >= now - 2 * self.config.lease_ttl
        }
        for tid, prop in list(self._proposals.items()):
            if now >= prop.give_up_at:
                out += self._lost(tid, prop, now)
            elif now >= prop.resend_at:
                out += self._ask(tid, prop, now)
        for key, p in list(self._pending.items()):
            if now >= p.until:
                del self._pending[key]
            elif now >= p.resend_at:
                out += self._repeat(key[1], p, now)
        if self.ready and now >= self._check_at:
            out += self._check(now)
        self.table.tick(now)
        self._compact(now)
        return out

    def _compact(self, now: float) -> None:
        """Drop final granter records after `finished_retention`; their ids are kept
        for `tombstone_retention`, so a late offer cannot bring one back open."""
        if now < self._compact_at:
            return
        keep = self.config.finished_retention
        self._compact_at = now + min(keep / 4, PLACE_INTERVAL * 10)
        self.book.compact(now, keep, self.config.tombstone_retention)
        stale = now - self.config.lease_ttl
        self._early.expire(stale)
        self._nudge_at = {t: at for t, at in self._nudge_at.items() if t in self.grants}
        seen = self._epoch_seen.items()
        self._epoch_seen = {t: e for t, e in seen if self.table.get(t) is not None}
        learned = self._epoch_learned.items()
        self._epoch_learned = {t: e for t, e in learned if t in self._epoch_seen}
        self._losses = {t: n for t, n in self._losses.items() if t in self._epoch_seen}
