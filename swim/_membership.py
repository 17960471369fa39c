"""`Membership`: the SWIM + Lifeguard membership protocol as a sans-IO state machine.

The core owns no socket, clock or global random generator. Its driver (the Trio daemon,
the simulator, a test) feeds it received packets and the current time, and applies what
comes back: `Send` outputs to put on the wire and membership events. After every call
the driver asks `next_deadline()` when to call `tick()` next. Because packets are emitted
as bytes, every driver exercises the real codec.

Cost model (the simulator runs 10,000 of these in one process): handling a message or a
tick is O(1) amortized in the cluster size. Counts of members per state are kept up to
date; timers live in a heap with lazy invalidation plus a few scalar deadlines; random
choices sample the member list instead of filtering it; the probe order is shuffled
incrementally. Only push-pull, `members()` and `prime()` are O(n), and they are rare.

The class is one chain of layers, each a module that adds one mechanism and calls only
the layers below it (memberlist keeps state, net and queue apart in the same way):

    _core._Core                 state, record upkeep, sending, where replies go, timers
    _pulling._Pulling           pulls of full records after lean rumors
    _rumors._Rumors             rumors through the precedence table, refutes
    _probing._Probing           probe rounds, probes answered and relayed
    _anti_entropy._AntiEntropy  gossip rounds, sync and push-pull
    _timers._Timers             relays, pulls, suspicions and reaps when due
    _invariants._Invariants     the consistency check (tests and simulation)
    Membership                  the public API: receive, tick, join, leave, ...

One chain, not mixins side by side: every call stays a plain method on `self` (no
indirection per packet), and mypyc can still compile the whole (`benchmarks/sim_speed.py
--compiled`), which allows multiple inheritance only of traits.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ._events import Address, AppMessage, Member, Output
from ._invariants import _Invariants
from ._math import push_pull_interval_scaled
from ._records import _ALIVE, _DEAD, _LEFT, _SUSPECT, _TIMER_REAP, SharedView, _Names
from ._stats import MembershipStatistics
from .app import AppState
from .config import SwimConfig
from .wire import (
    NAME_LENGTH_MAX,
    PACKET_OVERHEAD,
    Ack,
    Alive,
    AliveRef,
    App,
    Dead,
    DecodeCache,
    DecodeError,
    IndirectPing,
    IntegerRangeError,
    Left,
    Nack,
    Ping,
    Pull,
    PushPull,
    Suspect,
    Sync,
    encode_message,
    encode_packet,
)

_Handler = Callable[[Any, float, bool, list[Output]], None]


class Membership(_Invariants):
    """One node's view of the cluster, and the protocol that keeps it current.

    Every method that takes `now` may emit outputs and move deadlines: after each call
    the driver sends the returned `Send`s, hands the events to the application, and
    sleeps until `next_deadline()` or the next packet, whichever comes first.
    """

    def __init__(
        self,
        config: SwimConfig,
        name: str,
        address: Address,
        rng: random.Random,
        now: float,
        *,
        meta: bytes = b"",
        incarnation: int = 0,
        faults: object | None = None,
        check_invariants: bool = False,
        app_state: AppState | None = None,
        decode_cache: DecodeCache | None = None,
    ) -> None:
        """Args:
        config: protocol settings.
        name: this member's unique name in the cluster.
        address: where other members reach us; carried in our messages so replies
            reach us even when a message travelled over a stream from an ephemeral port.
        rng: the only source of randomness; seed it to make a run reproducible.
        now: the driver's monotonic clock, seconds.
        meta: our metadata, at most `config.meta_size_max` bytes.
        incarnation: start here; a restarted member passes a value above its last one
            when it knows it (if not, it refutes up as soon as it hears of its past).
        faults: simulator fault hooks (see `swim._faults.Faults`), or None.
        check_invariants: run `_check_invariants()` after every call (also enabled by
            `config.check_invariants`).
        app_state: the application's anti-entropy section (see `swim.app.AppState`),
            used only with `config.app_channel_enabled`; None: no section.
        decode_cache: where large packets (sync digests) are remembered once decoded
            (`swim.wire.DecodeCache`); None: a cache of our own. A driver running many
            cores in one process (the simulator) may share one between them.

        Raises:
            ValueError: for metadata over the limit, or an incarnation outside
                0..`swim.wire.INCARNATION_MAX`.
        """
        super().__init__(
            config,
            name,
            address,
            rng,
            now,
            meta=meta,
            incarnation=incarnation,
            faults=faults,
            check_invariants=check_invariants,
            app_state=app_state,
            decode_cache=decode_cache,
        )
        self._handlers: dict[type[Any], _Handler] = {
            Ping: self._on_ping,
            IndirectPing: self._on_indirect_ping,
            Ack: self._on_ack,
            Nack: self._on_nack,
            Alive: self._on_alive,
            Suspect: self._on_suspect,
            Dead: self._on_dead,
            Left: self._on_left,
            PushPull: self._on_push_pull,
            App: self._on_app,
            Sync: self._on_sync,
            AliveRef: self._on_alive_ref,
            Pull: self._on_pull,
        }

    ################################################################################
    # Public API
    ################################################################################

    @property
    def name(self) -> str:
        return self._name

    @property
    def address(self) -> Address:
        return self._address

    @property
    def incarnation(self) -> int:
        """Our own incarnation: raised by refutes and metadata changes, never lowered."""
        return self._self.incarnation

    @property
    def meta(self) -> bytes:
        return self._self.meta

    @property
    def awareness(self) -> int:
        """Lifeguard's health score, 0 (healthy) .. awareness_max_multiplier-1."""
        return self._awareness.score

    @property
    def config(self) -> SwimConfig:
        return self._config

    @property
    def has_left(self) -> bool:
        return self._left

    @property
    def leave_announced(self) -> bool:
        """After `leave`: whether our "left" has been sent as often as it will be.

        True once the rumor has left the broadcast queue (sent its transmit limit,
        `retransmit_mult * ceil(log10(n + 1))` times, as piggyback or gossip), or when
        no live member remains to tell. The driver can then stop: what is still queued
        is other members' news. `next_deadline()` is no such signal, since other
        members' timers (suspicions, reaping) and their rumors keep it busy. O(1).
        """
        return self._left and (
            self._broadcasts.pending(self._name) is None or self.num_alive() == 0
        )

    def join(self, seeds: Sequence[Address], now: float) -> list[Output]:
        """Start a push-pull state exchange with each seed.

        The replies (handled by `receive`) merge the seeds' views into ours, and ours
        into theirs, so after one round trip we know the cluster and it knows us.
        A driver retries with other seeds if nothing comes back.
        """
        out: list[Output] = []
        for seed in seeds:
            if seed != self._address:
                self._send_sync_open(seed, join=True, out=out)
                self._join_sync_pending = True
        if self._check:
            self._check_invariants()
        return out

    def receive(
        self,
        source: Address,
        payload: bytes,
        now: float,
        *,
        reliable: bool = False,
        sender: str | None = None,
    ) -> list[Output]:
        """Handle one packet.

        Never raises on bad input: a packet that fails to decode is dropped and counted
        in `statistics().dropped_malformed`, an invalid message in `dropped_invalid`.

        Args:
            source: where the packet came from (for a stream, the connection's remote
                address). Replies go only there or to the requester's held address
                (see `swim._reply` and `swim._pull`), never to an address the message
                alone names.
            payload: the packet bytes.
            now: the driver's clock.
            reliable: the packet came over a stream (TCP); replies to it go the same way.
            sender: the member name the packet's authentication proves sent it, when
                the driver authenticates packets (None: not known).
        """
        counters = self._counters
        counters.packets_received += 1
        counters.bytes_received += len(payload)
        try:
            messages = self._decode_cache.decode(payload)  # `decode_packet` with our cache
        except IntegerRangeError:
            counters.dropped_out_of_range += 1
            return []
        except DecodeError:
            counters.dropped_malformed += 1
            return []
        counters.messages_received += len(messages)
        out: list[Output] = []
        handlers = self._handlers
        members = self._members
        me = self._self
        meta_max = self._config.meta_size_max
        self._source = source
        self._reliable = reliable
        self._sender = sender
        self._capped_left = self._relay_left = len(payload)
        for message in messages:
            cls = type(message)
            if type(message) is Alive or type(message) is AliveRef:
                # Most of what a forming cluster receives: an alive rumor (lean or full)
                # about another member we hold at this incarnation or newer, which the
                # precedence table ignores whatever the state. Skip it before any call.
                node = members.get(message[0])
                if (
                    node is not None
                    and node is not me
                    and message[1] <= node.incarnation
                    and (cls is AliveRef or len(message[3]) <= meta_max)
                ):
                    continue
            handlers[cls](message, now, reliable, out)
        if self._pull_batch:
            self._flush_pulls(out)
        if self._check:
            self._check_invariants()
        return out

    def tick(self, now: float) -> list[Output]:
        """Fire everything due at `now`: probe phases, gossip, push-pull, timers."""
        out: list[Output] = []
        stall = self._stall = self._stalled_for(now) if self._config.stall_guard_enabled else 0.0
        probe = self._probe
        if probe is not None:
            if not probe.indirect and now >= probe.timeout_at:
                if probe.go_indirect(now) > self._config.probe_timeout:
                    self._counters.probes_ended_late += 1
                self._probe_indirect(probe, now, out)
            if now >= probe.round_end:
                if stall and probe.stretch(now, stall):
                    self._counters.probes_stretched += 1
                else:
                    self._probe = None
                    self._probe_failed(probe, now, out)
        if self._next_probe_at is not None and now >= self._next_probe_at:
            if self._probe is None:
                self._start_probe(now, out)
            else:  # a round stretched by a late tick (`ProbeRound.go_indirect`) runs on
                self._next_probe_at = self._probe.round_end
        if self._gossip_at is not None and now >= self._gossip_at:
            self._gossip(now, out)
        if self._push_pull_at is not None and now >= self._push_pull_at:
            self._push_pull(now, out)
        if self._join_sync_at is not None and now >= self._join_sync_at:
            self._join_sync(out)
        timers = self._timers
        while timers and timers[0][0] <= now:
            entry = heapq.heappop(timers)
            if self._timer_valid(entry):
                self._fire_timer(entry, now, out)
        if self._pull_batch:
            self._flush_pulls(out)
        if self._check:
            self._check_invariants()
        return out

    def _stalled_for(self, now: float) -> float:
        """How long this node was stalled before this tick: `now` less the earliest
        deadline due, when that exceeds `stall_threshold`; else 0. A stall costs one
        awareness point (it is evidence that we, not the members, are slow); the probe
        and suspicion timers that expire in the same tick give it back
        (`ProbeRound.stretch`, `Suspicion.postpone`). See docs/protocol.md, "Stalls"."""
        due = self.next_deadline()
        if due is None or now - due <= self._config.stall_threshold:
            return 0.0
        self._counters.stalls += 1
        if self._config.awareness_enabled:
            self._awareness.apply_delta(1)
        return now - due

    def next_deadline(self) -> float | None:
        """When `tick` must next be called, or None when nothing is scheduled.

        May be earlier than necessary (never later); O(log n) amortized.
        """
        # Called after every call the driver makes (every packet): written out flat.
        timers = self._timers
        best: float | None = None
        if timers:
            valid = self._timer_valid
            while timers and not valid(timers[0]):
                heapq.heappop(timers)
            if timers:
                best = timers[0][0]
        deadline = self._next_probe_at
        if deadline is not None and (best is None or deadline < best):
            best = deadline
        probe = self._probe
        if probe is not None:
            deadline = probe.round_end if probe.indirect else probe.timeout_at  # .deadline()
            if best is None or deadline < best:
                best = deadline
        deadline = self._gossip_at
        if deadline is not None and (best is None or deadline < best):
            best = deadline
        deadline = self._push_pull_at
        if deadline is not None and (best is None or deadline < best):
            best = deadline
        deadline = self._join_sync_at
        if deadline is not None and (best is None or deadline < best):
            best = deadline
        return best

    def leave(self, now: float) -> list[Output]:
        """Leave gracefully: gossip that we left (not failed), and stop probing.

        Besides the rumor, the returned outputs hold one datagram carrying only our
        `left` for every member we hold as alive or suspect (see `_tell_left_directly`).
        The driver should send them, then keep receiving and calling `tick` until
        `leave_announced` is True (a few gossip intervals) so the news spreads, then
        shut down.
        """
        if self._left:
            return []
        self._left = True
        self._set_state(self._self, _LEFT, now)
        self._probe = None
        self._next_probe_at = None
        self._push_pull_at = None
        self._join_sync_at = None
        left = encode_message(Left(self._name, self._self.incarnation))
        self._broadcast(self._name, left, now)
        out: list[Output] = []
        self._gossip(now, out)
        self._tell_left_directly(left, out)
        if self._check:
            self._check_invariants()
        return out

    def _tell_left_directly(self, left: bytes, out: list[Output]) -> None:
        """Send our `left` once, alone in its datagram, to every live member we hold.

        The rumor is gossiped a bounded number of times, so at N = 100 a survivor can
        miss every copy; it then learns only when its own probe round reaches us (the
        `left_reminders` path) or at a push-pull, which can take minutes. One datagram
        per member (the cost of one probe round, bounded by the members we hold) makes
        the epidemic a second chance rather than the only one. Dead members are
        skipped: they are not waiting on us. Nothing is piggybacked, so each datagram
        is the same few dozen bytes.
        """
        packet = encode_packet([left])
        me = self._self
        for node in self._members.values():
            if node is not me and (node.state is _ALIVE or node.state is _SUSPECT):
                self._counters.leaves_sent_direct += 1
                self._emit(node.address, packet, False, out)

    def set_meta(self, meta: bytes, now: float) -> list[Output]:
        """Publish new metadata: a new incarnation carries it, so it wins everywhere.

        Raises:
            ValueError: metadata over `meta_size_max`, or after `leave`.
        """
        if self._left:
            raise ValueError("cannot change metadata after leaving")
        if len(meta) > self._config.meta_size_max:
            raise ValueError(
                f"meta is {len(meta)} bytes, over meta_size_max={self._config.meta_size_max}"
            )
        self._self.meta = meta
        out: list[Output] = []
        self._outbid(self._self.incarnation, now, out)
        self._changed(self._self)
        self._broadcast_self(now)
        if self._check:
            self._check_invariants()
        return out

    def broadcast_app(self, key: str, payload: bytes, now: float) -> list[Output]:
        """Queue an application broadcast, piggybacked after membership rumors.

        Sent `retransmit_mult * ceil(log10(n + 1))` times, least-sent first, like a
        rumor; a newer broadcast under the same `key` replaces a queued older one.
        Receivers get an `AppMessage` per receipt and are not re-gossiped to by the
        core: an application that wants epidemic spread re-broadcasts what is new to it.

        Raises:
            ValueError: the channel is off, we left, the key is too long, or the
                payload is over `app_payload_size_max` or does not fit a packet.
        """
        config = self._config
        if not config.app_channel_enabled:
            raise ValueError("the application channel is off (SwimConfig.app_channel_enabled)")
        if self._left:
            raise ValueError("cannot broadcast after leaving")
        if len(key) > NAME_LENGTH_MAX:
            raise ValueError(f"key is {len(key)} characters, over {NAME_LENGTH_MAX}")
        if len(payload) > config.app_payload_size_max:
            raise ValueError(
                f"payload is {len(payload)} bytes, over "
                f"app_payload_size_max={config.app_payload_size_max}"
            )
        encoded = encode_message(App(self._name, key, payload))
        if len(encoded) > config.packet_budget - PACKET_OVERHEAD:
            raise ValueError(
                f"encoded broadcast is {len(encoded)} bytes, over the packet budget "
                f"({config.packet_budget} - {PACKET_OVERHEAD})"
            )
        self._app_broadcasts.queue(key, encoded)
        self._counters.app_messages_queued += 1
        if self._gossip_at is None:
            self._gossip_at = self._gossip_time_after(now, strictly=False)
        if self._check:
            self._check_invariants()
        return []

    def send_app(self, to: str, key: str, payload: bytes, now: float) -> list[Output]:
        """Send an application message to one member, not gossiped: it rides a
        datagram (with queued rumors piggybacked) when it fits one, else a reliable
        stream. The receiver gets an `AppMessage`, as for a broadcast.

        Raises:
            ValueError: the channel is off, we left, `to` is unknown, the key is too
                long, or the payload is over `app_direct_size_max`.
        """
        config = self._config
        if not config.app_channel_enabled:
            raise ValueError("the application channel is off (SwimConfig.app_channel_enabled)")
        if self._left:
            raise ValueError("cannot send after leaving")
        node = self._members.get(to)
        if node is None or to == self._name:
            raise ValueError(f"no member {to!r} to send to")
        if len(key) > NAME_LENGTH_MAX:
            raise ValueError(f"key is {len(key)} characters, over {NAME_LENGTH_MAX}")
        if len(payload) > config.app_direct_size_max:
            raise ValueError(
                f"payload is {len(payload)} bytes, over app_direct_size_max="
                f"{config.app_direct_size_max}"
            )
        encoded = encode_message(App(self._name, key, payload))
        out: list[Output] = []
        self._counters.app_messages_queued += 1
        if len(encoded) <= config.packet_budget - PACKET_OVERHEAD:
            self._send_packet(node.address, encoded, out)
        else:
            self._emit(node.address, encode_packet([encoded]), True, out)
        return out

    def send_failed(self, destination: Address, payload: bytes, now: float) -> list[Output]:
        """The driver could not deliver a reliable `Send` (e.g. TCP connection refused).

        Counted only: a failed reliable probe simply does not produce the ack that would
        have saved the target, a failed push-pull is retried at the next interval.
        """
        self._counters.send_failures += 1
        return []

    def prime(self, members: Iterable[Member] | SharedView, now: float) -> None:
        """Load members into the view as if a push-pull had delivered them, silently.

        For simulations and tests that start from an already converged cluster (10,000
        members learning each other by gossip would take hours of simulated traffic).
        No events, no broadcasts; members we already know are left as they are, and our
        own entry is always ours. Our pending alive announcement is dropped: the primed
        cluster knows us already. Suspect entries are loaded as alive. Pass a
        `SharedView` to prime many cores cheaply (records are shared copy-on-write).
        """
        view = members if isinstance(members, SharedView) else SharedView(members, now)
        known = self._members
        if len(known) == 1:
            merged = dict(view.nodes)  # C-speed copy: the common, big case
            merged[self._name] = self._self
            self._members = known = merged
            if view.nodes.get(self._name) is None:
                self._names = _Names(view.names, [self._name])
            else:
                self._names = _Names(view.names, [])
            counts = list(view.counts)
            ours = view.nodes.get(self._name)
            if ours is not None:
                counts[ours.state] -= 1
            counts[self._self.state] += 1
            self._counts = counts
            gone = [name for name in view.gone if name != self._name]
        else:
            gone = []
            for name, node in view.nodes.items():
                if name not in known:
                    known[name] = node
                    self._names.append(name)
                    self._counts[node.state] += 1
                    if node.state is _DEAD or node.state is _LEFT:
                        gone.append(name)
        self._view = None
        retention = self._config.dead_retention
        for name in gone:
            self._push_timer(now + retention, _TIMER_REAP, name)
        self._probe_order.restart()
        self._broadcasts.invalidate(self._name)
        if self._push_pull_at is not None:
            # Spread the first exchanges over the interval the primed size calls for.
            interval = push_pull_interval_scaled(self._config.push_pull_interval, self.num_alive())
            self._push_pull_at = now + self._rng.random() * interval
        if len(self._broadcasts) and self._gossip_at is None:
            self._gossip_at = self._gossip_time_after(now, strictly=False)
        if self._check:
            self._check_invariants()

    def members(self) -> list[Member]:
        """Snapshots of every member we hold, ourselves included, dead and left too."""
        rtt = self._rtt
        return [node.snapshot(rtt.get(name)) for name, node in self._members.items()]

    def member(self, name: str) -> Member | None:
        node = self._members.get(name)
        return None if node is None else node.snapshot(self._rtt.get(name))

    def rtt(self, name: str) -> float | None:
        """Smoothed round-trip time of our direct probes of `name`, seconds.

        An EWMA (`swim._math.smoothed_rtt`) of the time from a probe's ping to its ack,
        sampled only when the ack came in the direct phase (before `probe_timeout`), so
        it is the target's own answer and not one relayed by an indirect helper. None
        for ourselves, for members we never probed successfully, and once reaped.
        """
        return self._rtt.get(name)

    def num_members(self) -> int:
        """Members held in any state, ourselves included. O(1)."""
        return len(self._members)

    def statistics(self) -> MembershipStatistics:
        self._counters.broadcasts_evicted = self._broadcasts.evicted + self._app_broadcasts.evicted
        return self._counters.snapshot()

    ################################################################################
    # Application messages received (`broadcast_app` and `send_app` send them)
    ################################################################################

    def _on_app(self, message: App, now: float, reliable: bool, out: list[Output]) -> None:
        config = self._config
        if not config.app_channel_enabled or len(message.payload) > max(
            config.app_payload_size_max, config.app_direct_size_max
        ):
            self._counters.app_dropped += 1
            return
        sender = self._sender
        if sender is not None and message.source != sender:
            self._counters.app_refused_sender += 1  # in another member's name
            return
        self._counters.app_messages_received += 1
        out.append(AppMessage(message.source, message.key, message.payload))
