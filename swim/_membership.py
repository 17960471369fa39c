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
"""

from __future__ import annotations

import heapq
import math
import random
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import filterfalse
from operator import itemgetter
from typing import Any

from ._events import (
    Address,
    AppMessage,
    IncarnationExhausted,
    Member,
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberRecovered,
    MemberState,
    MemberSuspected,
    MemberUpdated,
    Output,
    SelfRefuted,
    Send,
)
from ._faults import FaultHooks
from ._math import (
    push_pull_interval_scaled,
    smoothed_rtt,
    suspicion_confirmations_expected,
    suspicion_timeout_max,
    suspicion_timeout_min,
)
from ._pull import parts_within, pull_answer_route
from ._reply import fit_within, reply_route
from ._state import PRECEDENCE_FAST, Action, Rumor, Subject
from ._stats import Counters, MembershipStatistics
from .app import AppState
from .awareness import Awareness
from .broadcast import TransmitLimitedQueue
from .config import SwimConfig
from .probe import ProbeOrder, ProbeRound
from .suspicion import Suspicion
from .wire import (
    INCARNATION_MAX,
    NAME_LENGTH_MAX,
    PACKET_OVERHEAD,
    Ack,
    Alive,
    AliveRef,
    App,
    Dead,
    DecodeCache,
    DecodeError,
    DigestEntry,
    IndirectPing,
    IntegerRangeError,
    Left,
    Nack,
    Ping,
    Pull,
    PushPull,
    Suspect,
    Sync,
    encode_digest_entry,
    encode_member_entry,
    encode_message,
    encode_packet,
    encode_push_pull,
    encode_sync,
    meta_digest,
    packet_size,
)

_ALIVE = MemberState.ALIVE
_SUSPECT = MemberState.SUSPECT
_DEAD = MemberState.DEAD
_LEFT = MemberState.LEFT

_RUMOR_ALIVE = Rumor.ALIVE.value
_RUMOR_SUSPECT = Rumor.SUSPECT.value
_RUMOR_DEAD = Rumor.DEAD.value
_RUMOR_LEFT = Rumor.LEFT.value
_SUBJECT_UNKNOWN = Subject.UNKNOWN.value
_SUBJECT_SELF = Subject.SELF.value
_SUBJECT_SELF_LEFT = Subject.SELF_LEFT.value
_SUBJECT_OF_STATE = {
    _ALIVE: Subject.ALIVE.value,
    _SUSPECT: Subject.SUSPECT.value,
    _DEAD: Subject.DEAD.value,
    _LEFT: Subject.LEFT.value,
}

_TIMER_SUSPICION = 0
_TIMER_RELAY = 1
_TIMER_REAP = 2
_TIMER_PULL = 3

#: Sends of one pull before it is given up: to the rumor's sender, to the latest other
#: sender heard (or the member), then to the member itself.
_PULL_TRIES = 3

#: Rank of each state at one incarnation, for deciding which side of a sync is newer.
_STATE_RANK = (0, 1, 2, 2)

#: Below this many entries in the member list, random choices filter the whole list;
#: above it they sample random indexes (memberlist's kRandomNodes).
_SAMPLE_FILTER_MAX = 64

_TimerEntry = tuple[float, int, int, Any]
_first = itemgetter(0)
_Handler = Callable[[Any, float, bool, list[Output]], None]


class _Node:
    """One member as we hold it. Mutable and private; `Member` is the public snapshot."""

    __slots__ = (
        "address",
        "digest",
        "entry",
        "incarnation",
        "meta",
        "name",
        "shared",
        "state",
        "state_since",
        "suspicion",
    )

    def __init__(
        self,
        name: str,
        address: Address,
        state: MemberState,
        incarnation: int,
        meta: bytes,
        now: float,
    ) -> None:
        self.name = name
        self.address = address
        self.state = state
        self.incarnation = incarnation
        self.meta = meta
        self.state_since = now
        self.suspicion: Suspicion | None = None
        #: Owned by a `SharedView`, read by many cores: copy before changing it.
        self.shared = False
        #: This member's push-pull entry, encoded; None after any change.
        self.entry: bytes | None = None
        #: This member's sync digest entry, as a tuple and encoded, with the encoded
        #: entry it was made from; valid while that is still `entry` (any change
        #: clears `entry`).
        self.digest: tuple[bytes, DigestEntry, bytes] | None = None

    def entry_hash(self) -> int:
        """CRC-32 of the encoded push-pull entry: tells two records at one incarnation
        apart in a digest (not a defence: every packet is authenticated already)."""
        return self.digest_entry()[3]

    def digest_entry(self) -> DigestEntry:
        """(name, incarnation, state, entry hash), as a peer's digest carries it."""
        cached = self.digest
        if cached is None or cached[0] is not self.entry:
            cached = self._make_digest()
        return cached[1]

    def encoded_digest(self) -> bytes:
        cached = self.digest
        if cached is None or cached[0] is not self.entry:
            cached = self._make_digest()
        return cached[2]

    def _make_digest(self) -> tuple[bytes, DigestEntry, bytes]:
        entry = self.encoded_entry()
        digest = (self.name, self.incarnation, self.state.value, zlib.crc32(entry))
        cached = self.digest = (entry, digest, encode_digest_entry(digest))
        return cached

    def encoded_entry(self) -> bytes:
        entry = self.entry
        if entry is None:
            entry = self.entry = encode_member_entry(
                (self.name, self.address, self.incarnation, self.state, self.meta)
            )
        return entry

    def snapshot(self, rtt: float | None) -> Member:
        return Member(
            self.name, self.address, self.state, self.incarnation, self.meta, self.state_since, rtt
        )


class _Names:
    """Every member name we hold, indexable for O(1) random choice and probe order.

    A base list shared with a `SharedView` (never modified) plus our own appended names,
    so 10,000 primed cores share one 10,000-name list instead of copying it on the
    first join. Reaped names linger until a compaction; lookups skip them.
    """

    __slots__ = ("base", "base_len", "extra")

    def __init__(self, base: list[str], extra: list[str]) -> None:
        self.base = base
        self.base_len = len(base)
        self.extra = extra

    def __len__(self) -> int:
        return self.base_len + len(self.extra)

    def __getitem__(self, index: int) -> str:
        base_len = self.base_len
        return self.base[index] if index < base_len else self.extra[index - base_len]

    def __iter__(self) -> Iterator[str]:
        yield from self.base
        yield from self.extra

    def append(self, name: str) -> None:
        self.extra.append(name)


class _ViewCache:
    """Our whole view as sync digests, built once and reused until the view changes.

    Every sync opens with the digest of every member we hold, and the replier compares
    it with its own; in a steady cluster the view changes far less often than syncs
    arrive (the driver's reconnect loop alone opens one per member every few seconds
    after a crash), so rebuilding the lists per sync was most of the core's time.
    A change to the set of members drops the cache whole; a change to one member's
    record (`Membership._changed`) reaches `changed`, which has the digest patched at
    that member's place and drops the rest. Each part is built on first use.
    """

    __slots__ = (
        "_alive",
        "_digest",
        "_dirty",
        "_nodes",
        "_position",
        "_tuples",
        "digests_merged",
        "me",
        "openings",
    )

    def __init__(self, members: dict[str, _Node], me: _Node) -> None:
        self._nodes = list(members.values())
        self.me = me
        self._digest: list[bytes] | None = None
        self._tuples: set[DigestEntry] | None = None
        self._alive: set[DigestEntry] | None = None
        self._position: dict[str, int] | None = None
        #: Members whose record changed since `_digest` was built or patched.
        self._dirty: list[_Node] = []
        #: Encoded opening packets, by (join, application digest): the same bytes
        #: object goes to every peer until the view changes, so a receiver's
        #: `swim.wire` decode cache finds it by a hash computed once.
        self.openings: dict[tuple[bool, bytes], bytes] = {}
        #: Sync digests merged against this view (see `Membership._merge_digest`).
        self.digests_merged = 0

    def changed(self, node: _Node) -> None:
        """`node`'s record changed (the set of members did not: for that, the view is
        dropped whole). Its digest entry is redone on the next `digest()`, the sets
        are rebuilt when next asked for, and the openings go."""
        if self._digest is not None:
            dirty = self._dirty
            dirty.append(node)
            if len(dirty) > 64 + len(self._nodes) // 8:  # cheaper to rebuild, and bounded
                self._digest = None
                dirty.clear()
        self._tuples = None
        self._alive = None
        self.openings.clear()
        self.digests_merged = 0

    def digest(self) -> list[bytes]:
        """Every member's encoded digest entry, in member order (sync leg 0).

        Patched in place where records changed since the last call: the reconnect
        loop opens a sync after nearly every change of the view (a suspicion, a
        refute), and most of the n entries are the same as last time.
        """
        digest = self._digest
        dirty = self._dirty
        if digest is not None and dirty:
            position = self.position()
            nodes = self._nodes
            for node in dirty:
                at = position.get(node.name)
                if at is None or nodes[at] is not node:  # never: a new member drops the view
                    digest = self._digest = None
                    break
                digest[at] = node.encoded_digest()
        dirty.clear()
        if digest is None:
            # `_Node.encoded_digest` inline where its cache holds (most members, most
            # times): a full build comes after every new or reaped member.
            digest = self._digest = [
                cached[2]
                if (cached := node.digest) is not None and cached[0] is node.entry
                else node.encoded_digest()
                for node in self._nodes
            ]
        return digest

    def tuples(self) -> set[DigestEntry]:
        """Every member's digest entry: a peer's entry equal to one needs nothing."""
        tuples = self._tuples
        if tuples is None:
            tuples = self._tuples = {
                cached[1]
                if (cached := node.digest) is not None and cached[0] is node.entry
                else node.digest_entry()
                for node in self._nodes
            }
        return tuples

    def alive(self) -> set[DigestEntry]:
        """The digest entries of the alive members other than us: a peer's digest
        entry equal to one of these proves nothing new, so merging skips it."""
        alive = self._alive
        if alive is None:
            me = self.me
            alive = self._alive = {
                node.digest_entry()
                for node in self._nodes
                if node.state is _ALIVE and node is not me
            }
        return alive

    def stale_against(self, fresh: _ViewCache) -> str | None:
        """Which built part differs from a freshly built view, if any (invariants)."""
        for part in ("_digest", "_tuples", "_alive", "_position"):
            if getattr(self, part) is not None:
                mine = getattr(self, part[1:])()
                if mine != getattr(fresh, part[1:])():
                    return part[1:]
        return None

    def position(self) -> dict[str, int]:
        """Each member's place in member order, to answer in that order."""
        position = self._position
        if position is None:
            position = self._position = {node.name: i for i, node in enumerate(self._nodes)}
        return position


class _Relay:
    """An indirect probe we run for another member: forward the ack, or send a nack."""

    __slots__ = ("budget", "deadline", "nack", "requester", "requester_seq")

    def __init__(
        self,
        requester: Address,
        requester_seq: int,
        nack: bool,
        deadline: float,
        budget: int | None,
    ) -> None:
        #: Where the answer goes (`swim._reply`), and the most bytes it may have there
        #: (None: a full packet).
        self.requester = requester
        self.requester_seq = requester_seq
        self.nack = nack
        self.deadline = deadline
        self.budget = budget


class _Pull:
    """A member we heard of only by a lean rumor, and whose full record we asked for."""

    __slots__ = ("address", "asked", "deadline", "incarnation", "latest", "tries")

    def __init__(self, incarnation: int, address: Address, asked: Address, deadline: float) -> None:
        #: The newest incarnation a lean rumor told us of: applied at or above it ends
        #: the pull.
        self.incarnation = incarnation
        #: The member's own address (the last-resort source), and who we asked last.
        self.address = address
        self.asked = asked
        #: The last sender of a lean rumor about it: the next one to ask.
        self.latest = asked
        self.deadline = deadline
        self.tries = 1


class SharedView:
    """A converged membership view that many cores can be primed with at once.

    A 10,000-member simulation holds 10,000 views of 10,000 members each. Priming every
    core from one `SharedView` shares the member records between them, copy-on-write:
    a core copies a record only when that member's state changes in its own view, so
    100 million entries cost one dict per core instead of 100 million objects.
    """

    __slots__ = ("counts", "gone", "names", "nodes")

    def __init__(self, members: Iterable[Member], now: float) -> None:
        """Args:
        members: the converged view; suspect members are loaded as alive.
        now: the clock the records' `state_since` starts at.
        """
        self.nodes: dict[str, _Node] = {}
        for member in members:
            state = _ALIVE if member.state is _SUSPECT else member.state
            node = _Node(member.name, member.address, state, member.incarnation, member.meta, now)
            node.shared = True
            self.nodes[member.name] = node
        self.names = list(self.nodes)
        self.counts = [0, 0, 0, 0]
        for node in self.nodes.values():
            self.counts[node.state] += 1
        #: Dead and left members, which get reap timers.
        self.gone = [name for name, node in self.nodes.items() if node.state in (_DEAD, _LEFT)]


class Membership:
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
        # Announce ourselves: whoever we meet first spreads it.
        self._broadcast_self(now)

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

    def num_alive(self) -> int:
        """Members alive or suspect (not dead, not left), ourselves included. O(1)."""
        return self._counts[_ALIVE] + self._counts[_SUSPECT]

    def num_members(self) -> int:
        """Members held in any state, ourselves included. O(1)."""
        return len(self._members)

    def statistics(self) -> MembershipStatistics:
        self._counters.broadcasts_evicted = self._broadcasts.evicted + self._app_broadcasts.evicted
        return self._counters.snapshot()

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
    # Failure detection
    ################################################################################

    def _names_len(self) -> int:
        return len(self._names)

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

    ################################################################################
    # Rumors and the precedence table
    ################################################################################

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

    def _on_suspect(self, message: Suspect, now: float, reliable: bool, out: list[Output]) -> None:
        self._apply(
            _RUMOR_SUSPECT, message.name, message.incarnation, now, out, source=message.source
        )

    def _on_dead(self, message: Dead, now: float, reliable: bool, out: list[Output]) -> None:
        self._apply(_RUMOR_DEAD, message.name, message.incarnation, now, out, source=message.source)

    def _on_app(self, message: App, now: float, reliable: bool, out: list[Output]) -> None:
        config = self._config
        if (
            not config.app_channel_enabled
            or len(message.payload) > max(config.app_payload_size_max, config.app_direct_size_max)
        ):
            self._counters.app_dropped += 1
            return
        self._counters.app_messages_received += 1
        out.append(AppMessage(message.source, message.key, message.payload))

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

    ################################################################################
    # Gossip and anti-entropy
    ################################################################################

    def _gossip(self, now: float, out: list[Output]) -> None:
        """Push queued updates to a few random members (only when there are any)."""
        self._gossip_at = None
        broadcasts = self._broadcasts
        app = self._app_broadcasts
        if not len(broadcasts) and not len(app):
            return
        fanout = self._config.gossip_nodes
        hook = self._faults.gossip_fanout
        if hook is not None:
            fanout = hook(fanout)
        targets = self._random_nodes(fanout, None, gossip=True)
        if not targets:
            # Nobody to tell; a new member arriving queues an update and wakes us.
            return
        n = self.num_alive()
        budget = self._config.packet_budget
        for node in targets:
            parts = broadcasts.get_broadcasts(PACKET_OVERHEAD, budget, n)
            if len(app):
                used = PACKET_OVERHEAD + sum(map(len, parts))
                parts.extend(app.get_broadcasts(used, budget, n))
            if parts:
                self._emit(node.address, encode_packet(parts), False, out)
            oversize = broadcasts.get_oversize(n)
            for payload in oversize:
                self._emit(node.address, encode_packet([payload]), True, out)
            if not parts and not oversize:
                break
        if len(broadcasts) or len(app):
            self._gossip_at = self._gossip_time_after(now, strictly=True)

    def _push_pull(self, now: float, out: list[Output]) -> None:
        if self._left:
            self._push_pull_at = None
            return
        n = self.num_alive()
        self._push_pull_at = now + push_pull_interval_scaled(self._config.push_pull_interval, n)
        # Unlike memberlist, the partner may be a retained dead member: after a
        # partition heals, this is how the two sides find each other again without the
        # driver re-joining (they refute each other's death notices).
        targets = self._random_nodes(1, None, gossip=True)
        if targets:
            self._send_sync_open(targets[0].address, join=False, out=out)

    def _app_digest(self) -> bytes:
        app = self._app_state
        if app is None:
            return b""
        digest = app.digest()
        if len(digest) > self._config.app_digest_size_max:
            self._counters.app_dropped += 1
            return b""
        return digest

    def _app_state_for(self, remote_digest: bytes) -> bytes:
        """Our application state a peer with `remote_digest` lacks, or b"" for none."""
        app = self._app_state
        if app is None:
            return b""
        state = app.state_for(remote_digest)
        if not state:
            return b""
        if len(state) > self._config.app_state_size_max:
            self._counters.app_dropped += 1
            return b""
        self._counters.app_states_sent += 1
        return state

    def _send_sync(
        self,
        route: tuple[Address, int | None],
        leg: int,
        members: Sequence[bytes],
        wanted: Sequence[str],
        app_digest: bytes,
        app_state: bytes,
        reliable: bool,
        out: list[Output],
    ) -> None:
        """A reply leg: whole on a full route, else as many of `members`, then
        `wanted`, as fit its budget, without application state (`swim._reply`)."""
        if route[1] is not None:
            app_state = b""
        name, address, split = self._name, self._address, len(members)

        def build(k: int) -> bytes:
            message = encode_sync(
                leg, False, name, address, (), members[:k], wanted[: max(0, k - split)],
                app_digest, app_state,
            )  # fmt: skip
            return encode_packet([message])

        self._counters.push_pulls_sent += 1
        self._reply_built(route, build, split + len(wanted), reliable, out)

    def _send_sync_open(self, destination: Address, *, join: bool, out: list[Output]) -> None:
        """Leg 0: the digest of our whole view, our own full entry, our app digest."""
        view = self._view_cache()
        key = (join, self._app_digest())
        payload = view.openings.get(key)
        if payload is None:
            if len(view.openings) >= 4:
                view.openings.clear()  # an application digest that keeps changing
            message = encode_sync(
                0,
                join,
                self._name,
                self._address,
                view.digest(),
                [self._self.encoded_entry()],
                (),
                key[1],
                b"",
            )
            payload = view.openings[key] = encode_packet([message])
        self._counters.push_pulls_sent += 1
        self._emit(destination, payload, len(payload) > self._config.packet_budget, out)

    def _on_sync(self, message: Sync, now: float, reliable: bool, out: list[Output]) -> None:
        """Digest-first anti-entropy: merge what came, send only what the peer lacks.

        Where the answer goes is decided before the merge, from the view the packet
        found (its own entry must not vouch for the address it names).
        """
        if self._in_another_name(message.source):
            return
        self._counters.push_pulls_received += 1
        route = None
        if message.leg < 2:
            route = self._reply_route(message.source, message.source_address)
        if message.members:
            self._merge_entries(message.members, message.source, now, out)
        if message.app_state:
            app = self._app_state
            if app is None or len(message.app_state) > self._config.app_state_size_max:
                self._counters.app_dropped += 1
            else:
                self._counters.app_states_merged += 1
                app.merge(message.app_state)
        app_digest = message.app_digest
        if len(app_digest) > self._config.app_digest_size_max:
            self._counters.app_dropped += 1
            app_digest = b""
        if message.leg == 0:
            digest = message.digest
            wanted = self._merge_digest(digest, message.source, now, out)
            # Name to entry, the last one winning if a name comes twice.
            theirs = dict(zip(map(_first, digest), digest, strict=True))
            # A member whose entry the peer holds exactly as we do needs nothing: only
            # the rest go through the comparison below, in member order as before.
            view = self._view_cache()
            differ = view.tuples().difference(theirs.values())
            names = sorted(map(_first, differ), key=view.position().__getitem__)
            members = self._members
            newer: list[bytes] = []
            for name in names:
                node = members[name]
                held = theirs.get(name)
                if held is None:
                    if node.state is _ALIVE or node.state is _SUSPECT:
                        newer.append(node.encoded_entry())
                elif held[1] < node.incarnation:
                    newer.append(node.encoded_entry())
                elif held[1] == node.incarnation:
                    rank, ours = _STATE_RANK[held[2]], _STATE_RANK[node.state]
                    if rank < ours or (rank == ours == 0 and held[3] != node.entry_hash()):
                        # Weaker, or another record at the same incarnation: what the
                        # table does with it is the peer's call (a member refutes a
                        # different record of itself, everyone else ignores it).
                        newer.append(node.encoded_entry())
            if route is not None:
                own_digest = self._app_digest()
                state = self._app_state_for(app_digest) if route[1] is None else b""
                self._send_sync(route, 1, newer, wanted, own_digest, state, reliable, out)
        elif message.leg == 1 and route is not None:
            members = self._members
            entries = [
                members[name].encoded_entry()
                for name in dict.fromkeys(message.wanted)
                if name in members
            ]
            app_state = self._app_state_for(app_digest) if route[1] is None else b""
            if entries or app_state:
                self._send_sync(route, 2, entries, (), b"", app_state, reliable, out)

    def _merge_digest(
        self,
        digest: tuple[tuple[str, int, int, int], ...],
        source: str,
        now: float,
        out: list[Output],
    ) -> list[str]:
        """Apply what a digest alone proves; return the alive members we need in full.

        Suspect, dead and left need no address or metadata, so they are applied here
        (dead as suspect, as in a full merge). An alive entry newer than ours, or about
        a member we do not hold, needs its address and metadata: we ask for it.
        """
        members = self._members
        reaped = self._reaped
        me = self._self
        wanted: list[str] = []
        # An alive entry equal to ours (not our own) proves nothing new: skip it before
        # unpacking. Incarnations only grow, so applying earlier entries cannot make it
        # news; our own entry always goes through (it may call for a refute). Only from
        # the second digest merged against one view: while the view changes between
        # digests (a cluster forming), building that set each time costs more than the
        # loop below, which does nothing with such an entry anyway.
        view = self._view_cache()
        view.digests_merged += 1
        news = filterfalse(view.alive().__contains__, digest) if view.digests_merged > 1 else digest
        for name, incarnation, state, entry_hash in news:
            node = members.get(name)
            if state == 0:
                if node is None:
                    gone = reaped.get(name)
                    if gone is None or incarnation > gone:
                        wanted.append(name)
                elif node is me:
                    # Alive above our incarnation, or another record of us at it: the
                    # table's REFUTE and REFUTE_IF_CHANGED, without the full entry.
                    if not self._left and (
                        incarnation > me.incarnation
                        or (incarnation == me.incarnation and entry_hash != me.entry_hash())
                    ):
                        self._refute(incarnation, now, out)
                elif incarnation > node.incarnation:
                    wanted.append(name)
            elif node is None:
                continue  # news about a member we do not hold: nothing to apply
            elif state == 3:
                self._apply(_RUMOR_LEFT, name, incarnation, now, out)
            else:
                self._apply(_RUMOR_SUSPECT, name, incarnation, now, out, source=source)
        return wanted

    def _send_push_pull(
        self, route: tuple[Address, int | None], *, reliable: bool, out: list[Output]
    ) -> None:
        """Our whole view as a push-pull reply, or as much of it as fits its budget."""
        entries = [node.encoded_entry() for node in self._members.values()]
        name, address = self._name, self._address

        def build(k: int) -> bytes:
            return encode_packet([encode_push_pull(False, True, name, address, entries[:k])])

        self._counters.push_pulls_sent += 1
        self._reply_built(route, build, len(entries), reliable, out)

    def _on_push_pull(
        self, message: PushPull, now: float, reliable: bool, out: list[Output]
    ) -> None:
        """Merge a full view, as memberlist's mergeState, and answer with ours.

        The protocol's first anti-entropy message, still answered for older peers; we
        open with `Sync`, which sends full entries only where a digest shows a need.
        """
        if self._in_another_name(message.source):
            return
        self._counters.push_pulls_received += 1
        route = None
        if not message.reply:
            route = self._reply_route(message.source, message.source_address)
        self._merge_entries(message.members, message.source, now, out)
        if route is not None:
            self._send_push_pull(route, reliable=reliable, out=out)

    def _merge_entries(
        self,
        entries: tuple[tuple[str, Address, int, int, bytes], ...],
        source: str,
        now: float,
        out: list[Output],
    ) -> None:
        """Apply full member entries through the precedence table (memberlist's mergeState)."""
        members = self._members
        me = self._self
        meta_max = self._config.meta_size_max
        for name, address, incarnation, state, meta in entries:
            if state == 0:  # alive
                node = members.get(name)
                if (
                    node is not None
                    and node.state is _ALIVE
                    and incarnation <= node.incarnation
                    and node is not me
                ):
                    continue  # the common case: nothing new
                if len(meta) > meta_max:
                    self._counters.dropped_invalid += 1
                    continue
                self._apply(_RUMOR_ALIVE, name, incarnation, now, out, address=address, meta=meta)
            elif state == 3:  # left
                self._apply(_RUMOR_LEFT, name, incarnation, now, out)
            else:
                # Suspect, or dead: memberlist prefers to suspect a member another node
                # believes dead, rather than declare it dead on second-hand news.
                self._apply(_RUMOR_SUSPECT, name, incarnation, now, out, source=source)

    ################################################################################
    # Timers
    ################################################################################

    def _push_timer(self, deadline: float, kind: int, key: Any) -> None:
        self._timer_counter += 1
        heapq.heappush(self._timers, (deadline, self._timer_counter, kind, key))

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

    ################################################################################
    # Invariants
    ################################################################################

    def _check_invariants(self) -> None:
        """Assert the core's internal consistency (O(n): tests and simulation only).

        Raises:
            AssertionError: a bug in this module, never bad input.
        """

        def require(condition: bool, what: str) -> None:
            if not condition:
                raise AssertionError(f"swim invariant violated on {self._name!r}: {what}")

        counts = [0, 0, 0, 0]
        in_list = set(self._names)
        for name, node in self._members.items():
            require(node.name == name, f"member {name!r} filed under another name")
            counts[node.state] += 1
            require(
                (node.suspicion is not None) == (node.state is _SUSPECT),
                f"{name!r} suspicion timer does not match state {node.state.name}",
            )
            require(node.incarnation >= 0, f"{name!r} has a negative incarnation")
            fresh = encode_member_entry(
                (node.name, node.address, node.incarnation, node.state, node.meta)
            )
            require(node.entry in (None, fresh), f"{name!r} has a stale push-pull entry")
            require(name in in_list, f"{name!r} missing from the sampling list")
            require(not node.suspicion or not node.shared, f"{name!r} shared yet suspected")
        require(counts == self._counts, f"state counts {self._counts} != actual {counts}")
        require(
            all(name in self._members and rtt >= 0.0 for name, rtt in self._rtt.items()),
            "an RTT is kept for a member we do not hold, or is negative",
        )
        require(self._members.get(self._name) is self._self, "our own entry is missing")
        view = self._view
        me = self._self
        if view is not None:
            fresh_view = _ViewCache(self._members, self._self)
            require(view.stale_against(fresh_view) is None, "the cached sync digest is stale")
            for (join, app_digest), payload in view.openings.items():
                fresh_opening = encode_packet(
                    [
                        encode_sync(
                            0,
                            join,
                            self._name,
                            self._address,
                            fresh_view.digest(),
                            [
                                encode_member_entry(
                                    (me.name, me.address, me.incarnation, me.state, me.meta)
                                )
                            ],
                            (),
                            app_digest,
                            b"",
                        )
                    ]
                )
                require(payload == fresh_opening, "a cached sync opening is stale")
        require(
            self._self.state is (_LEFT if self._left else _ALIVE),
            f"our own state is {self._self.state.name}",
        )
        require(len(self._relays) <= self._config.indirect_pending_max, "too many relays")
        require(len(self._pulls) <= self._config.pull_pending_max, "too many pulls")
        require(not self._pull_batch, "pulls gathered but not sent")
        require(self._name not in self._pulls, "pulling our own record")
        require(len(self._broadcasts) <= self._config.broadcast_queue_max, "queue over bound")
        score = self._awareness.score
        require(0 <= score < self._config.awareness_max_multiplier, "awareness out of range")
        require(self._config.awareness_enabled or score == 0, "awareness moved while disabled")
        probe = self._probe
        if probe is not None:
            require(probe.timeout_at <= probe.round_end, "probe timeout after its round end")
            require(probe.nacks_received <= probe.nacks_expected, "more nacks than asked for")
        require(
            len(self._app_broadcasts) <= self._config.app_broadcast_queue_max,
            "application queue over bound",
        )
        queued = len(self._broadcasts) + len(self._app_broadcasts)
        if queued and self._gossip_at is None and not self._left:
            require(
                not any(
                    node is not self._self and node.state is not _LEFT
                    for node in self._members.values()
                ),
                "updates queued, gossip targets exist, but gossip is idle",
            )
