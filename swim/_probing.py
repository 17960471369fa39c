"""Failure detection: our probe rounds, and the probes we answer or relay.

A layer of `Membership` (see `swim._membership`); `swim.probe` holds the round
itself and `Membership.tick` moves it along.
"""

from __future__ import annotations

from ._events import Output
from ._math import smoothed_rtt
from ._records import _ALIVE, _RUMOR_SUSPECT, _SUSPECT, _TIMER_RELAY, _Relay
from ._rumors import _Rumors
from .probe import ProbeRound
from .wire import Ack, IndirectPing, Nack, Ping, Suspect, encode_message, encode_packet, packet_size


class _Probing(_Rumors):
    """SWIM's direct and indirect probes, with Lifeguard's buddy system and nacks."""

    def _probe_usable(self, index: int) -> bool:
        names = self._names
        node = self._members.get(names.extra[index] if not names.base_len else names[index])
        return (
            node is not None
            and (node.state is _ALIVE or node.state is _SUSPECT)
            and node is not self._self
        )

    def _scale(self) -> int:
        return self._awareness.score + 1 if self._config.awareness_enabled else 1

    def _start_probe(self, now: float, out: list[Output]) -> None:
        config = self._config
        scale = self._scale()
        interval = config.probe_interval * scale
        self._next_probe_at = now + interval
        index = self._probe_order.next(self._rng, self._probe_usable)
        if index is None:
            return
        name = self._names[index]
        node = self._members[name]
        seq = self._next_seq()
        self._probe = ProbeRound(name, seq, now, config.probe_timeout * scale, interval)
        ping = encode_message(Ping(seq, node.name, self._name, self._address))
        buddy = None
        if node.state is _SUSPECT and config.buddy_enabled:
            # Lifeguard's buddy system: tell the suspect first, so it can refute now.
            buddy = encode_message(Suspect(node.name, node.incarnation, self._name))
        self._counters.probes_sent += 1
        self._send_packet(node.address, ping, out, buddy)

    def _probe_indirect(self, probe: ProbeRound[str], now: float, out: list[Output]) -> None:
        """The direct ping timed out: ask k members to try, and try a reliable ping."""
        config = self._config
        target = self._members.get(probe.target)
        if target is None:  # reaped meanwhile: nothing left to probe
            return
        helpers = self._random_nodes(config.indirect_checks, target.name, gossip=False)
        if helpers:
            request = encode_message(
                IndirectPing(
                    probe.seq,
                    target.name,
                    target.address,
                    config.nack_enabled,
                    self._name,
                    self._address,
                )
            )
            for helper in helpers:
                self._send_packet(helper.address, request, out)
            self._counters.indirect_probes_sent += len(helpers)
            if config.nack_enabled:
                probe.nacks_expected = len(helpers)
        if config.reliable_probe_enabled:
            ping = encode_message(Ping(probe.seq, target.name, self._name, self._address))
            self._counters.reliable_probes_sent += 1
            self._emit(target.address, encode_packet([ping]), True, out)

    def _probe_failed(self, probe: ProbeRound[str], now: float, out: list[Output]) -> None:
        """No ack by the end of the period: adjust awareness, suspect the target."""
        self._counters.probes_failed += 1
        if self._config.awareness_enabled:
            # Nacks prove the helpers heard us: only the missing ones are our fault.
            expected = probe.nacks_expected
            delta = expected - probe.nacks_received if expected > 0 else 1
            if delta > 0:
                self._awareness.apply_delta(delta)
        target = self._members.get(probe.target)
        if target is not None and (target.state is _ALIVE or target.state is _SUSPECT):
            self._apply(
                _RUMOR_SUSPECT, target.name, target.incarnation, now, out, source=self._name
            )

    ################################################################################
    # Probes answered
    ################################################################################

    def _on_ping(self, message: Ping, now: float, reliable: bool, out: list[Output]) -> None:
        if message.target != self._name:
            self._counters.dropped_misdirected += 1
            return
        route = self._reply_route(message.source, message.source_address)
        if route is None:
            return
        ack = encode_message(Ack(message.seq))
        if reliable and route[1] is None:
            self._emit(route[0], encode_packet([ack]), True, out)
        else:
            self._reply_packet(route, ack, out)

    def _on_indirect_ping(
        self, message: IndirectPing, now: float, reliable: bool, out: list[Output]
    ) -> None:
        """Ping the target at its held address (never the one the request names) with
        at most the request's size, and answer the requester under `swim._reply`."""
        if len(self._relays) >= self._config.indirect_pending_max:
            self._counters.dropped_indirect_full += 1
            return
        target = self._members.get(message.target)
        if target is None or target is self._self:
            self._counters.indirect_targets_refused += 1
            return
        route = self._reply_route(message.source, message.source_address)
        if route is None:
            return
        destination, budget = route
        if budget is not None:
            # A capped requester gets the bare ack or nack (they are one size), which
            # this packet's budget must hold now: it is sent later.
            budget = packet_size(len(encode_message(Nack(message.seq))), 1)
            if budget > self._capped_left:
                self._counters.replies_refused += 1
                return
        seq = self._next_seq()
        ping = encode_message(Ping(seq, target.name, self._name, self._address))
        sent = self._send_packet(target.address, ping, out, budget=self._relay_left)
        if sent == 0:
            self._counters.indirect_targets_refused += 1
            return
        self._relay_left -= sent
        if budget is not None:
            self._spent(budget, budget)
        deadline = now + self._config.probe_timeout
        self._relays[seq] = _Relay(destination, message.seq, message.nack, deadline, budget)
        self._push_timer(deadline, _TIMER_RELAY, seq)

    def _on_ack(self, message: Ack, now: float, reliable: bool, out: list[Output]) -> None:
        probe = self._probe
        if probe is not None and message.seq == probe.seq:
            self._probe = None
            if probe.indirect:
                self._counters.probes_acked_late += 1
            else:
                # Only the target can answer before the indirect phase: a clean sample.
                target = probe.target
                rtt = self._rtt
                previous = rtt.get(target)
                if previous is not None or target in self._members:
                    rtt[target] = smoothed_rtt(previous, now - probe.started_at)
            if self._config.awareness_enabled:
                self._awareness.apply_delta(-1)
            return
        relay = self._relays.pop(message.seq, None)
        if relay is not None:
            ack = encode_message(Ack(relay.requester_seq))
            self._send_packet(relay.requester, ack, out, budget=relay.budget)
            return
        self._counters.acks_unexpected += 1

    def _on_nack(self, message: Nack, now: float, reliable: bool, out: list[Output]) -> None:
        probe = self._probe
        if (
            probe is not None
            and message.seq == probe.seq
            and probe.nacks_received < probe.nacks_expected
        ):
            probe.nacks_received += 1
            self._counters.nacks_received += 1
            return
        self._counters.acks_unexpected += 1
