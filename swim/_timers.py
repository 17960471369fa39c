"""Timers: relays, pulls, suspicions and reaps, fired from one lazily pruned heap.

A layer of `Membership` (see `swim._membership`); `_Core._push_timer` schedules.
"""

from __future__ import annotations

from ._anti_entropy import _AntiEntropy
from ._events import Output
from ._records import (
    _DEAD,
    _LEFT,
    _TIMER_PULL,
    _TIMER_RELAY,
    _TIMER_SUSPICION,
    _Names,
    _Node,
    _TimerEntry,
)
from .wire import INCARNATION_MAX, Nack, encode_message


class _Timers(_AntiEntropy):
    """Which heap entries still hold, what each kind does when due, and the reap."""

    def _timer_valid(self, entry: _TimerEntry) -> bool:
        """Timers are never removed from the heap; stale ones are recognised here."""
        deadline, _, kind, key = entry
        if kind == _TIMER_RELAY:
            relay = self._relays.get(key)
            return relay is not None and relay.deadline == deadline
        if kind == _TIMER_PULL:
            pull = self._pulls.get(key)
            return pull is not None and pull.deadline == deadline
        node = self._members.get(key)
        if node is None:
            return False
        if kind == _TIMER_SUSPICION:
            suspicion = node.suspicion
            return suspicion is not None and suspicion.deadline == deadline
        return (node.state is _DEAD or node.state is _LEFT) and (
            node.state_since + self._config.dead_retention == deadline
        )

    def _fire_timer(self, entry: _TimerEntry, now: float, out: list[Output]) -> None:
        _, _, kind, key = entry
        if kind == _TIMER_RELAY:
            relay = self._relays.pop(key)
            if relay.nack:
                self._counters.nacks_sent += 1
                nack = encode_message(Nack(relay.requester_seq))
                self._send_packet(relay.requester, nack, out, budget=relay.budget)
            return
        if kind == _TIMER_PULL:
            self._retry_pull(key, now)
            return
        node = self._members[key]
        if kind == _TIMER_SUSPICION:
            suspicion = node.suspicion
            assert suspicion is not None
            if self._stall and suspicion.postpone(now, self._stall):
                # It ran out while we were stalled: its refute may be unread in our
                # inbox, and we did not gossip the suspicion meanwhile (the stall guard).
                self._push_timer(suspicion.deadline, _TIMER_SUSPICION, key)
                self._counters.suspicions_postponed += 1
                return
            # Suspicion ran out without a refute: declare the member dead.
            self._become_dead(node, node.incarnation, self._name, now, out)
        else:
            self._reap(node)

    def _reap(self, node: _Node) -> None:
        """Forget a member that has been dead or left for `dead_retention`."""
        reaped = self._reaped
        reaped.pop(node.name, None)
        if node.incarnation < INCARNATION_MAX:
            reaped[node.name] = node.incarnation
            if len(reaped) > self._config.reaped_memory_max:
                del reaped[next(iter(reaped))]
        # else: a record at the limit can only come from a forged rumor; forgetting it
        # lets the member's new session (which restarts at 0) back in.
        del self._members[node.name]
        self._view = None
        self._rtt.pop(node.name, None)
        self._counts[node.state] -= 1
        self._counters.members_reaped += 1
        self._broadcasts.invalidate(node.name)
        self._stale += 1
        if self._stale > 32 and 2 * self._stale > len(self._names):
            members = self._members
            self._names = _Names([], list(dict.fromkeys(n for n in self._names if n in members)))
            self._probe_order.restart()
            self._stale = 0
