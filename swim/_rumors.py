"""Rumors and the precedence table: the only place a member's state changes.

A layer of `Membership` (see `swim._membership`): rumor handlers, `_apply` through
`swim._state.PRECEDENCE`, the state transitions it picks, and our refutes.
"""

from __future__ import annotations

from ._events import (
    Address,
    IncarnationExhausted,
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberRecovered,
    MemberSuspected,
    MemberUpdated,
    Output,
    SelfRefuted,
)
from ._math import suspicion_confirmations_expected, suspicion_timeout_max, suspicion_timeout_min
from ._pulling import _Pulling
from ._records import (
    _ALIVE,
    _DEAD,
    _LEFT,
    _RUMOR_ALIVE,
    _RUMOR_DEAD,
    _RUMOR_LEFT,
    _RUMOR_SUSPECT,
    _SUSPECT,
    _TIMER_REAP,
    _TIMER_SUSPICION,
    _Node,
)
from ._reply import reply_route
from ._state import PRECEDENCE_FAST, Action, Subject
from .suspicion import Suspicion
from .wire import INCARNATION_MAX, Alive, AliveRef, Dead, Left, Suspect, encode_message, meta_digest

_SUBJECT_UNKNOWN = Subject.UNKNOWN.value
_SUBJECT_SELF = Subject.SELF.value
_SUBJECT_SELF_LEFT = Subject.SELF_LEFT.value
_SUBJECT_OF_STATE = {
    _ALIVE: Subject.ALIVE.value,
    _SUSPECT: Subject.SUSPECT.value,
    _DEAD: Subject.DEAD.value,
    _LEFT: Subject.LEFT.value,
}


class _Rumors(_Pulling):
    """Alive, suspect, dead and left rumors applied; refutes of the ones about us."""

    def _on_alive(self, message: Alive, now: float, reliable: bool, out: list[Output]) -> None:
        if len(message.meta) > self._config.meta_size_max:
            self._counters.dropped_invalid += 1
            return
        self._apply(
            _RUMOR_ALIVE,
            message.name,
            message.incarnation,
            now,
            out,
            address=message.address,
            meta=message.meta,
        )

    def _on_alive_ref(
        self, message: AliveRef, now: float, reliable: bool, out: list[Output]
    ) -> None:
        """A lean alive rumor: apply it with the metadata we hold, or pull the record.

        The precedence table sees it as the full `Alive` it stands for: with metadata
        we hold under the same digest it is applied at once (the refute of a member
        whose record did not change); otherwise nothing is applied until the full
        `Alive` arrives, so no event ever carries a member without its record.
        """
        name, incarnation, address, digest = message
        node = self._members.get(name)
        me = self._self
        if node is me:
            # The table's REFUTE and REFUTE_IF_CHANGED for an alive rumor about us.
            own = self._own_digest
            if own[0] is not me.meta:
                own = self._own_digest = (me.meta, meta_digest(me.meta))
            if not self._left and (
                incarnation > me.incarnation
                or (incarnation == me.incarnation and (digest != own[1] or address != me.address))
            ):
                self._refute(incarnation, now, out)
            return
        if node is not None:
            if incarnation <= node.incarnation:
                return  # alive at or below what we hold: the table ignores it
            if meta_digest(node.meta) == digest:
                self._counters.lean_alives_applied += 1
                self._apply(
                    _RUMOR_ALIVE, name, incarnation, now, out, address=address, meta=node.meta
                )
                return
        else:
            reaped = self._reaped.get(name)
            if reaped is not None and incarnation <= reaped:
                self._on_stale_rumor(_RUMOR_ALIVE, name, reaped, address, out)
                return
        # Over a stream the packet's source is an ephemeral port: ask the member, with a
        # bare pull (the address is only named by the packet).
        if self._reliable:
            self._want(name, incarnation, address, address, now)
            self._pull_bare.add(address)
        else:
            self._want(name, incarnation, address, self._source, now)

    def _on_suspect(self, message: Suspect, now: float, reliable: bool, out: list[Output]) -> None:
        self._apply(
            _RUMOR_SUSPECT, message.name, message.incarnation, now, out, source=message.source
        )

    def _on_dead(self, message: Dead, now: float, reliable: bool, out: list[Output]) -> None:
        self._apply(_RUMOR_DEAD, message.name, message.incarnation, now, out, source=message.source)

    def _on_left(self, message: Left, now: float, reliable: bool, out: list[Output]) -> None:
        self._apply(_RUMOR_LEFT, message.name, message.incarnation, now, out)

    def _apply(
        self,
        rumor: int,
        name: str,
        incarnation: int,
        now: float,
        out: list[Output],
        *,
        address: Address | None = None,
        meta: bytes = b"",
        source: str = "",
    ) -> None:
        """Apply one rumor through `swim._state.PRECEDENCE`: the only place state changes."""
        node = self._members.get(name)
        if node is None:
            reaped = self._reaped.get(name)
            if reaped is not None:
                if incarnation <= reaped:
                    self._on_stale_rumor(rumor, name, reaped, address, out)
                    return
                del self._reaped[name]
            subject = _SUBJECT_UNKNOWN
            held = 0
        else:
            if node is self._self:
                subject = _SUBJECT_SELF_LEFT if self._left else _SUBJECT_SELF
            else:
                subject = _SUBJECT_OF_STATE[node.state]
            held = node.incarnation
        order = 0 if incarnation < held else 1 if incarnation == held else 2
        action = PRECEDENCE_FAST[subject][rumor][order]
        if action == Action.IGNORE:
            if subject == _SUBJECT_OF_STATE[_LEFT] and rumor == _RUMOR_SUSPECT:
                self._remind_left(node, incarnation, source, out)
            return
        if node is not None and node.shared:
            node = self._own(node)
        if action == Action.BECOME_ALIVE:
            assert address is not None
            self._become_alive(node, name, incarnation, address, meta, now, out)
        elif action == Action.BECOME_SUSPECT:
            assert node is not None
            self._become_suspect(node, incarnation, source, now, out)
        elif action == Action.CONFIRM:
            assert node is not None
            self._confirm(node, incarnation, source, now)
        elif action == Action.BECOME_DEAD:
            assert node is not None
            self._become_dead(node, incarnation, source, now, out)
        elif action == Action.BECOME_LEFT:
            assert node is not None
            self._become_left(node, incarnation, now, out)
        elif action == Action.REFUTE:
            self._refute(incarnation, now, out)
        else:  # Action.REFUTE_IF_CHANGED
            me = self._self
            if address != me.address or meta != me.meta:
                self._refute(incarnation, now, out)

    def _remind_left(
        self, node: _Node | None, incarnation: int, source: str, out: list[Output]
    ) -> None:
        """An accuser missed a graceful leave we saw: tell it, so it records `left`.

        A left rumor is gossiped a bounded number of times, so in a small mesh one member
        can miss every copy; it then probes the leaver, suspects it and declares it dead,
        which the precedence table never turns into `left`. Answering the accusation
        with the left itself (once per accusation, straight to the accuser) fixes that.
        """
        accuser = self._members.get(source) if source else None
        if (
            node is None
            or incarnation > node.incarnation
            or accuser is None
            or accuser is self._self
            or accuser.state in (_LEFT, _DEAD)
        ):
            return
        self._counters.left_reminders += 1
        self._send_packet(accuser.address, encode_message(Left(node.name, node.incarnation)), out)

    def _on_stale_rumor(
        self, rumor: int, name: str, reaped: int, address: Address | None, out: list[Output]
    ) -> None:
        """A rumor about a reaped member at or below the incarnation it was reaped at.

        It is ignored. If it was an alive that came from the address it names (the
        member itself: `swim._reply`), that address is told the member is dead at the
        remembered incarnation: a stale rumor costs one packet, and a member that
        really restarted with a lower incarnation refutes above it and so gets back in.
        Relayed by another, it is told nobody.
        """
        self._counters.stale_rumors_ignored += 1
        if rumor != _RUMOR_ALIVE or address is None or address == self._address:
            return
        route = reply_route(None, address, self._source, self._reliable)
        if route is not None and route[0] == address:
            self._send_packet(address, encode_message(Dead(name, reaped, self._name)), out)

    ################################################################################
    # State transitions
    ################################################################################

    def _become_alive(
        self,
        node: _Node | None,
        name: str,
        incarnation: int,
        address: Address,
        meta: bytes,
        now: float,
        out: list[Output],
    ) -> None:
        if node is None:
            node = _Node(name, address, _ALIVE, incarnation, meta, now)
            self._members[name] = node
            self._view = None
            self._names.append(name)
            self._counts[_ALIVE] += 1
            self._probe_order.add(len(self._names) - 1)
            out.append(MemberJoined(self._snapshot(node)))
        else:
            previous = node.state
            changed = node.address != address or node.meta != meta
            self._changed(node)
            node.incarnation = incarnation
            node.address = address
            node.meta = meta
            if previous is _ALIVE:
                if changed:
                    out.append(MemberUpdated(self._snapshot(node)))
            else:
                # A dead or left member that returns keeps its slot in the name list,
                # so the probe order reaches it again by the next round at the latest.
                self._set_state(node, _ALIVE, now)
                if previous is _LEFT:
                    out.append(MemberJoined(self._snapshot(node)))
                else:
                    out.append(MemberRecovered(self._snapshot(node)))
        pulls = self._pulls
        if pulls:
            pull = pulls.get(name)
            if pull is not None and incarnation >= pull.incarnation:
                del pulls[name]
                self._counters.pulls_completed += 1
        self._broadcast_alive(name, incarnation, address, meta, now)

    def _become_suspect(
        self, node: _Node, incarnation: int, source: str, now: float, out: list[Output]
    ) -> None:
        config = self._config
        node.incarnation = incarnation
        self._set_state(node, _SUSPECT, now)
        n = self.num_alive()
        timeout_min = suspicion_timeout_min(config.suspicion_mult, n, config.probe_interval)
        if config.dynamic_suspicion_enabled:
            k = suspicion_confirmations_expected(config.suspicion_mult, n)
            timeout_max = suspicion_timeout_max(config.suspicion_max_mult, timeout_min)
        else:
            k = 0
            timeout_max = timeout_min
        suspicion = Suspicion(source, k, timeout_min, timeout_max, now)
        node.suspicion = suspicion
        self._push_timer(suspicion.deadline, _TIMER_SUSPICION, node.name)
        self._counters.suspicions_started += 1
        out.append(MemberSuspected(self._snapshot(node)))
        self._broadcast(node.name, encode_message(Suspect(node.name, incarnation, source)), now)

    def _confirm(self, node: _Node, incarnation: int, source: str, now: float) -> None:
        # Same incarnation only: a newer suspect starts a new suspicion (`_state`).
        suspicion = node.suspicion
        assert suspicion is not None
        if suspicion.confirm(source, now):
            self._push_timer(suspicion.deadline, _TIMER_SUSPICION, node.name)
            self._broadcast(
                node.name, encode_message(Suspect(node.name, node.incarnation, source)), now
            )

    def _become_dead(
        self, node: _Node, incarnation: int, source: str, now: float, out: list[Output]
    ) -> None:
        node.incarnation = incarnation
        self._set_state(node, _DEAD, now)
        self._push_timer(now + self._config.dead_retention, _TIMER_REAP, node.name)
        self._counters.members_failed += 1
        out.append(MemberFailed(self._snapshot(node)))
        self._broadcast(node.name, encode_message(Dead(node.name, incarnation, source)), now)

    def _become_left(self, node: _Node, incarnation: int, now: float, out: list[Output]) -> None:
        node.incarnation = incarnation
        self._set_state(node, _LEFT, now)
        self._push_timer(now + self._config.dead_retention, _TIMER_REAP, node.name)
        out.append(MemberLeft(self._snapshot(node)))
        self._broadcast(node.name, encode_message(Left(node.name, incarnation)), now)

    def _refute(self, accused: int, now: float, out: list[Output]) -> None:
        """Somebody holds an incarnation of ours at or above our own: outbid it."""
        drop = self._faults.drop_refute
        if drop is not None and drop():
            return
        me = self._self
        exhausted = self._outbid(accused, now, out)
        self._changed(me)
        if self._config.awareness_enabled:
            self._awareness.apply_delta(1)
        self._counters.refutes += 1
        self._broadcast_self(now)
        if not exhausted:
            out.append(SelfRefuted(me.incarnation))

    def _outbid(self, held: int, now: float, out: list[Output]) -> bool:
        """Move our incarnation above `held`, or start a new session at the limit.

        The decoder accepts nothing above INCARNATION_MAX, so `held` is at most that,
        and our incarnation never leaves 0..INCARNATION_MAX: it always encodes and
        always fits a signed 64-bit store. A rumor at the limit cannot be outbid; we go
        back to 0 and get back in as a new member once peers reap the old session.
        Returns True for such a new session (an `IncarnationExhausted` was emitted).
        """
        me = self._self
        floor = max(me.incarnation, held)
        if floor < INCARNATION_MAX:
            me.incarnation = floor + 1
            return False
        me.incarnation = 0
        self._counters.incarnation_sessions += 1
        out.append(IncarnationExhausted(0, accused=held))
        return True
