"""Pulls: the full record of a member heard of only by a lean rumor (`AliveRef`).

A layer of `Membership` (see `swim._membership`): asking for records, retrying
elsewhere, and answering others' pulls within `swim._pull`'s routes.
"""

from __future__ import annotations

from ._core import _Core
from ._events import Address, Output
from ._pull import parts_within, pull_answer_route
from ._records import _ALIVE, _SUSPECT, _TIMER_PULL, _Pull
from ._reply import fit_within
from .wire import PACKET_OVERHEAD, Alive, Pull, encode_message, encode_packet

#: Sends of one pull before it is given up: to the rumor's sender, to the latest other
#: sender heard (or the member), then to the member itself.
_PULL_TRIES = 3


class _Pulling(_Core):
    """Pulls asked (batched per call, retried, bounded) and pulls answered."""

    def _want(
        self, name: str, incarnation: int, address: Address, ask: Address, now: float
    ) -> None:
        """Pull `name`'s full record from `ask`, unless a pull for it is outstanding."""
        pulls = self._pulls
        pull = pulls.get(name)
        if pull is not None:
            if incarnation > pull.incarnation:
                pull.incarnation = incarnation
                pull.address = address
            pull.latest = ask
            return
        if len(pulls) >= self._config.pull_pending_max:
            self._counters.pulls_dropped_full += 1
            return
        deadline = now + self._config.pull_timeout
        pulls[name] = _Pull(incarnation, address, ask, deadline)
        self._push_timer(deadline, _TIMER_PULL, name)
        self._pull_batch.setdefault(ask, []).append(name)

    def _retry_pull(self, name: str, now: float) -> None:
        """A pull timed out: ask again, someone else if we can, or give it up."""
        pull = self._pulls[name]
        node = self._members.get(name)
        if node is not None and node.incarnation >= pull.incarnation:
            del self._pulls[name]  # news caught up another way (a suspicion, a sync)
            return
        if pull.tries >= _PULL_TRIES:
            del self._pulls[name]
            self._counters.pulls_given_up += 1
            return
        pull.tries += 1
        if pull.tries < _PULL_TRIES and pull.latest != pull.asked:
            ask = pull.latest
        else:
            ask = pull.address
        pull.asked = pull.latest = ask
        pull.deadline = now + self._config.pull_timeout
        self._push_timer(pull.deadline, _TIMER_PULL, name)
        self._pull_batch.setdefault(ask, []).append(name)
        self._pull_bare.add(ask)  # no packet of this call came from it

    def _flush_pulls(self, out: list[Output]) -> None:
        """Send the pulls gathered during this call: one request per peer asked (more
        when over `pull_names_max` names), piggybacking queued rumors as pings do, but
        only to the source of a packet: an address only a rumor names gets the bare
        request, about the size of the rumors that named it (`swim._reply`)."""
        batch = self._pull_batch
        bare = self._pull_bare
        self._pull_batch = {}
        self._pull_bare = set()
        most = self._config.pull_names_max
        for destination, names in batch.items():
            if destination in bare:
                self._send_bare_pulls(destination, names, out)
                continue
            for at in range(0, len(names), most):
                request = encode_message(
                    Pull(self._name, self._address, tuple(names[at : at + most]))
                )
                self._counters.pulls_sent += 1
                self._send_packet(destination, request, out)

    def _send_bare_pulls(self, destination: Address, names: list[str], out: list[Output]) -> None:
        """Pulls of `names` with nothing else, each one datagram within the packet
        budget (never a stream to an address a rumor names)."""
        budget = self._config.packet_budget
        at = 0
        while at < len(names):
            rest = names[at : at + self._config.pull_names_max]

            def build(k: int, rest: list[str] = rest) -> bytes:
                return encode_packet(
                    [encode_message(Pull(self._name, self._address, tuple(rest[:k])))]
                )

            fitted = fit_within(build, len(rest), budget)
            if fitted is None or fitted[0] == 0:
                return  # not even one name fits: a record name is never that long
            taken, packet = fitted
            self._counters.pulls_sent += 1
            self._emit(destination, packet, False, out)
            at += taken

    def _on_pull(self, message: Pull, now: float, reliable: bool, out: list[Output]) -> None:
        """Answer a pull with the full records we hold, in datagrams, bounded.

        At most `pull_names_max` names are looked at, whatever the request holds, and
        only members we hold alive or suspect are answered (a dead one's alive record
        would be false news): a flood of pulls costs at most that many records each.
        The answer never goes to the address the request names (`swim._pull`).
        """
        counters = self._counters
        counters.pulls_received += 1
        requester = message.source
        sender = self._sender
        node = self._members.get(requester)
        held = node.address if node is not None and node is not self._self else None
        route = pull_answer_route(held, self._source, reliable)
        if route is None or (sender is not None and sender != requester):
            counters.pulls_refused += 1  # over a stream from elsewhere, or in another's name
            return
        destination, capped = route
        most = self._config.pull_names_max
        names = message.names
        if len(names) > most:
            counters.pull_names_refused += len(names) - most
            names = names[:most]
        members = self._members
        parts: list[bytes] = []
        for name in dict.fromkeys(names):
            node = members.get(name)
            if node is not None and (node.state is _ALIVE or node.state is _SUSPECT):
                parts.append(
                    encode_message(Alive(node.name, node.incarnation, node.address, node.meta))
                )
        if capped:
            # Within what this packet may still have back (its other replies share it).
            answer = parts_within(parts, min(self._capped_left, self._config.packet_budget))
            counters.pulled_records_sent += len(answer)
            if len(answer) < len(parts):
                counters.pull_answers_capped += 1
            if answer:
                capped_packet = encode_packet(answer)
                self._capped_left -= len(capped_packet)
                self._emit(destination, capped_packet, False, out)
            return
        counters.pulled_records_sent += len(parts)
        # As many datagrams as the records need, each within the packet budget: one
        # stream per answer would cost a connection, and a lost datagram is retried.
        room = self._config.packet_budget - PACKET_OVERHEAD
        packet: list[bytes] = []
        used = 0
        for part in parts:
            if packet and used + len(part) > room:
                self._emit(destination, encode_packet(packet), reliable or used > room, out)
                packet = []
                used = 0
            packet.append(part)
            used += len(part)
        if packet:
            self._emit(destination, encode_packet(packet), reliable or used > room, out)
