"""`AgentBase`: the lease agent's state, what it reads out, and how it sends.

`LeaseAgent` (agent.py) adds the protocol: the granter, proposer and owner sides, the
repeated messages and time. The split keeps each file readable; nothing here decides.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Iterator, Mapping

from ._cancel import OperatorCheck, no_operators
from ._spec import Signer, TaskSpec, Verifier
from ._table import LeaseError, LeaseTable
from .agent_commands import AgentCommand, Gossip, SendTo
from .agent_state import EarlyGrants, Owned, Pending, Proposal
from .agent_wire import AgentMessage, Renew, RenewAnswer, RenewDigest, encode
from .config import LeaseConfig
from .granter_book import GranterBook
from .grants import GrantRecord
from .placement import Candidate
from .renewals import RenewalRounds

__all__ = ["AgentBase", "Candidates"]

Candidates = Callable[[TaskSpec, Mapping[str, float]], list[Candidate]]


class AgentBase:
    """Args:
    config: the lease preset.
    me: this node's id.
    sign, verify: Ed25519 through the node's identity (the simulator passes stand-ins).
    members: the live members (alive or suspect), this node included.
    candidates: placement candidates for a spec, given the earned reliability.
    rng: ties and jitter.
    persist_grant: writes a changed `GrantRecord` durably before the agent answers.
    forget_grant: deletes a final record compacted after `finished_retention`.
    table: the shown lease table (its own `persist` wired by the caller).
    check_operator: checks an operator's proof on a cancel (default: none holds).
    """

    def __init__(
        self,
        config: LeaseConfig,
        me: str,
        sign: Signer,
        verify: Verifier,
        *,
        members: Callable[[], Collection[str]],
        candidates: Candidates,
        rng: random.Random,
        table: LeaseTable,
        persist_grant: Callable[[GrantRecord], None] | None = None,
        forget_grant: Callable[[str], None] | None = None,
        check_operator: OperatorCheck = no_operators,
    ) -> None:
        self.config, self.me, self.table = config, me, table
        self._check_operator = check_operator
        self._sign, self._verify = sign, verify
        self._members, self._candidates, self._rng = members, candidates, rng
        self._wait = config.lease_ttl * config.clock_margin
        self._persist = persist_grant or (lambda _r: None)
        self.book = GranterBook(
            self._wait, persist=self._persist, forget=forget_grant or (lambda _t: None)
        )
        self._echo: dict[str, tuple[bytes, float]] = {}  # key -> (delta, echo until)
        self._echo_at: float | None = None
        self._compact_at = 0.0
        self.grants = self.book.records
        self.why: dict[str, str] = {}  # task -> last placement explanation here
        self.ready = True  # a restarted node proposes nothing until its driver says so
        self.draining = False
        self._proposals: dict[str, Proposal] = {}
        self._retry_at: dict[str, float] = {}
        self._epoch_seen: dict[str, int] = {}  # task -> highest epoch a replica told us of
        #: task -> the highest epoch vouched for by lost proposals (`quorum.epoch_vouched`)
        self._epoch_learned: dict[str, int] = {}
        self._losses: dict[str, int] = {}  # task -> proposals lost in a row
        self._take_up = config.grant_take_up
        self._settled: set[str] = set()  # refused as final by a majority: not proposed
        self._need_since: dict[str, float] = {}
        self._owned: dict[str, Owned] = {}
        self._pending: dict[tuple[str, str], Pending] = {}  # (what, task) -> pending
        self._offers: dict[str, tuple[TaskSpec, bytes]] = {}  # tasks we accepted
        self._early = EarlyGrants()  # grant requests that came before their offer
        self._nudge_at: dict[str, float] = {}  # final cancels: when to tell the canceller
        self._rounds = RenewalRounds(keep_for=config.lease_ttl)
        self._renew_at: float | None = None
        #: When our last renewal round went out, and whether a round since renewed every
        #: lease with a majority (then the next round asks only a majority to answer).
        self._round_at = -math.inf
        self._steady = False
        self._check_at = 0.0
        self._acks: dict[tuple[str, int, float], set[str]] = {}  # (task, epoch, round)
        self._owned_before: dict[str, int] = {}  # task -> highest epoch we owned and gave up
        self._not_granted: dict[str, set[tuple[str, int]]] = {}  # replica -> leases it refused
        self.counters: dict[str, int] = {}

    ####################################################################################
    # Reading

    def owned(self) -> dict[str, int]:
        """Tasks this node owns now (started or about to): task -> epoch."""
        return {t: o.epoch for t, o in self._owned.items() if not o.stopping}

    def running(self) -> dict[str, int]:
        return {t: o.epoch for t, o in self._owned.items() if o.started and not o.stopping}

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def spec_of(self, task_id: str) -> tuple[TaskSpec, bytes] | None:
        rec = self.grants.get(task_id)
        if rec is not None:
            return rec.spec, rec.spec_signature
        if task_id in self._offers:
            return self._offers[task_id]
        entry = self.table.get(task_id)
        if entry is not None and entry.spec is not None:
            return entry.spec, entry.spec_signature
        return None

    def next_deadline(self) -> float | None:
        """When `tick` has something to do (None: only on input)."""
        times = [self._check_at] if self.ready else []
        times += [t for t in (self._renew_at, self._echo_at) if t is not None]
        times += [o.lease_until for o in self._owned.values() if o.started and not o.stopping]
        times += [p.resend_at for p in self._proposals.values()]
        times += [p.resend_at for p in self._pending.values()]
        times += [t for t in (self.table.compaction_deadline(), self.book.next_deadline()) if t]
        return min(times, default=None)

    def _dispatch(self, sender: str, msg: AgentMessage, now: float) -> list[AgentCommand]:
        """Handle one message (`LeaseAgent`): `_to` ourselves calls it directly."""
        raise NotImplementedError

    ####################################################################################
    # Output

    def _send(self, node: str, msg: AgentMessage) -> SendTo:
        renewal = isinstance(msg, Renew | RenewDigest | RenewAnswer)
        return SendTo(node, encode(msg), after_commit=not renewal)

    def _to(self, node: str, msg: AgentMessage, now: float) -> list[AgentCommand]:
        """Send to `node`; to ourselves, handle it at once (no network)."""
        if node == self.me:
            return self._dispatch(self.me, msg, now)
        return [self._send(node, msg)]

    def _table_local(self, op: Callable[[], bytes]) -> bytes | None:
        """A shown-table change made (and persisted) now, gossiped later."""
        try:
            return op()
        except LeaseError:
            self._count("table_ops_skipped")
            return None

    def _gossip(self, key: str, payload: bytes, now: float) -> Gossip:
        """Broadcast a delta of ours, and again every `lease_renew_interval` for
        `lease_ttl`: one broadcast reaches only a few members, some maybe dead."""
        self._echo[key] = (payload, now + self.config.lease_ttl)
        if self._echo_at is None:
            self._echo_at = now + self.config.lease_renew_interval
        return Gossip(key, payload)

    def _echoes(self, now: float) -> list[AgentCommand]:
        if self._echo_at is None or now < self._echo_at:
            return []
        out: list[AgentCommand] = []
        for key, (payload, until) in list(self._echo.items()):
            if now >= until:
                del self._echo[key]
            else:
                out.append(Gossip(key, payload))
        self._echo_at = now + self.config.lease_renew_interval if self._echo else None
        return out

    def _table_op(
        self, tid: str, op: Callable[[], bytes], key: str, now: float
    ) -> list[AgentCommand]:
        """A shown-table change after agreement; skipped if the table moved on (an
        epoch above ours arrived meanwhile)."""
        try:
            return [self._gossip(key, op(), now)]
        except LeaseError:
            self._count("table_ops_skipped")
            return []

    def statistics(self) -> dict[str, int]:
        return {**self.counters, "granter_records": len(self.grants), "owned": len(self._owned)}

    def __iter__(self) -> Iterator[GrantRecord]:
        return iter(self.grants.values())
