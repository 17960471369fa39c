"""The `TransmitLimitedQueue` as it was before the speed work of issue 8, kept as a model.

`test_broadcast` drives it and the real queue with the same operations and
requires the same packets: the faster queue must pick exactly what this one picked.

Original module docstring: the dissemination component of SWIM (section 4.1).

Updates (alive, suspect, dead, left) are not sent on their own: they are piggybacked on
the pings, acks and gossip packets the protocol sends anyway. Each update is sent a
limited number of times, `retransmit_mult * ceil(log10(n + 1))`, which by the epidemic
argument reaches every member with high probability. The least-sent updates go first
(then the newest), so fresh news spreads fastest; a newer update about a member replaces
the older one still queued, since only the newest state of a member matters.
"""

from __future__ import annotations

from swim._math import retransmit_limit

#: Stop filling a packet once less room than this is left: no message is smaller.
_ROOM_MIN = 8
#: Give up on a tier after this many updates in a row that did not fit, so one call
#: stays O(1) even when the queue holds thousands of updates that are all too big.
_MISSES_MAX = 16


class _Item:
    __slots__ = ("id", "name", "payload", "size", "transmits")

    def __init__(self, item_id: int, name: str, payload: bytes) -> None:
        self.id = item_id
        self.name = name
        self.payload = payload
        self.size = len(payload)
        self.transmits = 0


class ReferenceQueue:
    """A bounded queue of encoded updates keyed by member name.

    Items live in tiers by transmit count (a list of insertion-ordered dicts), so picking
    the least-sent first is a walk from tier 0 without sorting. Within a tier the most
    recently queued or promoted update goes first: memberlist orders by creation, which
    needs a sorted tree; this keeps O(1) updates and differs only in ties. Updates too large to ride
    in any packet are kept apart and handed out by `get_oversize`, for reliable sends.
    """

    __slots__ = (
        "_by_name",
        "_count",
        "_evicted",
        "_limit",
        "_max",
        "_next_id",
        "_oversize",
        "_oversize_size",
        "_retransmit_mult",
        "_tiers",
    )

    def __init__(self, retransmit_mult: int, max_items: int, oversize_size: int) -> None:
        """Args:
        retransmit_mult: `SwimConfig.retransmit_mult`.
        max_items: the bound; beyond it the most-sent, then oldest, updates are evicted.
        oversize_size: updates larger than this never fit in a packet.
        """
        self._retransmit_mult = retransmit_mult
        self._max = max_items
        self._oversize_size = oversize_size
        self._by_name: dict[str, _Item] = {}
        self._tiers: list[dict[int, _Item]] = [{}]
        self._oversize: dict[int, _Item] = {}
        self._next_id = 0
        self._count = 0
        self._evicted = 0
        #: (n, transmit limit at n) of the last call: n rarely changes between calls.
        self._limit = (-1, 0)

    def __len__(self) -> int:
        return self._count

    @property
    def evicted(self) -> int:
        """Updates dropped because the queue was full, since creation."""
        return self._evicted

    def transmit_limit(self, n: int) -> int:
        """How many times each update is sent in a cluster of `n` live members."""
        return retransmit_limit(self._retransmit_mult, n)

    def queue(self, name: str, payload: bytes) -> None:
        """Queue an encoded update about member `name`, replacing any older one."""
        old = self._by_name.get(name)
        if old is not None:
            self._remove(old)
        item = _Item(self._next_id, name, payload)
        self._next_id += 1
        self._by_name[name] = item
        if item.size > self._oversize_size:
            self._oversize[item.id] = item
        else:
            self._tiers[0][item.id] = item
        self._count += 1
        while self._count > self._max:
            self._evict_one()

    def invalidate(self, name: str) -> bool:
        """Drop the queued update about `name`, if any. Returns whether one was queued."""
        item = self._by_name.get(name)
        if item is None:
            return False
        self._remove(item)
        return True

    def pending(self, name: str) -> bytes | None:
        """The queued update about `name`, if any (for tests and invariants)."""
        item = self._by_name.get(name)
        return None if item is None else item.payload

    def get_broadcasts(self, overhead: int, limit: int, n: int) -> list[bytes]:
        """Pick updates for one packet: least-sent first, then newest.

        Each picked update counts one transmission and leaves the queue at its limit.

        Args:
            overhead: bytes of the packet already spoken for.
            limit: the packet budget.
            n: live members, for the transmit limit.

        Returns:
            Encoded updates whose sizes sum to at most `limit - overhead`.
        """
        room = limit - overhead
        if self._count == len(self._oversize) or room < _ROOM_MIN:
            return []
        last_n, transmit_limit = self._limit
        if n != last_n:
            transmit_limit = retransmit_limit(self._retransmit_mult, n)
            self._limit = (n, transmit_limit)
        tiers = self._tiers
        picked: list[_Item] = []
        for transmits, tier in enumerate(tiers):
            if not tier:
                continue
            if transmits >= transmit_limit:
                # The cluster shrank: these were already sent enough.
                for item in list(tier.values()):
                    self._remove(item)
                continue
            misses = 0
            for item in reversed(tier.values()):
                if item.size <= room:
                    picked.append(item)
                    room -= item.size
                    if room < _ROOM_MIN:
                        break
                else:
                    misses += 1
                    if misses >= _MISSES_MAX:
                        break
            if room < _ROOM_MIN:
                break
        payloads = [item.payload for item in picked]
        # Promote oldest first, so the newest stays ahead within its next tier too.
        for item in reversed(picked):
            del tiers[item.transmits][item.id]
            item.transmits += 1
            if item.transmits >= transmit_limit:
                del self._by_name[item.name]
                self._count -= 1
            else:
                if item.transmits == len(tiers):
                    tiers.append({})
                tiers[item.transmits][item.id] = item
        return payloads

    def get_oversize(self, n: int) -> list[bytes]:
        """All updates too big for a packet, each counting one transmission.

        The caller sends each as its own reliable message.
        """
        if not self._oversize:
            return []
        transmit_limit = retransmit_limit(self._retransmit_mult, n)
        payloads = []
        for item in list(self._oversize.values()):
            payloads.append(item.payload)
            item.transmits += 1
            if item.transmits >= transmit_limit:
                self._remove(item)
        return payloads

    def _remove(self, item: _Item) -> None:
        if item.size > self._oversize_size:
            del self._oversize[item.id]
        else:
            del self._tiers[item.transmits][item.id]
        del self._by_name[item.name]
        self._count -= 1

    def _evict_one(self) -> None:
        for tier in reversed(self._tiers):
            if tier:
                self._remove(next(iter(tier.values())))
                self._evicted += 1
                return
        self._remove(next(iter(self._oversize.values())))
        self._evicted += 1
