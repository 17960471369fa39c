"""The bottom layer of `Membership`: state, record upkeep, sending, replies, timers.

Everything here is used by the layers above (`swim._membership` lists them); nothing
here calls up into them.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from typing import Any

from ._events import Address, Member, MemberState, Output, Send
from ._faults import FaultHooks
from ._records import _ALIVE, _DEAD, _SUSPECT, _Names, _Node, _Pull, _Relay, _TimerEntry, _ViewCache
from ._reply import fit_within, reply_route
from ._stats import Counters
from .app import AppState
from .awareness import Awareness
from .broadcast import TransmitLimitedQueue
from .config import SwimConfig
from .probe import ProbeOrder, ProbeRound
from .wire import (
    INCARNATION_MAX,
    PACKET_OVERHEAD,
    Alive,
    AliveRef,
    DecodeCache,
    encode_message,
    encode_packet,
    meta_digest,
    packet_size,
)

#: Below this many entries in the member list, random choices filter the whole list;
#: above it they sample random indexes (memberlist's kRandomNodes).
_SAMPLE_FILTER_MAX = 64


class _Core:
    """The bottom of `Membership`: its state, and the upkeep every other part uses.

    Member records and their counts, the view's cache, sending (with piggybacked
    rumors), where replies go, and the timer heap. The parts above it each add one
    mechanism; see `swim._membership`.
    """

    def __init__(
        self,
        config: SwimConfig,
        name: str,
        address: Address,
        rng: random.Random,
        now: float,
        *,
        meta: bytes,
        incarnation: int,
        faults: object | None,
        check_invariants: bool,
        app_state: AppState | None,
        decode_cache: DecodeCache | None,
    ) -> None:
        """See `Membership.__init__`, which documents the arguments."""
        if len(meta) > config.meta_size_max:
            raise ValueError(
                f"meta is {len(meta)} bytes, over meta_size_max={config.meta_size_max}"
            )
        if not 0 <= incarnation <= INCARNATION_MAX:
            raise ValueError(
                f"incarnation must be in 0..{INCARNATION_MAX} (2**62), got {incarnation}"
            )
        self._config = config
        self._name = name
        self._address = address
        self._rng = rng
        self._faults = FaultHooks(faults)
        self._check = check_invariants or config.check_invariants
        self._counters = Counters()
        self._decode_cache = DecodeCache() if decode_cache is None else decode_cache
        self._awareness = Awareness(config.awareness_max_multiplier)
        self._broadcasts = TransmitLimitedQueue(
            config.retransmit_mult,
            config.broadcast_queue_max,
            config.packet_budget - PACKET_OVERHEAD,
        )
        # Application broadcasts: a second queue, drained after the membership one.
        self._app_broadcasts = TransmitLimitedQueue(
            config.retransmit_mult,
            config.app_broadcast_queue_max,
            config.packet_budget - PACKET_OVERHEAD,
        )
        self._app_state = app_state if config.app_channel_enabled else None
        self._self = _Node(name, address, _ALIVE, incarnation, meta, now)
        self._members: dict[str, _Node] = {name: self._self}
        # The view as sync digests, until it next changes (see `_changed`).
        self._view: _ViewCache | None = None
        # Last incarnation of reaped members (insertion ordered, oldest evicted first),
        # so a stale rumor after the reap cannot lower an incarnation we have seen.
        self._reaped: dict[str, int] = {}
        # Every member name we hold, for O(1) random choice; reaped names linger until a
        # compaction. Possibly shared with a `SharedView` until we first append to it.
        self._names = _Names([], [name])
        self._stale = 0
        self._counts = [1, 0, 0, 0]
        self._left = False
        self._seq = 0
        self._init_schedule(now)
        self._init_pending(meta)
        # Announce ourselves: whoever we meet first spreads it.
        self._broadcast_self(now)

    def _init_schedule(self, now: float) -> None:
        """The probe round, the periodic activities' first deadlines, and the timers."""
        config = self._config
        rng = self._rng
        self._probe_order = ProbeOrder(self._names_len)
        self._probe: ProbeRound[str] | None = None
        # How long we were stalled before the tick in progress (0: not stalled).
        self._stall = 0.0
        # Start the periodic activities at random phases, as memberlist staggers its
        # tickers, so that members started together do not probe in lockstep.
        self._next_probe_at: float | None = now + rng.random() * config.probe_interval
        self._gossip_phase = now + rng.random() * config.gossip_interval
        self._gossip_at: float | None = None
        self._push_pull_at: float | None = (
            now + rng.random() * config.push_pull_interval
            if config.push_pull_interval > 0
            else None
        )
        self._timers: list[_TimerEntry] = []
        self._timer_counter = 0
        # A join was sent and its answer has not come yet; the answer sets when the
        # one catch-up exchange is opened (`join_sync_delay`), beside the periodic ones.
        self._join_sync_pending = False
        self._join_sync_at: float | None = None

    def _init_pending(self, meta: bytes) -> None:
        """What is outstanding (relays, pulls), RTTs, and the packet being handled."""
        address = self._address
        self._relays: dict[int, _Relay] = {}
        # Members heard of by a lean rumor whose full record we asked for (bounded by
        # `pull_pending_max`), and the names to ask for at the end of this call, by
        # whom to ask (see `_flush_pulls`).
        self._pulls: dict[str, _Pull] = {}
        self._pull_batch: dict[Address, list[str]] = {}
        # Of those, the addresses asked that sent us nothing in this call (a member's own
        # address a lean rumor names): their pulls carry no piggybacked rumors.
        self._pull_bare: set[Address] = set()
        # The digest of our own metadata, as lean rumors about us carry it.
        self._own_digest = (meta, meta_digest(meta))
        # Smoothed RTT of our direct probes, by member. Kept apart from `_Node` so that
        # recording a sample never copies a record shared with a `SharedView`.
        self._rtt: dict[str, float] = {}
        # The packet being handled came from here, and over a stream if `_reliable`:
        # a lean rumor's receiver pulls from its sender.
        self._source: Address = address
        self._reliable = False
        # Who authenticated it (None: the driver does not say).
        self._sender: str | None = None
        # What this packet may still have sent back to its source when the request did
        # not come from the requester's held address, and to indirect-ping targets:
        # each at most the packet's size (`swim._reply`).
        self._capped_left = 0
        self._relay_left = 0

    def num_alive(self) -> int:
        """Members alive or suspect (not dead, not left), ourselves included. O(1)."""
        return self._counts[_ALIVE] + self._counts[_SUSPECT]

    def _names_len(self) -> int:
        return len(self._names)

    ################################################################################
    # Record upkeep
    ################################################################################

    def _snapshot(self, node: _Node) -> Member:
        return node.snapshot(self._rtt.get(node.name))

    def _own(self, node: _Node) -> _Node:
        """Copy a record shared with a `SharedView` before changing it."""
        copy = _Node(
            node.name, node.address, node.state, node.incarnation, node.meta, node.state_since
        )
        self._members[node.name] = copy
        self._view = None
        return copy

    def _changed(self, node: _Node) -> None:
        """`node`'s record changed: drop its encoded entry, and its part of the view's
        digests (`_ViewCache.changed`).

        The one way to invalidate them; every change of a member's incarnation,
        state, address or metadata goes through here.
        """
        node.entry = None
        view = self._view
        if view is not None:
            view.changed(node)

    def _view_cache(self) -> _ViewCache:
        view = self._view
        if view is None:
            view = self._view = _ViewCache(self._members, self._self)
        return view

    def _set_state(self, node: _Node, state: MemberState, now: float) -> None:
        self._changed(node)
        old = node.state
        if old is state:
            return
        counts = self._counts
        counts[old] -= 1
        counts[state] += 1
        node.state = state
        node.state_since = now
        if old is _SUSPECT:
            node.suspicion = None

    ################################################################################
    # Sending
    ################################################################################

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _emit(
        self, destination: Address, payload: bytes, reliable: bool, out: list[Output]
    ) -> None:
        counters = self._counters
        counters.packets_sent += 1
        counters.bytes_sent += len(payload)
        out.append(Send(destination, payload, reliable))

    def _send_packet(
        self,
        destination: Address,
        first: bytes,
        out: list[Output],
        second: bytes | None = None,
        *,
        budget: int | None = None,
    ) -> int:
        """A datagram: `first` (and `second`), then as many queued updates as fit.

        `budget` caps the packet below `packet_budget` (a reply that must not be bigger
        than its request, `swim._reply`): piggybacked updates fill only what is left,
        and a packet whose own messages do not fit is not sent. Returns its size (0:
        not sent).
        """
        if second is None:
            parts = [first]
            used = len(first)
        else:
            parts = [first, second]
            used = len(first) + len(second)
        limit = self._config.packet_budget
        if budget is not None:
            if packet_size(used, len(parts)) > budget:
                return 0
            limit = min(limit, budget)
        broadcasts = self._broadcasts
        if len(broadcasts) and PACKET_OVERHEAD + used < limit:
            extra = broadcasts.get_broadcasts(PACKET_OVERHEAD + used, limit, self.num_alive())
            parts.extend(extra)
            used += sum(map(len, extra))
        app = self._app_broadcasts
        if len(app) and PACKET_OVERHEAD + used < limit:
            parts.extend(app.get_broadcasts(PACKET_OVERHEAD + used, limit, self.num_alive()))
        packet = encode_packet(parts)
        self._emit(destination, packet, False, out)
        return len(packet)

    def _broadcast(self, name: str, payload: bytes, now: float, extra: int = 0) -> None:
        """Queue an update for piggybacking, and wake gossip up if it was idle."""
        self._broadcasts.queue(name, payload, extra)
        if self._gossip_at is None:
            self._gossip_at = self._gossip_time_after(now, strictly=False)

    def _broadcast_self(self, now: float) -> None:
        me = self._self
        self._broadcast_alive(me.name, me.incarnation, me.address, me.meta, now)

    def _broadcast_alive(
        self, name: str, incarnation: int, address: Address, meta: bytes, now: float
    ) -> None:
        """Queue an alive rumor: lean (`AliveRef`) when the metadata is large.

        Gossip re-sends a rumor `retransmit_limit` times from every member, and a
        member receives each one many times; the record itself needs to reach each
        member once, which a pull does (see `_on_alive_ref`). A lean rumor is a few
        times smaller, so it is also sent `retransmit_mult` more times, as if the
        cluster were ten times larger: at 99 members 8 sends each leave about one
        pair in 3,000 unaware of a new member (e^-8), which a start storm of 100 hits
        several times (measured in the simulator); 12 make it about one in 160,000.
        """
        if len(meta) > self._config.lean_alive_meta_min:
            rumor = encode_message(AliveRef(name, incarnation, address, meta_digest(meta)))
            self._broadcast(name, rumor, now, self._config.retransmit_mult)
        else:
            self._broadcast(name, encode_message(Alive(name, incarnation, address, meta)), now)

    def _gossip_time_after(self, now: float, *, strictly: bool) -> float:
        """The next point of this node's gossip grid (phase + k * interval) at/after now."""
        phase = self._gossip_phase
        interval = self._config.gossip_interval
        if now < phase:
            return phase
        steps = math.floor((now - phase) / interval)
        at = phase + steps * interval
        if at < now or (strictly and at <= now):
            at += interval
        return at

    def _random_nodes(self, k: int, exclude: str | None, gossip: bool) -> list[_Node]:
        """Up to k distinct random members other than us and `exclude`.

        `gossip=False` takes alive members only (indirect probes, push-pull);
        `gossip=True` also takes suspect ones and the dead we still retain, since they
        may be alive behind a partition and need to hear the news to refute it.
        """
        if k <= 0:
            return []
        names = self._names
        members = self._members
        me = self._name
        size = len(names)
        if size <= _SAMPLE_FILTER_MAX:

            def eligible(node: _Node | None) -> bool:
                if node is None or node.name == me or node.name == exclude:
                    return False
                state = node.state
                return state is _ALIVE or (gossip and (state is _SUSPECT or state is _DEAD))

            candidates = []
            for name in dict.fromkeys(names):
                node = members.get(name)
                if eligible(node):
                    assert node is not None
                    candidates.append(node)
            if len(candidates) <= k:
                self._rng.shuffle(candidates)
                return candidates
            return self._rng.sample(candidates, k)
        picked: list[_Node] = []
        rng_random = self._rng.random
        # A plain list when nothing is shared with a `SharedView` (no call per index);
        # the eligibility test written out: this runs for every gossip round.
        lookup = names if names.base_len else names.extra
        for _ in range(3 * k + 16):
            node = members.get(lookup[int(rng_random() * size)])
            if node is None:
                continue
            name = node.name
            if name in (me, exclude):
                continue
            state = node.state
            if (
                state is _ALIVE or (gossip and (state is _SUSPECT or state is _DEAD))
            ) and node not in picked:
                picked.append(node)
                if len(picked) == k:
                    break
        return picked

    ################################################################################
    # Where replies go (`swim._reply`)
    ################################################################################

    def _reply_route(self, requester: str, named: Address) -> tuple[Address, int | None] | None:
        """Where to answer `requester`'s message of this packet, and its byte budget
        (None: a full answer), or None (counted) to leave it unanswered."""
        if self._in_another_name(requester):
            return None
        node = self._members.get(requester)
        held = node.address if node is not None and node is not self._self else None
        route = reply_route(held, named, self._source, self._reliable)
        if route is None:
            self._counters.replies_refused += 1  # over a stream from another host
            return None
        destination, capped = route
        return destination, self._capped_left if capped else None

    def _in_another_name(self, requester: str) -> bool:
        """The authenticated sender is not `requester` (counted): refuse the message."""
        sender = self._sender
        if sender is not None and sender != requester:
            self._counters.replies_refused += 1
            return True
        return False

    def _spent(self, budget: int | None, sent: int) -> None:
        """Count a reply of `sent` bytes against this packet's budget (when capped)."""
        if budget is not None:
            if sent == 0:
                self._counters.replies_refused += 1  # nothing fits the request's size
            else:
                self._counters.replies_capped += 1
            self._capped_left -= sent

    def _reply_packet(
        self, route: tuple[Address, int | None], first: bytes, out: list[Output]
    ) -> None:
        """A datagram reply (an ack): piggybacked updates only within its budget."""
        destination, budget = route
        self._spent(budget, self._send_packet(destination, first, out, budget=budget))

    def _reply_built(
        self,
        route: tuple[Address, int | None],
        build: Callable[[int], bytes],
        count: int,
        reliable: bool,
        out: list[Output],
    ) -> None:
        """A reply of `count` items (`build(k)`: the packet with the first `k`): whole
        on a full route (over a stream when it came on one, or when it is too big for
        a datagram), else as many items as fit the budget, in one datagram."""
        destination, budget = route
        if budget is None:
            payload = build(count)
            self._emit(
                destination, payload, reliable or len(payload) > self._config.packet_budget, out
            )
            return
        fitted = fit_within(build, count, min(budget, self._config.packet_budget))
        if fitted is not None:
            self._emit(destination, fitted[1], False, out)
        self._spent(budget, 0 if fitted is None else len(fitted[1]))

    ################################################################################
    # Timers (`_Timers` fires them)
    ################################################################################

    def _push_timer(self, deadline: float, kind: int, key: Any) -> None:
        self._timer_counter += 1
        heapq.heappush(self._timers, (deadline, self._timer_counter, kind, key))
