"""What a run measured: detection, false positives, dissemination, traffic, convergence.

Theory of operation
-------------------
The metrics never ask a core for its member list: that would cost O(n) per question
and O(n^2) per cluster-wide check. Instead they rebuild every node's view from the
events it emits. Each observer `i` has a `bytearray` view, one byte per node slot:
0 unknown, 1 alive, 2 suspect, 3 dead, 4 left (the `MemberState` plus one). From the
views and the ground truth (which nodes are members: up or slow) they keep, in O(1) per
event, the number of *wrong beliefs*:

    wrong = sum over member observers i of
              (members j != i that i does not see alive)
            + (non-members j that i still sees alive or suspect)

so "the cluster has converged" is ``wrong == 0``, checked after every change. A status
change (a crash, a restart, a pause) costs O(n), once.

Real failures are crashes, graceful leaves and pauses. Each opens a `Detection` with
the set of members that believed the node alive at that moment; an observer drops out
of the set when its view of the node leaves alive/suspect (or when it stops being a
member itself). Time to first detection is the first `MemberFailed` (or `MemberLeft`)
anywhere; time to detection by all is when the set empties.

A false positive is a `MemberFailed` about a node that was a reachable member when
the suspicion (or, without one, the first declaration) of that (node, incarnation)
began: the first one is an *episode* (one healthy member wrongly declared dead), and
every declaration belonging to a false episode counts once more in
`false_declarations` (each is one application told a lie). Accusations that begin
while the node is paused, crashed or leaving are true; those that begin while a
partition separates accuser and accused are counted apart.

A dissemination probe (`note_update`) times how long new metadata published by one
node takes to be seen by every member.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from swim import (
    Event,
    MemberFailed,
    MemberLeft,
    MemberSuspected,
)

from ._engine import NodeStatus, Simulator

__all__ = ["ConvergenceRecord", "Detection", "Metrics", "Sample", "UpdateRecord"]

_UNKNOWN = 0
_ALIVE = 1
_SUSPECT = 2
_DEAD = 3
_LEFT = 4

_HELD = (_ALIVE, _SUSPECT)

_MEMBER = frozenset({NodeStatus.UP, NodeStatus.SLOW})


@attrs.define
class Detection:
    """One real failure (crash, leave or pause) and how the cluster noticed it."""

    node: int
    kind: str
    at: float
    observers: int
    pending: set[int] = attrs.field(repr=False)
    first_suspected: float | None = None
    first_detected: float | None = None
    all_detected: float | None = None
    #: "detected" (every observer), "returned" (came back first), "open" (run ended).
    outcome: str = "open"

    def as_dict(self, probe_interval: float) -> dict[str, Any]:
        def delta(when: float | None) -> float | None:
            return None if when is None else when - self.at

        first = delta(self.first_detected)
        every = delta(self.all_detected)
        return {
            "node": self.node,
            "kind": self.kind,
            "at": self.at,
            "observers": self.observers,
            "outcome": self.outcome,
            "first_suspected_after": delta(self.first_suspected),
            "first_detected_after": first,
            "all_detected_after": every,
            "first_detected_periods": None if first is None else first / probe_interval,
            "all_detected_periods": None if every is None else every / probe_interval,
            "dissemination_after_first": (
                None if first is None or every is None else every - first
            ),
        }


@attrs.define
class UpdateRecord:
    """One metadata update and when the last member saw it."""

    node: int
    meta: bytes
    at: float
    observers: int
    pending: set[int] = attrs.field(repr=False)
    all_seen: float | None = None
    #: "seen" (by every member), "publisher down" (it crashed, left or slept before
    #: every member saw the update, so the spread is not measurable), "open" (run ended).
    outcome: str = "open"

    def as_dict(self, probe_interval: float) -> dict[str, Any]:
        spread = None if self.all_seen is None else self.all_seen - self.at
        return {
            "node": self.node,
            "at": self.at,
            "observers": self.observers,
            "outcome": self.outcome,
            "all_seen_after": spread,
            "all_seen_periods": None if spread is None else spread / probe_interval,
        }


@attrs.define
class ConvergenceRecord:
    """How long the cluster took to agree again after something healed."""

    label: str
    at: float
    converged: float | None = None

    def as_dict(self) -> dict[str, Any]:
        after = None if self.converged is None else self.converged - self.at
        return {"label": self.label, "at": self.at, "converged_after": after}


@attrs.frozen
class Sample:
    """The state of the whole cluster at one instant, for time-series plots."""

    t: float
    members: int
    wrong: int
    suspects: int
    messages: int
    bytes: int


class Metrics:
    """An `Observer` that turns a run's events into the measures the docs report.

    Args:
        sim: the simulator it watches (used for names and to read counters).
        capacity: node slots to reserve in every view up front (views grow as needed).
    """

    def __init__(self, sim: Simulator, *, capacity: int = 0) -> None:
        self._sim = sim
        self._index_of = sim.name_index.get
        self._capacity = capacity
        self._views: list[bytearray] = []
        self._member = bytearray()
        self._members = 0
        # Per subject j: member observers that see j alive, and alive-or-suspect.
        self._alive_by: list[int] = []
        self._held_by: list[int] = []
        self._total_ok = 0
        self._total_stale = 0
        self._total_suspects = 0
        # Measures.
        self.window_start = 0.0
        self.window_end = math.inf
        self._closed: tuple[int, int, int] | None = None
        self._member_seconds = 0.0
        self._last_change = 0.0
        self._messages0 = 0
        self._bytes0 = 0
        self._sealed0 = 0
        #: Whether the engine prices the envelope (`Simulator.set_envelope`).
        self.sealed = False
        self.detections: list[Detection] = []
        self._open: dict[int, Detection] = {}
        self.updates: list[UpdateRecord] = []
        self._open_updates: dict[int, UpdateRecord] = {}
        self.convergences: list[ConvergenceRecord] = []
        self._waiting: list[ConvergenceRecord] = []
        self._stop_when_converged = False
        self._declared: dict[tuple[int, int], str] = {}
        self._suspected: dict[tuple[int, int], str] = {}
        self.partition_episodes = 0
        self.false_episodes = 0
        self.false_episodes_slow = 0
        self.false_declarations = 0
        self.false_suspicions = 0
        self.true_declarations = 0
        self.refutes = 0
        self.samples: list[Sample] = []
        self.on_converged: Callable[[float], None] | None = None

    ####################################################################################
    # Views
    ####################################################################################

    def _grow(self, node: int) -> None:
        while len(self._views) <= node:
            self._views.append(bytearray(max(self._capacity, node + 1)))
            self._member.append(0)
            self._alive_by.append(0)
            self._held_by.append(0)

    @property
    def wrong(self) -> int:
        """How many (observer, node) beliefs disagree with the truth right now."""
        members = self._members
        return members * (members - 1) - self._total_ok + self._total_stale

    @property
    def converged(self) -> bool:
        return self.wrong == 0

    @property
    def beliefs(self) -> list[bytearray]:
        """Each observer's view, as `view_of` reads it (a per-packet caller's shortcut;
        read-only, and a view may be shorter than the number of nodes)."""
        return self._views

    def view_of(self, observer: int, node: int) -> int:
        """What `observer` believes of `node`: 0 unknown, or `MemberState` + 1."""
        view = self._views[observer]
        return view[node] if node < len(view) else _UNKNOWN

    def holds(self, observer: int, node: int) -> bool:
        """Whether `observer` holds `node` as a live member (alive or suspect)."""
        return self.view_of(observer, node) in (_ALIVE, _SUSPECT)

    def alive_count(self, node: int) -> int:
        """How many members `node` currently sees alive (itself not included)."""
        return self._views[node].count(_ALIVE)

    def assume_converged(self) -> None:
        """Record that every member sees every other member alive (they were primed so).

        O(n) per member, all in C (bytearray copies), so a 10,000-member start stays fast.
        """
        template = bytearray(max(self._capacity, len(self._views)))
        members = [node for node, is_member in enumerate(self._member) if is_member]
        for node in members:
            template[node] = _ALIVE
        size = len(self._alive_by)
        self._alive_by[:] = [0] * size
        self._held_by[:] = [0] * size
        others = len(members) - 1
        for node in members:
            view = bytearray(template)
            view[node] = _UNKNOWN
            self._views[node] = view
            self._alive_by[node] = self._held_by[node] = others
        self._total_ok = len(members) * others
        self._total_stale = self._total_suspects = 0

    def on_event(self, now: float, node: int, event: Event) -> None:
        member = getattr(event, "member", None)
        if member is None:  # SelfRefuted
            self.refutes += 1
            return
        subject = self._index_of(member.name)
        if subject is None or subject == node:
            return
        cls = event.__class__
        if cls is MemberFailed:
            self._on_failed(now, node, subject, member.incarnation)
        elif cls is MemberSuspected:
            self._on_suspected(now, node, subject, member.incarnation)
        elif cls is MemberLeft:
            record = self._open.get(subject)
            if record is not None and record.first_detected is None:
                record.first_detected = now
        if self._open_updates:
            update = self._open_updates.get(subject)
            if update is not None and member.meta == update.meta:
                self._update_seen(now, update, node)
        code = member.state + 1
        view = self._views[node]
        if subject >= len(view):
            view.extend(bytes(subject + 1 - len(view)))
        old = view[subject]
        if old == code:
            return
        view[subject] = code
        if self._member[node]:
            alive = (code == _ALIVE) - (old == _ALIVE)
            self._count(subject, alive, (code in _HELD) - (old in _HELD))
        if code not in _HELD:
            record = self._open.get(subject)
            if record is not None:
                record.pending.discard(node)
                if not record.pending:
                    self._close_detection(now, record, "detected")
        if self._waiting and self.wrong == 0:
            self._converged(now)

    def _classify(self, observer: int, subject: int, incarnation: int) -> str:
        """Why the first accusation of (subject, incarnation), made by `observer`, was made.

        "true": the subject was really down (crashed, asleep, leaving, or an accusation
        about a previous life). "partition": alive, but cut off from the accuser by a
        partition, so the accusation is right as far as anyone can tell. "slow" or
        "healthy": a member that was up and reachable, so a false positive.
        """
        sim = self._sim
        status = sim.status(subject)
        if status not in _MEMBER or incarnation < sim.start_incarnation(subject):
            return "true"
        network = sim.network
        if not (network.reachable(observer, subject) and network.reachable(subject, observer)):
            return "partition"
        return "slow" if status == NodeStatus.SLOW else "healthy"

    def _on_failed(self, now: float, observer: int, subject: int, incarnation: int) -> None:
        key = (subject, incarnation)
        cause = self._declared.get(key)
        measured = self.window_start <= now <= self.window_end
        if cause is None:
            # A death follows a suspicion of the same incarnation: it has that cause
            # (a suspicion raised across a partition is still one when it expires).
            cause = self._suspected.get(key) or self._classify(observer, subject, incarnation)
            self._declared[key] = cause
            if measured:
                if cause == "slow":
                    self.false_episodes_slow += 1
                elif cause == "healthy":
                    self.false_episodes += 1
                elif cause == "partition":
                    self.partition_episodes += 1
        # A real failure's first declaration is timed whatever the accusation's cause
        # (a member suspected while healthy that then crashed is still detected by it)
        # and whether or not the window has closed: a crash near the end of the timeline
        # is declared dead in the liveness phase, and its "by all" time is measured too.
        record = self._open.get(subject)
        if record is not None and record.first_detected is None:
            record.first_detected = now
        if not measured:
            return
        if cause in ("slow", "healthy"):
            self.false_declarations += 1
        elif cause != "partition":
            self.true_declarations += 1

    def _on_suspected(self, now: float, observer: int, subject: int, incarnation: int) -> None:
        key = (subject, incarnation)
        if key not in self._suspected:
            cause = self._suspected[key] = self._classify(observer, subject, incarnation)
            if cause in ("slow", "healthy") and self.window_start <= now <= self.window_end:
                self.false_suspicions += 1
        record = self._open.get(subject)
        if record is not None and record.first_suspected is None:
            record.first_suspected = now

    ####################################################################################
    # Ground truth
    ####################################################################################

    def _count(self, subject: int, alive: int, held: int) -> None:
        """A member observer's belief about `subject` changed by (alive, held) deltas."""
        self._alive_by[subject] += alive
        self._held_by[subject] += held
        self._total_suspects += held - alive
        if subject < len(self._member) and self._member[subject]:
            self._total_ok += alive
        else:
            self._total_stale += held

    def _count_view(self, observer: int, sign: int) -> None:
        """Add (sign 1) or remove (sign -1) every belief `observer` holds. O(n) in C
        when the view is empty (a fresh start), O(n) in Python otherwise."""
        view = self._views[observer]
        if view.count(0) == len(view):
            return
        count = self._count
        for subject, belief in enumerate(view):
            if belief:
                count(subject, sign * (belief == _ALIVE), sign * (belief in _HELD))

    def on_status(self, now: float, node: int, old: NodeStatus, new: NodeStatus) -> None:
        self._grow(node)
        was = old in _MEMBER
        becomes = new in _MEMBER
        if old == NodeStatus.DOWN and new != NodeStatus.DOWN:
            # A (re)started node has a fresh core that knows nobody yet.
            self._views[node] = bytearray(max(self._capacity, len(self._views[node])))
        if was == becomes:
            return
        self._account(now)
        if becomes:
            self._member_up(node)
            record = self._open.pop(node, None)
            if record is not None and record.outcome == "open":
                record.outcome = "returned"
        else:
            self._member_down(now, node, new)
        if self._waiting and self.wrong == 0:
            self._converged(now)

    def _member_up(self, node: int) -> None:
        # As a subject: beliefs about it that were stale are now right, or wrong.
        self._total_stale -= self._held_by[node]
        self._total_ok += self._alive_by[node]
        self._member[node] = 1
        self._members += 1
        # As an observer: its beliefs start to count.
        self._count_view(node, 1)

    def _member_down(self, now: float, node: int, new: NodeStatus) -> None:
        self._count_view(node, -1)
        self._total_ok -= self._alive_by[node]
        self._total_stale += self._held_by[node]
        self._member[node] = 0
        self._members -= 1
        pending = set()
        if self._held_by[node]:
            views = self._views
            for observer, is_member in enumerate(self._member):
                if is_member:
                    view = views[observer]
                    if node < len(view) and view[node] in _HELD:
                        pending.add(observer)
        # The node no longer observes anything: drop it from every open measurement.
        for record in list(self._open.values()):
            record.pending.discard(node)
            if not record.pending and record.outcome == "open":
                self._close_detection(now, record, "detected")
        for update in list(self._open_updates.values()):
            if update.node == node:
                # Not measurable: counted apart in the summary, not silently dropped.
                update.outcome = "publisher down"
                del self._open_updates[node]
            else:
                self._update_seen(now, update, node)
        kind = {NodeStatus.DOWN: "crash", NodeStatus.PAUSED: "pause"}.get(new, "leave")
        previous = self._open.pop(node, None)
        if previous is not None and previous.outcome == "open":
            previous.outcome = "returned"
        record = Detection(node=node, kind=kind, at=now, observers=len(pending), pending=pending)
        if self.window_start <= now <= self.window_end:
            self.detections.append(record)
        if pending:
            self._open[node] = record
        else:
            record.outcome = "detected"
            record.all_detected = now

    def _close_detection(self, now: float, record: Detection, outcome: str) -> None:
        record.outcome = outcome
        record.all_detected = now
        self._open.pop(record.node, None)

    def _account(self, now: float) -> None:
        start = max(self._last_change, self.window_start)
        end = min(now, self.window_end)
        if end > start:
            self._member_seconds += self._members * (end - start)
        self._last_change = max(now, self._last_change)

    ####################################################################################
    # Probes and phases
    ####################################################################################

    def open_window(self, now: float) -> None:
        """Start counting rates from `now` (after the cluster has formed)."""
        self._account(now)
        self.window_start = now
        self._member_seconds = 0.0
        self._last_change = now
        self._messages0 = sum(self._sim.sent_messages)
        self._bytes0 = sum(self._sim.sent_bytes)
        self._sealed0 = sum(self._sim.sealed_bytes)
        self.false_episodes = self.false_episodes_slow = 0
        self.false_declarations = self.false_suspicions = self.true_declarations = 0
        self.partition_episodes = 0
        self.refutes = 0

    def close_window(self, now: float) -> None:
        """Stop counting rates at `now` (the liveness phase that follows is not measured).

        Detections and convergences still in progress keep being timed.
        """
        self._account(now)
        self.window_end = now
        self._closed = (
            sum(self._sim.sent_messages) - self._messages0,
            sum(self._sim.sent_bytes) - self._bytes0,
            sum(self._sim.sealed_bytes) - self._sealed0,
        )

    def note_update(self, now: float, node: int, meta: bytes) -> None:
        """Time how long `meta`, just published by `node`, takes to reach every member."""
        pending = {i for i, is_member in enumerate(self._member) if is_member and i != node}
        record = UpdateRecord(node=node, meta=meta, at=now, observers=len(pending), pending=pending)
        self.updates.append(record)
        if pending:
            self._open_updates[node] = record
        else:
            record.all_seen = now
            record.outcome = "seen"

    def _update_seen(self, now: float, update: UpdateRecord, observer: int) -> None:
        update.pending.discard(observer)
        if not update.pending:
            update.all_seen = now
            update.outcome = "seen"
            self._open_updates.pop(update.node, None)

    def expect_convergence(self, now: float, label: str, *, stop: bool = False) -> None:
        """Time how long until every member sees exactly the members alive again.

        Args:
            stop: call `Simulator.stop()` when it happens (the liveness phase waits so).
        """
        record = ConvergenceRecord(label=label, at=now)
        self.convergences.append(record)
        self._waiting.append(record)
        self._stop_when_converged = self._stop_when_converged or stop
        if self.wrong == 0:
            self._converged(now)

    def _converged(self, now: float) -> None:
        for record in self._waiting:
            record.converged = now
        self._waiting.clear()
        if self._stop_when_converged:
            self._stop_when_converged = False
            self._sim.stop()

    def sample(self, now: float) -> None:
        """Record one point of the time series (the runner calls this periodically)."""
        self.samples.append(
            Sample(
                t=now,
                members=self._members,
                wrong=self.wrong,
                suspects=self._total_suspects,
                messages=sum(self._sim.sent_messages) - self._messages0,
                bytes=sum(self._sim.sent_bytes) - self._bytes0,
            )
        )

    ####################################################################################
    # Summary
    ####################################################################################

    def summary(self, now: float, probe_interval: float) -> dict[str, Any]:
        """Every measure as plain JSON-able values."""
        self._account(now)
        seconds = max(min(now, self.window_end) - self.window_start, 1e-9)
        member_seconds = max(self._member_seconds, 1e-9)
        member_hours = member_seconds / 3600.0
        if self._closed is not None:
            messages, sent_bytes, sealed_bytes = self._closed
        else:
            messages = sum(self._sim.sent_messages) - self._messages0
            sent_bytes = sum(self._sim.sent_bytes) - self._bytes0
            sealed_bytes = sum(self._sim.sealed_bytes) - self._sealed0
        detections = [d.as_dict(probe_interval) for d in self.detections]
        crashes = [d for d in detections if d["kind"] == "crash"]
        updates = [u.as_dict(probe_interval) for u in self.updates]
        return {
            "window_start": self.window_start,
            "window_seconds": seconds,
            "member_hours": member_hours,
            "members_end": self._members,
            "messages_per_member_second": messages / member_seconds,
            "bytes_per_member_second": sent_bytes / member_seconds,
            # With the daemon's envelope (None: not modelled in this run).
            "sealed_bytes_per_member_second": (
                sealed_bytes / member_seconds if self.sealed else None
            ),
            "messages": messages,
            "bytes": sent_bytes,
            "sealed_bytes": sealed_bytes if self.sealed else None,
            "false_positives": {
                "episodes_healthy": self.false_episodes,
                "episodes_slow": self.false_episodes_slow,
                "declarations": self.false_declarations,
                "suspicions": self.false_suspicions,
                "per_member_hour": (self.false_episodes + self.false_episodes_slow) / member_hours,
                "healthy_per_member_hour": self.false_episodes / member_hours,
            },
            "true_declarations": self.true_declarations,
            "partitioned_declared_dead": self.partition_episodes,
            "refutes": self.refutes,
            "detection": {
                "crashes": len(crashes),
                "first_detected_mean": _mean(c["first_detected_after"] for c in crashes),
                "all_detected_mean": _mean(c["all_detected_after"] for c in crashes),
                "first_detected_periods_mean": _mean(c["first_detected_periods"] for c in crashes),
                "all_detected_periods_mean": _mean(c["all_detected_periods"] for c in crashes),
                "first_suspected_mean": _mean(c["first_suspected_after"] for c in crashes),
                "undetected": sum(1 for c in crashes if c["outcome"] != "detected"),
                # The crashes left out of the "by all" mean, by reason.
                "restarted_first": sum(1 for c in crashes if c["outcome"] == "returned"),
                "still_open": sum(1 for c in crashes if c["outcome"] == "open"),
                # Crashes seen dead by all but never declared dead (e.g. every observer
                # learned it by a leave or lost it itself): left out of "first" means.
                "first_unmeasured": sum(
                    1
                    for c in crashes
                    if c["outcome"] == "detected" and c["first_detected_after"] is None
                ),
            },
            "dissemination": {
                "updates": len(self.updates),
                "measured": sum(1 for u in self.updates if u.outcome == "seen"),
                "all_seen_mean": _mean(u["all_seen_after"] for u in updates),
                "all_seen_max": _max(u["all_seen_after"] for u in updates),
                "all_seen_periods_mean": _mean(u["all_seen_periods"] for u in updates),
                "incomplete": sum(1 for u in self.updates if u.all_seen is None),
                "publisher_down": sum(1 for u in self.updates if u.outcome == "publisher down"),
                "still_open": sum(1 for u in self.updates if u.outcome == "open"),
            },
            "detections": detections,
            "updates": updates,
            "convergence": [c.as_dict() for c in self.convergences],
            "wrong_beliefs_end": self.wrong,
        }


def _mean(values: Any) -> float | None:
    kept = [v for v in values if v is not None and not math.isnan(v)]
    return sum(kept) / len(kept) if kept else None


def _max(values: Any) -> float | None:
    kept = [v for v in values if v is not None]
    return max(kept) if kept else None
