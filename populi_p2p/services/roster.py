"""The roster: who the members are, as far as their signed records say.

Events in: membership events (its own subscription). For each, the member's metadata is
offered to the record book, the event is logged with the member's verified name, and
name clashes are noticed. Commands out: members worth remembering across restarts go to
`on_known`, members that left to `on_gone` (the store). Queries: the rows the API
shows, unverified members and name clashes. Members that died or left stay in the rows,
with "last seen", for `departed_retention` (`departed.DepartedMembers`), long after the
core forgot them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final, Protocol

import trio

from overlay.base import format_address
from swim import (
    Event,
    Member,
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberRecovered,
    MemberState,
    MemberSuspected,
    MemberUpdated,
)

from .._log import event, get_logger
from ..store import KnownMember
from ..trust.record import NodeRecord
from ..trust.record_book import RecordBook
from ..trust.revocation import RevocationList
from ._member_events import other_member, serve_events
from .departed import DepartedMembers
from .publisher import OwnRecord

__all__ = [
    "DEPARTED_RETENTION", "MEMBER_STATES", "REVALIDATE_INTERVAL", "MemberQueries", "Roster",
]  # fmt: skip

#: How often records are re-checked for expiry, seconds.
REVALIDATE_INTERVAL: Final = 2.0
_GONE: Final = (MemberState.DEAD, MemberState.LEFT)
#: How long a dead or left member stays listed by default, seconds (a day, as Serf).
DEPARTED_RETENTION: Final = 24 * 3600.0
#: The member states, as every log line, event, table and page names them.
MEMBER_STATES: Final = tuple(s.name.lower() for s in MemberState)
#: The log event of each membership change: ``member.`` and the state it is in now
#: (the event feed uses the same kinds, `observe.events`).
_LOG_KINDS: Final[dict[type, tuple[str, int]]] = {
    MemberJoined: ("member.joined", 20),
    MemberRecovered: ("member.recovered", 20),
    MemberUpdated: ("member.updated", 20),
    MemberSuspected: ("member.suspect", 20),
    MemberFailed: ("member.dead", 30),
    MemberLeft: ("member.left", 20),
}

_log = get_logger("node")


class MemberQueries(Protocol):
    """The two read-only queries the roster asks of the membership service."""

    def member(self, node_id: str) -> Member | None: ...

    def members(self) -> list[Member]: ...


class Roster:
    """Verified records and names of the members the core holds.

    Args:
        node_id: ours (not logged as a member).
        records: the record book (the roster is its only writer, with our own records
            through `accept_own`).
        membership: read-only queries on the core (`MembershipService`).
        own_record: our first signed record (the membership's metadata), or None in
            tests; the publisher hands the later ones to `accept_own`.
        on_known, on_gone: store commands.
        on_certificate: (public key, certificate) of each member whose record verified,
            for the packet codec (`AuthCodec.learn_certificate`): a member whose record
            we hold can send us packets without its certificate.
        clock: realtime, for record expiry, `KnownMember.last_seen` and the departed
            members' "last seen".
        departed_retention: seconds a dead or left member stays in the rows.
    """

    def __init__(
        self,
        node_id: str,
        records: RecordBook,
        membership: MemberQueries,
        *,
        own_record: OwnRecord | None,
        on_known: Callable[[KnownMember], None],
        on_gone: Callable[[str], None],
        on_certificate: Callable[[bytes, bytes], object],
        clock: Callable[[], float] = time.time,
        departed_retention: float = DEPARTED_RETENTION,
    ) -> None:
        self.node_id = node_id
        #: Dead and left members, shown with "last seen" after the core forgot them.
        self.departed = DepartedMembers(departed_retention)
        #: node id -> realtime it was first suspected (its "last seen" if it dies).
        self._suspected_at: dict[str, float] = {}
        self.records = records
        self._membership = membership
        self._on_known = on_known
        self._on_gone = on_gone
        self._on_certificate = on_certificate
        self._clock = clock
        self._clashes_logged: set[tuple[str, tuple[str, ...]]] = set()
        self._names: dict[str, str] = {}
        self._by_name: dict[str, set[str]] = {}
        # node id -> why its record is not trusted, as last logged (`record.refused`).
        self._unverified: dict[str, str] = {}
        if own_record is not None:
            self.accept_own(own_record.raw, own_record.signed_at)

    def accept_own(self, raw: bytes, now: float) -> None:
        """Our own freshly signed record (the publisher's `on_signed`).

        Our name counts for clashes too: a second node called like us is a clash that
        this node, not only the others, must report.
        """
        record = self.records.accept(raw, now, node_id=self.node_id)
        if record is not None:
            self._note_name(record)

    def update_revocations(self, revocations: RevocationList) -> None:
        for node_id in self.records.update_revocations(revocations, self._clock()):
            event(_log, 30, "record.revoked", id=node_id)

    async def run(
        self,
        events: trio.MemoryReceiveChannel[Event],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await serve_events(
            events, self.on_event, every=REVALIDATE_INTERVAL, check=self._revalidate,
            task_status=task_status,
        )  # fmt: skip

    def _revalidate(self) -> None:
        for node_id in self.records.revalidate(self._clock()):
            event(_log, 30, "record.expired", id=node_id)

    ####################################################################################
    # Events

    def on_event(self, ev: Event) -> None:
        member = other_member(ev, self.node_id)
        if member is None:
            return
        record = self._verify(member)
        name = record.name if record is not None else self._names.get(member.name, "?")
        fields: dict[str, object] = {
            "name": name,
            "id": member.name,
            "addr": format_address(member.address),
            "inc": member.incarnation,
            "unverified": self._unverified.get(member.name),  # left out when None
        }
        kind, level = _LOG_KINDS.get(type(ev), ("", 0))
        if kind:
            event(_log, level, kind, **fields)
        if isinstance(ev, MemberJoined | MemberRecovered | MemberUpdated):
            self._remember(member, name)
            if member.state not in _GONE:
                self.departed.discard(member.name)
                self._suspected_at.pop(member.name, None)
            if not isinstance(ev, MemberRecovered):
                self._check_clash(record)
        elif isinstance(ev, MemberSuspected):
            self._suspected_at.setdefault(member.name, self._clock())
        elif isinstance(ev, MemberFailed | MemberLeft):
            self._depart(member)
            if isinstance(ev, MemberLeft):
                self._on_gone(member.name)

    def _depart(self, member: Member) -> None:
        """Keep `member`'s row, as it is now, with when it was last seen: when it was
        first suspected (a death), or now (a leave: it said goodbye)."""
        now = self._clock()
        suspected = self._suspected_at.pop(member.name, None)
        seen = suspected if member.state == MemberState.DEAD and suspected else now
        self.departed.keep(
            self._row(member, snapshot=True) | {"last_seen": round(seen, 3)}, departed_at=now
        )

    def _remember(self, member: Member, name: str) -> None:
        host, port = member.address
        self._on_known(KnownMember(member.name, name, host, port, self._clock()))

    def _verify(self, member: Member) -> NodeRecord | None:
        """Offer the member's metadata to the record book; its record if it is trusted.

        None when the member is *unverified*: its current record was refused (bad
        signature, another cluster's certificate, revoked, expired, ...) or it never
        had one. Logs `record.refused` once each time the reason changes.
        """
        if member.meta:
            self.records.accept(member.meta, self._clock(), node_id=member.name)
        reason = self.unverified_reason(member.name)
        if reason is None:
            self._unverified.pop(member.name, None)
            record = self.records.get(member.name)
            if record is not None:
                self._on_certificate(record.public_key, record.certificate)
            return record
        if self._unverified.get(member.name) != reason:
            self._unverified[member.name] = reason
            event(_log, 30, "record.refused", id=member.name, reason=reason,
                  effect="shown as unverified")  # fmt: skip
        return None

    def _check_clash(self, record: NodeRecord | None) -> None:
        """Log once when `record`'s name is also used by another live node id.

        O(members with that name), not O(members): this runs on every join and update.
        """
        if record is None:
            return
        holders = self._note_name(record)
        member = self._membership.member
        live = sorted(n for n in holders if (m := member(n)) is not None and m.state not in _GONE)
        if len(live) > 1:
            key = (record.name, tuple(live))
            if key not in self._clashes_logged:
                self._clashes_logged.add(key)
                others = [n for n in live if n != self.node_id]
                event(_log, 30, "name.clash", name=record.name, me=self.node_id,
                      ids=",".join(live), others=",".join(others),
                      fix="give each node its own --name")  # fmt: skip

    def _note_name(self, record: NodeRecord) -> set[str]:
        """Index `record`'s name; the node ids that claim it."""
        previous = self._names.get(record.node_id)
        if previous is not None and previous != record.name:
            self._by_name.get(previous, set()).discard(record.node_id)
        self._names[record.node_id] = record.name
        holders = self._by_name.setdefault(record.name, set())
        holders.add(record.node_id)
        return holders

    ####################################################################################
    # Queries

    def display_name(self, member: Member) -> str:
        """The name to show a person for `member`, from the record it carries (verified
        now if the roster has not seen it yet: another subscriber may read an event
        first), else the name it last verified with, else its id's first 12 characters."""
        record = self._verify(member) if member.name != self.node_id else None
        if record is not None:
            return record.name
        name = self.name_of(member.name)
        return name if name != "?" else member.name[:12]

    def name_of(self, node_id: str) -> str:
        """The name `node_id` had when its record last verified, or "?"."""
        return self._names.get(node_id, "?")

    def unverified_reason(self, node_id: str) -> str | None:
        """Why `node_id` is unverified (`bad_signature`, `wrong_authority`, `revoked`,
        `expired`, `no_record`, ...), or None when its current record verified."""
        reason = self.records.refusal(node_id)
        if reason is None and self.records.get(node_id) is None:
            return "no_record"
        return reason

    def unverified_members(self) -> list[dict[str, Any]]:
        """Members the core holds whose record is not trusted, with the reason."""
        out = []
        for member in self._members():
            reason = self.unverified_reason(member.name)
            if reason is not None:
                out.append({
                    "node_id": member.name, "name": self.name_of(member.name),
                    "state": member.state.name.lower(), "reason": reason,
                })  # fmt: skip
        return out

    def name_clashes(self) -> list[dict[str, Any]]:
        """Names claimed by more than one node id among members not gone."""
        by_name: dict[str, list[str]] = {}
        for member in self._members():
            if member.state in _GONE:
                continue
            record = self.records.get(member.name)
            if record is not None:
                by_name.setdefault(record.name, []).append(member.name)
        return [
            {"name": name, "node_ids": sorted(ids)}
            for name, ids in sorted(by_name.items())
            if len(ids) > 1
        ]

    def member_rows(self) -> list[dict[str, Any]]:
        """The rows of ``GET /v1/members``: the members the core holds, then those that
        died or left within `departed_retention` and that it has forgotten since."""
        members = self._members()
        rows = [self._row(m) for m in members]
        return rows + self.departed.rows(self._clock(), except_ids=(m.name for m in members))

    def state_counts(self) -> dict[str, int]:
        """How many members are in each state, the departed ones still listed included."""
        counts = dict.fromkeys(MEMBER_STATES, 0)
        members = self._members()
        for m in members:
            counts[m.state.name.lower()] += 1
        for row in self.departed.rows(self._clock(), except_ids=(m.name for m in members)):
            counts[row["state"]] += 1
        return counts

    def _row(self, member: Member, *, snapshot: bool = False) -> dict[str, Any]:
        """One member's row, from the core's view and its verified record (`snapshot`:
        for `departed`, which keeps its own `state_since`)."""
        from ..gpu import GpuReport, member_gpu_summary, report_to_dict

        reason = self.unverified_reason(member.name)
        # What an unverified member's record claims is not shown: only its id,
        # address and state (the core's own) and the name it had when it verified.
        record = self.records.get(member.name) if reason is None else None
        name = record.name if record is not None else self.name_of(member.name)
        caps = "-"
        gpu_detail: dict[str, Any] | None = None
        if record is not None:
            c = record.capabilities
            gpu = member_gpu_summary(c.gpu) if c.gpu is not None else "no GPU"
            caps = f"{c.cpu_cores} cpu, {c.ram_bytes / 2**30:.0f} GiB, {gpu}"
            if c.gpu is not None:
                try:
                    gpu_detail = report_to_dict(GpuReport.from_record(c.gpu))
                except ValueError:
                    gpu_detail = None  # the summary already says "GPU record unreadable"
        gone = member.state in _GONE
        return {
            "name": name,
            "node_id": member.name,
            "address": format_address(member.address),
            "state": member.state.name.lower(),
            "incarnation": member.incarnation,
            # A dead or left member's last RTT says nothing about it now.
            "rtt_ms": None if member.rtt is None or gone else round(member.rtt * 1000, 3),
            "capabilities": caps,
            # The member's signed GPU record, in the `gpus --json` form: every
            # section says its layer (A verified, B derived, C operator).
            "gpu": gpu_detail,
            "labels": dict(record.labels) if record is not None else {},
            "status": record.status.value if record is not None else None,
            "version": record.software_version if record is not None else None,
            "verified": reason is None,
            "unverified": reason,
            "self": member.name == self.node_id,
            "state_since": (
                0.0 if snapshot else round(trio.current_time() - member.state_since, 3)
            ),
            # Realtime it was last seen (dead: first suspected; left: its goodbye);
            # None while it is a live member.
            "last_seen": self.departed.last_seen(member.name) if gone else None,
        }

    def _members(self) -> list[Member]:
        return self._membership.members()
