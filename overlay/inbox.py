"""A bounded, two-lane receive queue: membership traffic first, bulk when there is time.

Why not one Trio memory channel: a FIFO serves a flood of bulk packets before the ack
that would stop a false suspicion. Why not two channels: Trio has no `select`, so a
consumer cannot wait on both and still prefer one. So this is a small queue of its own:
one bounded deque per lane, a `ParkingLot` for the consumer, and strict priority on
receive (the lowest lane number that has something wins).

Within a lane, first in first out while the daemon keeps up; newest first once it falls
behind (`LaneLimit.newest_first_after`, "adaptive LIFO"). Why: a starved daemon's FIFO
turns too little CPU into seconds of latency for every packet, and a ping answered
after its prober gave up, or a suspicion of us read after it became a death, is work
for nothing that costs the member its place in the mesh. Served newest first, the
fresh probe is acked in time and the fresh suspicion refuted; what waited longest
(gossip that its other copies have spread already) waits on, and is what a full lane
drops.

The producers are the socket readers. They must never wait on the consumer, or a slow
daemon would stop reading its socket and the kernel would drop packets blindly, urgent
ones included. So `offer` never blocks: when a lane is full (by count or by bytes) the
packet is dropped and counted for that lane. Memory is bounded by
`sum(max_bytes)` plus one packet per lane, whatever the senders do.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from typing import Literal

import attrs
import trio

from overlay.base import Address

#: Lane for membership-critical messages (acks, nacks, suspicions, refutations).
URGENT = 0
#: Lane for everything else (push-pull state, user payloads).
BULK = 1


#: Classifies a raw payload into a lane (`URGENT` or `BULK`). It runs in the reader task
#: on unauthenticated bytes, so it must be cheap (peek at a type byte) and may raise on
#: garbage: the packet is then dropped and counted as `unclassified`.
Classifier = Callable[[bytes], int]

#: What became of a packet handed to `classify_and_offer`.
Outcome = Literal["queued", "unclassified", "queue_full"]


def bulk_only(payload: bytes) -> int:
    """The default classifier: every packet in the bulk lane (no priority)."""
    return BULK


@attrs.frozen
class Incoming:
    """One packet or frame handed to the daemon.

    Attributes:
        source: who sent it. For UDP the peer's bound (host, port); for TCP the connection's
            remote address, whose port is usually ephemeral, not the peer's listening port.
        payload: the bytes exactly as received, not yet authenticated or decoded.
        reliable: True for a TCP frame, False for a UDP datagram (the core may treat a
            reliable push-pull differently, and the daemon learns TCP reached this peer).
        lane: the lane `classify` put it in (`URGENT` or `BULK`).
        vouch: for a frame on an inbound TCP connection, call it once the payload
            authenticated: the connection then counts as a member's (its keepalives
            renew it, and it is never evicted to make room). None otherwise.
        received_at: `time.monotonic()` when the reader queued it (0: not stamped), so a
            trace can say how long it waited for the driver.
    """

    source: Address
    payload: bytes
    reliable: bool = False
    lane: int = BULK
    vouch: Callable[[], None] | None = attrs.field(default=None, eq=False, repr=False)
    received_at: float = attrs.field(default=0.0, eq=False, repr=False)


@attrs.frozen
class LaneLimit:
    """How much one lane may hold before it drops.

    Attributes:
        max_items: packets queued at most; bounds per-packet overhead.
        max_bytes: payload bytes queued at most; bounds memory when TCP frames are large.
    """

    max_items: int
    max_bytes: int
    #: Seconds the oldest packet may wait before the lane serves the newest first and,
    #: when full, drops its oldest rather than the newcomer; None: always FIFO, and a
    #: full lane drops the newcomer.
    newest_first_after: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.max_items < 1 or self.max_bytes < 1:
            raise ValueError(
                f"lane limits must be positive, got {self.max_items}, {self.max_bytes}"
            )
        if self.newest_first_after is not None and not self.newest_first_after >= 0:
            raise ValueError(
                f"newest_first_after must be None or >= 0 seconds, got {self.newest_first_after}"
            )


@attrs.frozen
class InboxStatistics:
    """Counters of a `PriorityInbox`, one entry per lane (index = lane number).

    Attributes:
        queued: packets waiting now.
        queued_bytes: payload bytes waiting now.
        accepted: packets ever queued.
        dropped_full: packets dropped because the lane was full (count or bytes): the
            newcomer, or in a newest-first lane the oldest waiting.
        delivered: packets ever handed to a consumer.
        newest_first: of those, delivered newest first because the lane was behind.
    """

    queued: tuple[int, ...]
    queued_bytes: tuple[int, ...]
    accepted: tuple[int, ...]
    dropped_full: tuple[int, ...]
    delivered: tuple[int, ...]
    newest_first: tuple[int, ...]


class PriorityInbox:
    """Bounded multi-lane queue with strict priority on receive and drop-on-full on offer.

    Meant for many producers (socket readers) and usually one consumer (the daemon's
    driver loop); several consumers work too, each item goes to exactly one of them.

    Args:
        lanes: one `LaneLimit` per lane; lane 0 is served first.
        clock: monotonic seconds, for how long the oldest packet of a lane has waited.
    """

    def __init__(
        self, lanes: Sequence[LaneLimit], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not lanes:
            raise ValueError("an inbox needs at least one lane")
        self._limits = tuple(lanes)
        self._clock = clock
        # Each lane: (queued at, item), oldest on the left.
        self._queues: tuple[collections.deque[tuple[float, Incoming]], ...] = tuple(
            collections.deque() for _ in lanes
        )
        self._bytes = [0] * len(lanes)
        self._accepted = [0] * len(lanes)
        self._dropped = [0] * len(lanes)
        self._delivered = [0] * len(lanes)
        self._newest_first = [0] * len(lanes)
        self._lot = trio.lowlevel.ParkingLot()
        self._closed = False

    @property
    def lane_count(self) -> int:
        """Number of lanes; valid lanes are `range(lane_count)`."""
        return len(self._limits)

    def offer(self, item: Incoming) -> bool:
        """Queue `item` in its lane, or drop it if that lane is full. Never blocks.

        Returns:
            True if queued; False if dropped (counted in `dropped_full`) or closed.

        Raises:
            ValueError: `item.lane` is not a lane of this inbox (a bug in `classify`).
        """
        lane = item.lane
        if not 0 <= lane < len(self._limits):
            raise ValueError(f"lane {lane} out of range 0..{len(self._limits) - 1}")
        if self._closed:
            return False
        limit = self._limits[lane]
        queue = self._queues[lane]
        size = len(item.payload)
        if limit.newest_first_after is not None and size <= limit.max_bytes:
            # Make room by dropping the oldest: in this lane it is the least useful.
            while len(queue) >= limit.max_items or self._bytes[lane] + size > limit.max_bytes:
                _, oldest = queue.popleft()
                self._bytes[lane] -= len(oldest.payload)
                self._dropped[lane] += 1
        elif len(queue) >= limit.max_items or self._bytes[lane] + size > limit.max_bytes:
            self._dropped[lane] += 1
            return False
        queue.append((self._clock(), item))
        self._bytes[lane] += size
        self._accepted[lane] += 1
        self._lot.unpark()
        return True

    def receive_nowait(self) -> Incoming:
        """Take the most urgent waiting item.

        Raises:
            trio.WouldBlock: nothing is waiting.
            trio.EndOfChannel: closed and drained.
        """
        for lane, queue in enumerate(self._queues):
            if queue:
                behind = self._limits[lane].newest_first_after
                if behind is not None and self._clock() - queue[0][0] > behind:
                    _, item = queue.pop()
                    self._newest_first[lane] += 1
                else:
                    _, item = queue.popleft()
                self._bytes[lane] -= len(item.payload)
                self._delivered[lane] += 1
                return item
        if self._closed:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    async def receive(self) -> Incoming:
        """Wait for and take the most urgent item (lane 0 before lane 1; within a lane
        FIFO, or newest first while the lane is behind).

        Raises:
            trio.EndOfChannel: closed and drained.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            item = self.receive_nowait()
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return item
        while True:
            await self._lot.park()
            try:
                return self.receive_nowait()
            except trio.WouldBlock:
                # Another consumer took it first; wait for the next one.
                continue

    async def receive_batch(self, max_items: int = 64) -> list[Incoming]:
        """Wait for at least one item, then take up to `max_items`, most urgent first.

        A consumer that calls `receive()` per packet gets one packet per scheduling round
        while the UDP reader drains up to 64; under load that is the difference between
        keeping up and dropping. Urgent items still come first: the batch is taken in
        priority order at the moment of the call.

        Raises:
            trio.EndOfChannel: closed and drained.
        """
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items}")
        batch = [await self.receive()]
        while len(batch) < max_items:
            try:
                batch.append(self.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        return batch

    def close(self) -> None:
        """Refuse new items; consumers drain what is queued, then get `EndOfChannel`."""
        self._closed = True
        self._lot.unpark_all()

    def __aiter__(self) -> PriorityInbox:
        return self

    async def __anext__(self) -> Incoming:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def statistics(self) -> InboxStatistics:
        """A snapshot of the per-lane counters."""
        return InboxStatistics(
            queued=tuple(len(q) for q in self._queues),
            queued_bytes=tuple(self._bytes),
            accepted=tuple(self._accepted),
            dropped_full=tuple(self._dropped),
            delivered=tuple(self._delivered),
            newest_first=tuple(self._newest_first),
        )


def classify_and_offer(
    inbox: PriorityInbox,
    classify: Classifier,
    source: Address,
    payload: bytes,
    *,
    reliable: bool,
    vouch: Callable[[], None] | None = None,
) -> Outcome:
    """The one step from a received packet or frame to the inbox, for UDP and TCP alike.

    Classifies `payload` (a classifier that raises on garbage drops it), then offers it
    without blocking. The caller counts the outcome under its own counter names.
    """
    try:
        lane = classify(payload)
    except Exception:
        return "unclassified"
    if inbox.offer(Incoming(source, payload, reliable, lane, vouch, time.monotonic())):
        return "queued"
    return "queue_full"
