"""`MembershipStatistics`: what one core has done, for metrics and tests.

A frozen snapshot (as Trio's `statistics()` methods return), built from plain mutable
counters that the hot path increments without allocating.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class MembershipStatistics:
    """Counters since the core was created. Sizes are payload bytes."""

    packets_received: int = 0
    bytes_received: int = 0
    messages_received: int = 0
    packets_sent: int = 0
    bytes_sent: int = 0
    #: Packets that failed to decode (`DecodeError`): dropped.
    dropped_malformed: int = 0
    #: Packets carrying an integer above `swim.wire.INTEGER_MAX` (an incarnation, a
    #: sequence number): dropped. Only a sender holding valid credentials gets one this
    #: far, so a non-zero count deserves a look (see docs/protocol.md, bounded integers).
    dropped_out_of_range: int = 0
    #: Messages that decoded but broke a rule (metadata too large, bad state): dropped.
    dropped_invalid: int = 0
    #: Pings for a member name that is not ours (an old address reused): dropped.
    dropped_misdirected: int = 0
    #: Indirect-probe requests refused because `indirect_pending_max` were running.
    dropped_indirect_full: int = 0
    #: Queued updates evicted because `broadcast_queue_max` was reached.
    broadcasts_evicted: int = 0
    #: Acks and nacks matching no probe in flight (too late, or duplicates).
    acks_unexpected: int = 0
    probes_sent: int = 0
    #: Probes answered after `probe_timeout`, before the period ended (Lifeguard's
    #: "late ack counts").
    probes_acked_late: int = 0
    #: Probes whose direct phase this node only got to end more than `probe_timeout`
    #: after its deadline (it was starved of CPU).
    probes_ended_late: int = 0
    #: Ticks that came more than `stall_threshold` after their earliest due deadline
    #: (the stall guard): each raised awareness by one.
    stalls: int = 0
    #: Probe rounds that ended during a stall and were given the stall once more.
    probes_stretched: int = 0
    #: Suspicions that expired during a stall and were pushed back by it.
    suspicions_postponed: int = 0
    probes_failed: int = 0
    indirect_probes_sent: int = 0
    reliable_probes_sent: int = 0
    nacks_sent: int = 0
    nacks_received: int = 0
    suspicions_started: int = 0
    members_failed: int = 0
    members_reaped: int = 0
    #: Rumors about reaped members at or below the incarnation they were reaped at.
    stale_rumors_ignored: int = 0
    #: Suspicions or deaths heard about a member we hold as left, answered with its left.
    left_reminders: int = 0
    #: Datagrams carrying only our own `left`, sent by `leave` straight to each member
    #: we held as alive or suspect (one each).
    leaves_sent_direct: int = 0
    refutes: int = 0
    #: Times we were accused at `swim.wire.INCARNATION_MAX`, which no refute can outbid,
    #: and started a new incarnation session at 0 (see `IncarnationExhausted`).
    incarnation_sessions: int = 0
    push_pulls_sent: int = 0
    push_pulls_received: int = 0
    #: Application broadcasts queued by `broadcast_app`, and received and delivered.
    app_messages_queued: int = 0
    app_messages_received: int = 0
    #: Application broadcasts or state sections dropped: the channel is off, or over
    #: `app_payload_size_max`, `app_digest_size_max` or `app_state_size_max`.
    app_dropped: int = 0
    #: Application messages whose source is not the packet's authenticated sender (the
    #: driver's `sender`): dropped, so an `AppMessage`'s source is that sender.
    app_refused_sender: int = 0
    #: Application state sections sent in a sync, and handed to `AppState.merge`.
    app_states_sent: int = 0
    app_states_merged: int = 0
    #: Reliable sends the driver reported as undeliverable (`send_failed`).
    send_failures: int = 0
    #: Lean alive rumors (`AliveRef`) applied with metadata we already held.
    lean_alives_applied: int = 0
    #: Pull requests sent (each names up to `pull_names_max` members), retries included.
    pulls_sent: int = 0
    #: Pull requests received, and full records sent in answer to them.
    pulls_received: int = 0
    pulled_records_sent: int = 0
    #: Names in received pulls beyond `pull_names_max`, not answered.
    pull_names_refused: int = 0
    #: Pulls not answered: over a stream from another host than the requester's held
    #: address, or naming a requester other than the authenticated sender (`swim._pull`).
    pulls_refused: int = 0
    #: Answers to an address not tied to the requester, cut to the request's size.
    pull_answers_capped: int = 0
    #: Acks, nacks, sync and push-pull answers sent to the packet's source within the
    #: request's size: the request did not come from the requester's held address
    #: (`swim._reply`).
    replies_capped: int = 0
    #: Pings, indirect pings, syncs and push-pulls left unanswered: in another member's
    #: name, over a stream from a host neither named nor held, or with no answer that
    #: fits the request's size.
    replies_refused: int = 0
    #: Indirect pings for a target this core does not hold (or for itself), or whose
    #: ping would not fit the request's size: the target is not pinged.
    indirect_targets_refused: int = 0
    #: Members pulled in full after a lean rumor (the answer arrived and was applied).
    pulls_completed: int = 0
    #: Pulls given up after their last try, and lean rumors not pulled because
    #: `pull_pending_max` were outstanding (anti-entropy repairs both).
    pulls_given_up: int = 0
    pulls_dropped_full: int = 0


class Counters:
    """The mutable twin of `MembershipStatistics`, one int attribute per field."""

    __slots__ = tuple(f.name for f in attrs.fields(MembershipStatistics))

    packets_received: int
    bytes_received: int
    messages_received: int
    packets_sent: int
    bytes_sent: int
    dropped_malformed: int
    dropped_out_of_range: int
    dropped_invalid: int
    dropped_misdirected: int
    dropped_indirect_full: int
    broadcasts_evicted: int
    acks_unexpected: int
    probes_sent: int
    probes_acked_late: int
    probes_ended_late: int
    stalls: int
    probes_stretched: int
    suspicions_postponed: int
    probes_failed: int
    indirect_probes_sent: int
    reliable_probes_sent: int
    nacks_sent: int
    nacks_received: int
    suspicions_started: int
    members_failed: int
    members_reaped: int
    stale_rumors_ignored: int
    left_reminders: int
    leaves_sent_direct: int
    refutes: int
    incarnation_sessions: int
    push_pulls_sent: int
    push_pulls_received: int
    app_messages_queued: int
    app_messages_received: int
    app_dropped: int
    app_refused_sender: int
    app_states_sent: int
    app_states_merged: int
    send_failures: int
    lean_alives_applied: int
    pulls_sent: int
    pulls_received: int
    pulled_records_sent: int
    pull_names_refused: int
    pulls_refused: int
    pull_answers_capped: int
    replies_capped: int
    replies_refused: int
    indirect_targets_refused: int
    pulls_completed: int
    pulls_given_up: int
    pulls_dropped_full: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def snapshot(self) -> MembershipStatistics:
        return MembershipStatistics(**{name: getattr(self, name) for name in self.__slots__})
