"""The discrete-event engine: a virtual clock, an event heap and the nodes it drives.

Theory of operation
-------------------
The engine owns one heap of plain tuples ``(time, seq, kind, a, b, c)``. `seq` comes
from one counter, so the heap has a total order, (time, insertion order), and never
compares the other fields: two runs with the same seed pop the same events in the same
order. There are five kinds of event:

- ``_DELIVER``: a datagram reaches node `a` from address `b` with payload `c`.
- ``_STREAM``: a stream (TCP) message reaches node `a` from node `b`, payload `c`.
- ``_TICK``: node `a` asked to be woken now. Each node has at most one live tick:
  scheduling an earlier one records its `seq` in `tick_seq[a]`, and a popped tick whose
  `seq` differs is stale and skipped (lazy deletion, O(log n) per reschedule).
- ``_PROCESS``: a slow node finally handles a message that arrived earlier.
- ``_CALL``: call `a(b)`; faults, churn and metric sampling use it.

A node is a slot number. Each slot has a `Core` (the swim `Membership`, or any object
with the same methods), a status, and a large random monotonic clock offset: the core
sees ``virtual_time + offset``, so nothing can depend on nodes agreeing on `now`. The
core answers every call with a list of outputs: `Send` outputs go through the
`Network`, events go to the observer (metrics, invariant checks) and into the trace
digest. After every call the engine asks the core for its next deadline and schedules
a tick when that is earlier than the one already scheduled.

The per-packet path is deliberately flat (local variables, no per-packet objects
beyond the heap tuple) because the simulator is how the project looks at clusters of
thousands: the engine's cost per message must stay small next to the core's.

Trace digest: every payload sent is folded into a CRC-32 in send order, every
membership event (time, node, kind, subject, state, incarnation) into a second CRC-32,
and every fault into a BLAKE2b hash; `Simulator.digest()` combines them with the
counters. Two runs with the same seed must produce the same digest. CRCs, because
the digest sits on the per-packet path; they are not there to resist an adversary.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import itertools
import math
import random
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from swim import (
    Address,
    Event,
    Member,
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberRecovered,
    MemberSuspected,
    MemberUpdated,
    Output,
    SelfRefuted,
    Send,
    SharedView,
)

from ._errors import InvariantViolation as InvariantViolation
from ._network import Network
from ._rng import child_rng

__all__ = [
    "Core",
    "CoreFactory",
    "EngineStatistics",
    "Invariant",
    "InvariantViolation",
    "NodeStatus",
    "Observer",
    "Simulator",
    "address_for",
    "name_for",
]

# Event kinds. Plain ints: the hot loop compares them with `==`, which is fastest on
# exact ints (IntEnum members would take the slow comparison path).
_DELIVER = 0
_TICK = 1
_STREAM = 2
_PROCESS = 3
_CALL = 4

# Node modes, kept in a bytearray for the same reason.
_DOWN = 0
_UP = 1
_PAUSED = 2
_SLOW = 3
_LEAVING = 4

_INF = math.inf

_EVENT_KINDS: dict[type, int] = {
    cls: number
    for number, cls in enumerate(
        (
            MemberJoined,
            MemberUpdated,
            MemberSuspected,
            MemberFailed,
            MemberLeft,
            MemberRecovered,
            SelfRefuted,
        )
    )
}


class NodeStatus(enum.IntEnum):
    """What a node is doing, as observers see it."""

    #: Not running: never started, crashed, or gone after a graceful leave.
    DOWN = _DOWN
    #: Running normally.
    UP = _UP
    #: Asleep (a laptop with its lid closed): receives nothing, runs no timers.
    PAUSED = _PAUSED
    #: Running, but handles every incoming message late (CPU starvation).
    SLOW = _SLOW
    #: Announced a graceful leave and lingers briefly to spread it; no longer a member.
    LEAVING = _LEAVING

    @property
    def is_member(self) -> bool:
        """Whether the node is running as a member that everybody should see alive."""
        return self in (NodeStatus.UP, NodeStatus.SLOW)


class Core(Protocol):
    """What the engine needs from a membership core; `swim.Membership` provides it."""

    @property
    def incarnation(self) -> int: ...

    def receive(
        self, source: Address, payload: bytes, now: float, *, reliable: bool = False
    ) -> list[Output]: ...

    def tick(self, now: float) -> list[Output]: ...

    def next_deadline(self) -> float | None: ...

    def join(self, seeds: Sequence[Address], now: float) -> list[Output]: ...

    def leave(self, now: float) -> list[Output]: ...

    def set_meta(self, meta: bytes, now: float) -> list[Output]: ...

    def send_failed(self, destination: Address, payload: bytes, now: float) -> list[Output]: ...


#: Builds a core from (name, address, rng, local now, incarnation).
CoreFactory = Callable[[str, Address, random.Random, float, int], Core]


class Observer(Protocol):
    """Watches a run; the metrics implement this."""

    def on_event(self, now: float, node: int, event: Event) -> None:
        """`node`'s core emitted `event` at virtual time `now`."""

    def on_status(self, now: float, node: int, old: NodeStatus, new: NodeStatus) -> None:
        """`node` changed status (started, crashed, paused, woke, slowed, left)."""


class Invariant(Observer, Protocol):
    """A safety check: sees what observers see, plus every step of every core.

    Raise `InvariantViolation` when the property breaks. Invariants make a run slower,
    so the simulator only has them in safety mode.
    """

    def after_step(self, now: float, node: int, core: Core) -> None:
        """`node`'s core just handled a call (a receive, a tick, a join...)."""


@attrs.frozen
class EngineStatistics:
    """Counters of what the engine did, for reports and for the speed benchmark."""

    events: int
    deliveries: int
    ticks: int
    stale_ticks: int
    messages_sent: int
    bytes_sent: int
    stream_messages: int
    stream_failures: int
    dropped_at_down_node: int
    undeliverable: int


def name_for(index: int, prefix: str = "m") -> str:
    """The name of slot `index`: m00000, m00001, ..."""
    return f"{prefix}{index:05d}"


def address_for(index: int) -> Address:
    """The synthetic address of slot `index`: 10.x.y.z port 7946. It never hits a socket."""
    return (f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}", 7946)


#: Packs one membership event for the digest: time, node, kind, state, incarnation.
_EVENT_RECORD = struct.Struct("<dqBBq")
_pack_event = _EVENT_RECORD.pack


class Simulator:
    """Runs many membership cores over a simulated `Network` in virtual time.

    Args:
        seed: the run's root seed; every node's rng and clock offset derive from it.
        network: decides the fate of every datagram.
        core_factory: builds the core of a node when it starts or restarts.
        offset_range: bounds of each node's random monotonic clock offset, seconds.
        name_prefix: node names are `name_for(index, name_prefix)`.
    """

    def __init__(
        self,
        *,
        seed: int,
        network: Network,
        core_factory: CoreFactory,
        offset_range: tuple[float, float] = (1.0e4, 1.0e7),
        name_prefix: str = "m",
    ) -> None:
        self.seed = seed
        self.network = network
        self.now = 0.0
        self._factory = core_factory
        self._watchers: list[Observer] = []
        # The watchers' and invariants' bound methods, looked up once (called per event
        # and per core call).
        self._on_event: list[Callable[[float, int, Event], None]] = []
        self._after_step: list[Callable[[float, int, Core], None]] = []
        self._offset_rng = child_rng(seed, "clock-offsets")
        self._slow_rng = child_rng(seed, "slow-processing")
        self._offset_range = offset_range
        self._prefix = name_prefix
        self._heap: list[tuple[Any, ...]] = []
        self._counter = itertools.count()
        self._stopping = False
        # Per-slot state, indexed by node number.
        self.names: list[str] = []
        self.addresses: list[Address] = []
        self._index: dict[Address, int] = {}
        self._by_name: dict[str, int] = {}
        self.cores: list[Core | None] = []
        self._mode = bytearray()
        self._offset: list[float] = []
        self._tick_seq: list[int] = []
        self._tick_at: list[float] = []
        self._life: list[int] = []
        self._last_incarnation: list[int] = []
        self._start_incarnation: list[int] = []
        self._slow_delay: list[float] = []
        self._slow_jitter: list[float] = []
        # (seconds per message, seconds per payload byte) a slow node spends on each.
        self._slow_cost: list[tuple[float, float]] = []
        self._busy_until: list[float] = []
        self._paused_from: list[int] = []
        # The mode a stalled node goes back to (`stall`); a stalled node's `_tick_at`
        # is -inf, which also keeps `_reschedule` from giving it a tick.
        self._stalled_from: list[int] = []
        self._sleep: list[tuple[float, bool]] = []
        #: Pauses so far, per node: tells the sleep a wake-up call was made for.
        self._sleeps: list[int] = []
        self.sent_messages: list[int] = []
        self.sent_bytes: list[int] = []
        #: Bytes sent as the daemon would seal them (payload plus envelope); stays 0
        #: unless `set_envelope` gave the engine a way to price the envelope.
        self.sealed_bytes: list[int] = []
        self._envelope: Callable[[int, int | None, bool, float], int] | None = None
        # Counters and digest.
        self._events = 0
        self._deliveries = 0
        self._ticks = 0
        self._stale_ticks = 0
        self._stream_messages = 0
        self._stream_failures = 0
        self._dropped_down = 0
        self._undeliverable = 0
        self._crc = 0
        self._event_crc = 0
        self._trace = hashlib.blake2b(digest_size=16)

    def add_observer(self, observer: Observer) -> None:
        """Tell `observer` about every membership event and status change from now on."""
        self._watchers.append(observer)
        self._on_event.append(observer.on_event)

    def set_envelope(self, overhead: Callable[[int, int | None, bool, float], int]) -> None:
        """Count `sealed_bytes` too: each Send's payload plus `overhead(src, dst, reliable,
        t)` (dst None: an address no node has). The payloads themselves are unchanged."""
        self._envelope = overhead

    def add_invariant(self, invariant: Invariant) -> None:
        """Check `invariant` after every core call from now on (safety mode)."""
        self._watchers.append(invariant)
        self._on_event.append(invariant.on_event)
        self._after_step.append(invariant.after_step)

    ####################################################################################
    # Nodes
    ####################################################################################

    def add_node(self) -> int:
        """Create a slot for one more node (not started yet); returns its number."""
        index = len(self.names)
        name = name_for(index, self._prefix)
        address = address_for(index)
        self.names.append(name)
        self.addresses.append(address)
        self._index[address] = index
        self._by_name[name] = index
        self.cores.append(None)
        self._mode.append(_DOWN)
        self._offset.append(self._offset_rng.uniform(*self._offset_range))
        self._tick_seq.append(-1)
        self._tick_at.append(_INF)
        self._life.append(0)
        self._last_incarnation.append(-1)
        self._start_incarnation.append(0)
        self._slow_delay.append(0.0)
        self._slow_jitter.append(0.0)
        self._slow_cost.append((0.0, 0.0))
        self._busy_until.append(0.0)
        self._paused_from.append(_UP)
        self._stalled_from.append(_UP)
        self._sleep.append((0.0, False))
        self._sleeps.append(0)
        self.sent_messages.append(0)
        self.sent_bytes.append(0)
        self.sealed_bytes.append(0)
        self.network.add_node()
        return index

    @property
    def name_index(self) -> Mapping[str, int]:
        """Node names to slot numbers (read-only; its `get` is the fastest lookup)."""
        return self._by_name

    def index_of(self, name: str) -> int | None:
        """The slot number of the node called `name`, or None for a name never used."""
        return self._by_name.get(name)

    def status(self, node: int) -> NodeStatus:
        return NodeStatus(self._mode[node])

    def local_time(self, node: int) -> float:
        """What `node`'s monotonic clock reads now."""
        return self.now + self._offset[node]

    @property
    def lives(self) -> Sequence[int]:
        """`life(node)` of every node, indexable (read-only; for per-packet callers)."""
        return self._life

    def life(self, node: int) -> int:
        """How many times `node` has been started (1 after the first start)."""
        return self._life[node]

    def start_incarnation(self, node: int) -> int:
        """The incarnation `node`'s current (or last) life started with."""
        return self._start_incarnation[node]

    def nodes_with(self, *statuses: NodeStatus) -> list[int]:
        """Slot numbers of the nodes whose status is one of `statuses`, in order."""
        wanted = {int(status) for status in statuses}
        modes = self._mode
        return [index for index in range(len(modes)) if modes[index] in wanted]

    def start(self, node: int, seeds: Sequence[int] = ()) -> None:
        """Start (or restart) `node` with a fresh core and join it through `seeds`.

        A restarted node keeps its name and address and comes back with an incarnation
        one above the highest its previous life reached, as a node that persists its
        incarnation would.
        """
        if self._mode[node] != _DOWN:
            raise ValueError(f"node {node} is already running")
        self._life[node] += 1
        incarnation = self._last_incarnation[node] + 1
        self._start_incarnation[node] = incarnation
        rng = child_rng(self.seed, "node", node, self._life[node])
        core = self._factory(
            self.names[node], self.addresses[node], rng, self.local_time(node), incarnation
        )
        self.cores[node] = core
        self._busy_until[node] = 0.0
        self._set_mode(node, _UP)
        self._record("start", node, incarnation)
        addresses = [self.addresses[seed] for seed in seeds if seed != node]
        if addresses:
            self._apply(node, core.join(addresses, self.local_time(node)), self.now)
        else:
            self._reschedule(node, core, self.now)

    def rejoin(self, node: int, seeds: Sequence[int]) -> None:
        """Have a running node join again through `seeds` (its first join got lost)."""
        core = self.cores[node]
        addresses = [self.addresses[seed] for seed in seeds if seed != node]
        if core is None or not addresses or self._mode[node] == _PAUSED:
            return
        self._record("rejoin", node, len(addresses))
        self._apply(node, core.join(addresses, self.local_time(node)), self.now)

    def prime(self, node: int, members: Sequence[Member] | SharedView) -> None:
        """Load `members` into a running node's view silently (a pre-formed cluster).

        Needs a core with a ``prime(members, now)`` method, as `swim.Membership` has;
        pass one `swim.SharedView` to many nodes to share the records between them.
        Gossiping 10,000 members into each other's views would dominate a large run;
        priming starts it converged instead.

        Raises:
            TypeError: the core cannot be primed.
        """
        core = self.cores[node]
        prime = getattr(core, "prime", None)
        if core is None or prime is None:
            raise TypeError(f"node {node}'s core cannot be primed")
        prime(members, self.local_time(node))
        self._reschedule(node, core, self.now)

    def crash(self, node: int) -> None:
        """Stop `node` at once: no goodbye, in-flight messages to it are lost."""
        if self._mode[node] == _DOWN:
            return
        core = self.cores[node]
        if core is not None:
            self._last_incarnation[node] = max(self._last_incarnation[node], core.incarnation)
        self.cores[node] = None
        self._tick_seq[node] = -1
        self._tick_at[node] = _INF
        self._record("crash", node, self._last_incarnation[node])
        self._set_mode(node, _DOWN)

    def leave(self, node: int, linger: float = 1.0) -> None:
        """Announce a graceful leave, keep running for `linger` seconds, then stop."""
        core = self.cores[node]
        if core is None or self._mode[node] in (_DOWN, _LEAVING):
            return
        if self._mode[node] == _PAUSED:
            self._wake(node)
        if self._tick_at[node] == -_INF:  # the leave ends a stall (`stall`)
            self._tick_at[node] = _INF
        self._set_mode(node, _LEAVING)
        self._record("leave", node, core.incarnation)
        self._apply(node, core.leave(self.local_time(node)), self.now)
        self.call_at(self.now + linger, self._finish_leave, (node, self._life[node]))

    def _finish_leave(self, arg: tuple[int, int]) -> None:
        node, life = arg
        if self._life[node] == life and self._mode[node] == _LEAVING:
            self.crash(node)

    def pause(self, node: int, duration: float, *, clock_stops: bool = True) -> None:
        """Put `node` to sleep for `duration`: it receives nothing and runs no timers.

        Args:
            clock_stops: the node's monotonic clock does not advance while asleep, as
                CLOCK_MONOTONIC on Linux and mach_absolute_time on macOS behave across
                a suspend; False models a clock that keeps counting (CLOCK_BOOTTIME).
        """
        mode = self._mode[node]
        if mode not in (_UP, _SLOW):
            return
        if self._tick_at[node] == -_INF:  # the pause ends a stall (`stall`)
            mode = self._stalled_from[node]
        self._paused_from[node] = mode
        self._sleep[node] = (self.now, clock_stops)
        self._sleeps[node] += 1
        self._tick_seq[node] = -1
        self._tick_at[node] = _INF
        self._record("pause", node, duration)
        self._set_mode(node, _PAUSED)
        self.call_at(self.now + duration, self._wake_call, (node, self._sleeps[node]))

    def _wake_call(self, arg: tuple[int, int]) -> None:
        node, sleep = arg
        # The same sleep (not an earlier one cut short, nor a crash and a new pause).
        if self._mode[node] == _PAUSED and self._sleeps[node] == sleep:
            self._wake(node)

    def wake(self, node: int) -> None:
        """Wake a paused `node` now, before its sleep would have ended."""
        if self._mode[node] == _PAUSED:
            self._wake(node)

    def _wake(self, node: int) -> None:
        since, clock_stops = self._sleep[node]
        if clock_stops:
            self._offset[node] -= self.now - since
        self._record("wake", node, 0)
        self._set_mode(node, self._paused_from[node])
        core = self.cores[node]
        assert core is not None
        self._apply(node, core.tick(self.local_time(node)), self.now)

    def stall(self, node: int, duration: float) -> None:
        """Starve `node` of CPU for `duration`: it runs no timers and reads nothing,
        while its clock keeps counting and whatever arrives waits, in order, in its
        queue. Waking, it ticks first (its timers are overdue) and reads the queue
        after, as the daemon's driver does with packets not yet in its inbox: the
        case the swim core's stall guard is for (docs/protocol.md, "Stalls").

        The node counts as slow meanwhile (a member, not a failure). Only a node that
        is up or slow, and not stalled already, can stall; a pause, crash or leave
        during the stall ends it.
        """
        mode = self._mode[node]
        if mode not in (_UP, _SLOW) or self._tick_at[node] == -_INF:
            return
        end = self.now + duration
        self._stalled_from[node] = mode
        self._busy_until[node] = max(self._busy_until[node], end)
        self._tick_seq[node] = -1
        self._tick_at[node] = -_INF
        self._record("stall", node, duration)
        if mode == _UP:
            self._set_mode(node, _SLOW)  # what arrives goes to the queue (`_arrive_slow`)
        # Pushed now, so it runs before the messages queued for `end` (their seqs are
        # later): the tick comes before the reads.
        self.call_at(end, self._unstall, (node, self._life[node]))

    def _unstall(self, arg: tuple[int, int]) -> None:
        node, life = arg
        if self._life[node] != life or self._tick_at[node] != -_INF:
            return  # crashed, restarted, paused or left meanwhile
        self._tick_at[node] = _INF
        self._record("unstall", node, 0)
        if self._mode[node] == _SLOW and self._stalled_from[node] == _UP:
            self._set_mode(node, _UP)
        core = self.cores[node]
        assert core is not None
        self._apply(node, core.tick(self.local_time(node)), self.now)

    def set_slow(
        self,
        node: int,
        delay: float,
        *,
        jitter: float = 0.0,
        cost: float = 0.0,
        cost_per_byte: float = 0.0,
    ) -> None:
        """Make `node` handle each incoming message `delay` (plus up to `jitter`) late.

        This is the CPU-starvation model the Lifeguard paper used to provoke false
        positives: the node's timers fire on time, but acks and pings sit in its
        receive queue, in order, until it gets around to them.

        `cost` and `cost_per_byte` make it a CPU as well: each message then holds the
        node for ``cost + cost_per_byte * len(payload)`` seconds, one at a time, so
        that what arrives while it works waits its turn (a daemon's CPU time per
        packet and per byte of records, divided by its share of a shared machine:
        docs/simulations.md, "The cost of a start storm").
        """
        self._slow_cost[node] = (cost, cost_per_byte)
        self._slow_delay[node] = delay
        self._slow_jitter[node] = jitter
        self._record("slow", node, delay)
        if self._tick_at[node] == -_INF:  # stalled: slow once the stall ends
            self._stalled_from[node] = _SLOW
        if self._mode[node] == _UP:
            self._set_mode(node, _SLOW)
        elif self._mode[node] == _PAUSED:
            self._paused_from[node] = _SLOW

    def clear_slow(self, node: int) -> None:
        """Let `node` handle messages promptly again (messages already queued stay late)."""
        self._record("unslow", node, 0)
        if self._tick_at[node] == -_INF:  # stalled: up once the stall ends
            self._stalled_from[node] = _UP
            return
        if self._mode[node] == _SLOW:
            self._set_mode(node, _UP)
        elif self._mode[node] == _PAUSED:
            self._paused_from[node] = _UP

    def set_meta(self, node: int, meta: bytes) -> None:
        """Have `node` publish new metadata (the update whose spread metrics time)."""
        core = self.cores[node]
        if core is None or self._mode[node] == _PAUSED:
            return
        self._record("meta", node, len(meta))
        self._apply(node, core.set_meta(meta, self.local_time(node)), self.now)

    def broadcast_app(self, node: int, key: str, payload: bytes) -> None:
        """Have `node`'s core queue an application broadcast (`Membership.broadcast_app`)
        from outside a core call (a scheduled call), and reschedule its tick so the
        gossip round that carries it happens. Down or sleeping nodes send nothing."""
        core = self.cores[node]
        if core is None or self._mode[node] in (_DOWN, _PAUSED):
            return
        broadcast = getattr(core, "broadcast_app", None)
        if broadcast is None:
            raise TypeError(f"node {node}'s core has no application channel")
        self._apply(node, broadcast(key, payload, self.local_time(node)), self.now)

    def send_app(self, node: int, to: str, key: str, payload: bytes) -> bool:
        """Have `node`'s core send an application message to member `to`
        (`Membership.send_app`) from outside a core call; False when it could not (the
        node is down or asleep, or its core refused: `to` unknown, left, too big)."""
        core = self.cores[node]
        if core is None or self._mode[node] in (_DOWN, _PAUSED):
            return False
        send = getattr(core, "send_app", None)
        if send is None:
            raise TypeError(f"node {node}'s core has no application channel")
        try:
            outputs = send(to, key, payload, self.local_time(node))
        except ValueError:
            return False
        self._apply(node, outputs, self.now)
        return True

    def stalled(self, node: int) -> bool:
        """Whether `node` is starved of CPU right now (`stall`)."""
        return self._tick_at[node] == -_INF

    def _set_mode(self, node: int, mode: int) -> None:
        old = self._mode[node]
        if old == mode:
            return
        self._mode[node] = mode
        if self._watchers:
            old_status, new_status = NodeStatus(old), NodeStatus(mode)
            for watcher in self._watchers:
                watcher.on_status(self.now, node, old_status, new_status)

    ####################################################################################
    # Scheduling
    ####################################################################################

    def call_at(self, when: float, fn: Callable[[Any], object], arg: Any = None) -> None:
        """Call ``fn(arg)`` at virtual time `when` (not before now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._counter), _CALL, fn, arg, None))

    def stop(self) -> None:
        """Make the running `run_until` return after the current event."""
        self._stopping = True

    def run_until(self, end: float) -> bool:
        """Process every event up to virtual time `end`, or until `stop()` is called.

        Returns:
            True when it stopped early because of `stop()`.
        """
        self._stopping = False
        heap = self._heap
        pop = heapq.heappop
        cores = self.cores
        mode = self._mode
        offset = self._offset
        tick_seq = self._tick_seq
        tick_at = self._tick_at
        apply = self._apply
        events = 0
        delivered = 0
        try:
            while heap and heap[0][0] <= end:
                t, seq, kind, a, b, c = pop(heap)
                self.now = t
                events += 1
                if kind == _DELIVER:
                    delivered += 1
                    m = mode[a]
                    if m in (_UP, _LEAVING):
                        core = cores[a]
                        apply(a, core.receive(b, c, t + offset[a]), t)
                    elif m == _SLOW:
                        self._arrive_slow(a, b, c, False)
                    else:
                        self._dropped_down += 1
                elif kind == _TICK:
                    if seq == tick_seq[a]:
                        tick_at[a] = _INF
                        self._ticks += 1
                        apply(a, cores[a].tick(t + offset[a]), t)
                    else:
                        self._stale_ticks += 1
                elif kind == _CALL:
                    a(b)
                elif kind == _STREAM:
                    self._arrive_stream(a, b, c)
                else:  # _PROCESS
                    self._process_late(a)
                if self._stopping:
                    return True
        finally:
            self._events += events
            self._deliveries += delivered
        self.now = max(self.now, end)
        return False

    ####################################################################################
    # The per-call path
    ####################################################################################

    def _apply(self, node: int, outputs: list[Output], t: float) -> None:
        """Carry out one core call's outputs, then reschedule the node's tick."""
        core = self.cores[node]
        if outputs:
            index = self._index
            route = self.network.route
            push = heapq.heappush
            heap = self._heap
            counter = self._counter
            source = self.addresses[node]
            crc = self._crc
            crc32 = zlib.crc32
            count = 0
            size = 0
            envelope = self._envelope
            sealed = 0
            for output in outputs:
                if output.__class__ is Send:
                    payload = output.payload
                    count += 1
                    size += len(payload)
                    crc = crc32(payload, crc)
                    dst = index.get(output.destination)
                    if envelope is not None:
                        sealed += len(payload) + envelope(node, dst, output.reliable, t)
                    if output.reliable:
                        self._send_stream(node, dst, output, t)
                    elif dst is None:
                        self._undeliverable += 1
                    else:
                        for delay in route(node, dst):
                            push(heap, (t + delay, next(counter), _DELIVER, dst, source, payload))
                else:
                    self._emit(t, node, output)  # type: ignore[arg-type]
            self._crc = crc
            self.sent_messages[node] += count
            self.sent_bytes[node] += size
            self.sealed_bytes[node] += sealed
        if core is None or self.cores[node] is not core:
            return
        if self._after_step:
            for after_step in self._after_step:
                after_step(t, node, core)
        self._reschedule(node, core, t)

    def _reschedule(self, node: int, core: Core, t: float) -> None:
        deadline = core.next_deadline()
        if deadline is None or self._mode[node] == _PAUSED:
            return
        offset = self._offset[node]
        when = deadline - offset
        if when < self._tick_at[node]:
            # Make sure the core's clock reads at least `deadline` when the tick fires,
            # whatever the rounding of the offset subtraction did.
            while when + offset < deadline:
                when = math.nextafter(when, _INF)
            if when < t:
                when = t
            seq = next(self._counter)
            self._tick_seq[node] = seq
            self._tick_at[node] = when
            heapq.heappush(self._heap, (when, seq, _TICK, node, None, None))

    def _emit(self, t: float, node: int, event: Event) -> None:
        member = getattr(event, "member", None)
        kind = _EVENT_KINDS.get(event.__class__, 255)
        crc32 = zlib.crc32
        if member is not None:
            record = _pack_event(t, node, kind, member.state, member.incarnation)
            self._event_crc = crc32(member.name.encode(), crc32(record, self._event_crc))
        else:
            incarnation = getattr(event, "incarnation", 0)
            self._event_crc = crc32(_pack_event(t, node, kind, 0, incarnation), self._event_crc)
        for on_event in self._on_event:
            on_event(t, node, event)

    def note(self, what: str, detail: object) -> None:
        """Fold a scenario action (a partition, a loss change) into the trace digest."""
        self._record(what, -1, detail)

    def _record(self, what: str, node: int, detail: object) -> None:
        self._trace.update(f"{self.now!r} {node} !{what} {detail}\n".encode())

    ####################################################################################
    # Streams, slow nodes
    ####################################################################################

    def _send_stream(self, node: int, destination: int | None, send: Send, t: float) -> None:
        self._stream_messages += 1
        delay = None
        if destination is not None and self._mode[destination] in (_UP, _SLOW, _LEAVING):
            delay = self.network.stream_delay(node, destination)
        if delay is None:
            fail_at = t + self.network.config.connect_timeout
            self.call_at(fail_at, self._stream_failed, (node, self._life[node], send))
            return
        heapq.heappush(
            self._heap, (t + delay, next(self._counter), _STREAM, destination, node, send)
        )

    def _arrive_stream(self, node: int, sender: int, send: Send) -> None:
        mode = self._mode[node]
        if mode in (_UP, _LEAVING):
            core = self.cores[node]
            assert core is not None
            outputs = core.receive(
                self.addresses[sender], send.payload, self.local_time(node), reliable=True
            )
            self._apply(node, outputs, self.now)
        elif mode == _SLOW:
            self._arrive_slow(node, self.addresses[sender], send.payload, True)
        else:
            self._stream_failed((sender, self._life[sender], send))

    def _stream_failed(self, arg: tuple[int, int, Send]) -> None:
        node, life, send = arg
        self._stream_failures += 1
        core = self.cores[node]
        if core is None or self._life[node] != life or self._mode[node] == _PAUSED:
            return
        outputs = core.send_failed(send.destination, send.payload, self.local_time(node))
        self._apply(node, outputs, self.now)

    def _arrive_slow(self, node: int, source: Address, payload: bytes, reliable: bool) -> None:
        delay = self._slow_delay[node]
        jitter = self._slow_jitter[node]
        if jitter:
            delay += jitter * self._slow_rng.random()
        when = max(self.now + delay, self._busy_until[node])
        per_message, per_byte = self._slow_cost[node]
        if per_message or per_byte:
            when += per_message + per_byte * len(payload)
        self._busy_until[node] = when
        item = (node, self._life[node], source, payload, reliable)
        heapq.heappush(self._heap, (when, next(self._counter), _PROCESS, item, None, None))

    def _process_late(self, item: tuple[int, int, Address, bytes, bool]) -> None:
        node, life, source, payload, reliable = item
        mode = self._mode[node]
        core = self.cores[node]
        if core is None or self._life[node] != life or mode in (_DOWN, _PAUSED):
            self._dropped_down += 1
            return
        outputs = core.receive(source, payload, self.local_time(node), reliable=reliable)
        self._apply(node, outputs, self.now)

    ####################################################################################
    # Results
    ####################################################################################

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(
            events=self._events,
            deliveries=self._deliveries,
            ticks=self._ticks,
            stale_ticks=self._stale_ticks,
            messages_sent=sum(self.sent_messages),
            bytes_sent=sum(self.sent_bytes),
            stream_messages=self._stream_messages,
            stream_failures=self._stream_failures,
            dropped_at_down_node=self._dropped_down,
            undeliverable=self._undeliverable,
        )

    def digest(self) -> str:
        """A hex digest of everything that happened so far, in order.

        It covers every payload sent, every membership event, every fault and the
        engine's counters: two runs with the same seed give the same digest, and a
        change anywhere in the behaviour almost surely changes it.
        """
        final = self._trace.copy()
        stats = self.statistics()
        final.update(f"{self._crc} {self._event_crc} {stats!r} now={self.now!r}".encode())
        return final.hexdigest()
