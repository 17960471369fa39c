"""`TransmitLimitedQueue`: the dissemination component of SWIM (section 4.1).

Updates (alive, suspect, dead, left) are not sent on their own: they are piggybacked on
the pings, acks and gossip packets the protocol sends anyway. Each update is sent a
limited number of times, `retransmit_mult * ceil(log10(n + 1))`, which by the epidemic
argument reaches every member with high probability. The least-sent updates go first
(then the newest), so fresh news spreads fastest; a newer update about a member replaces
the older one still queued, since only the newest state of a member matters.
"""

from __future__ import annotations

from ._math import retransmit_limit

#: Stop filling a packet once less room than this is left: no message is smaller.
_ROOM_MIN = 8
#: Give up on a tier after this many updates in a row that did not fit, so one call
#: stays O(1) even when the queue holds thousands of updates that are all too big.
_MISSES_MAX = 16


class _Item:
    __slots__ = ("extra", "name", "payload", "size", "transmits")

    def __init__(self, name: str, payload: bytes, extra: int) -> None:
        self.name = name
        self.payload = payload
        self.size = len(payload)
        self.transmits = 0
        #: Sends left beyond the transmit limit (`queue`'s `extra`): each is spent
        #: without leaving tier 0.
        self.extra = extra


class TransmitLimitedQueue:
    """A bounded queue of encoded updates keyed by member name.

    Items live in tiers by transmit count (a list of insertion-ordered dicts, the item
    itself the key), so picking the least-sent first is a walk from tier 0 without
    sorting. Within a tier the most recently queued or promoted update goes first:
    memberlist orders by creation, which needs a sorted tree; this keeps O(1) updates
    and differs only in ties. Updates too large to ride in any packet are kept apart
    and handed out by `get_oversize`, for reliable sends.

    Speed matters here: a forming cluster of 1,000 piggybacks about 13 million update
    copies, each picked by this queue. So the queue counts its items by size, and a
    packet stops being filled as soon as the room left is below the smallest update
    queued (rather than after `_MISSES_MAX` misses in every tier, which gave the same
    packet); and the picked updates of a tier move to the next tier together.
    """

    __slots__ = (
        "_by_name",
        "_count",
        "_evicted",
        "_extra_items",
        "_limit",
        "_max",
        "_oversize",
        "_oversize_size",
        "_retransmit_mult",
        "_sizes",
        "_smallest",
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
        self._tiers: list[dict[_Item, None]] = [{}]
        self._oversize: dict[_Item, None] = {}
        self._count = 0
        self._evicted = 0
        #: Queued items with extra sends left: while none are, `_promote` skips the check.
        self._extra_items = 0
        #: (n, transmit limit at n) of the last call: n rarely changes between calls.
        self._limit = (-1, 0)
        #: How many tiered (not oversize) items there are of each size, and the
        #: smallest of those sizes (None: recompute; 0: none queued).
        self._sizes: dict[int, int] = {}
        self._smallest: int | None = 0

    def __len__(self) -> int:
        return self._count

    @property
    def evicted(self) -> int:
        """Updates dropped because the queue was full, since creation."""
        return self._evicted

    def transmit_limit(self, n: int) -> int:
        """How many times each update is sent in a cluster of `n` live members."""
        return retransmit_limit(self._retransmit_mult, n)

    def queue(self, name: str, payload: bytes, extra: int = 0) -> None:
        """Queue an encoded update about member `name`, replacing any older one.

        `extra`: sends on top of the transmit limit, for updates cheap enough to send
        more often (a lean alive rumor); they come first, as tier-0 sends.
        """
        old = self._by_name.get(name)
        if old is not None:
            self._remove(old)
        item = _Item(name, payload, extra)
        if extra:
            self._extra_items += 1
        self._by_name[name] = item
        size = item.size
        if size > self._oversize_size:
            self._oversize[item] = None
        else:
            self._tiers[0][item] = None
            sizes = self._sizes
            sizes[size] = sizes.get(size, 0) + 1
            smallest = self._smallest
            if smallest is not None and (smallest == 0 or size < smallest):
                self._smallest = size
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
        if len(tiers) > transmit_limit and any(tiers[transmit_limit:]):
            # The cluster shrank: updates already sent enough are still queued.
            return self._get_broadcasts_shrunk(room, transmit_limit)
        smallest = self._smallest
        if smallest is None:
            smallest = self._smallest = min(self._sizes)
        # Nothing smaller than `smallest` is queued, so once less room than that is
        # left no update can fit: stop there (never later than at `_ROOM_MIN`).
        stop = smallest if smallest > _ROOM_MIN else _ROOM_MIN
        if room < stop:
            return []
        payloads: list[bytes] = []
        moves: list[tuple[int, list[_Item]]] = []
        for transmits, tier in enumerate(tiers):
            if not tier:
                continue
            got: list[_Item] = []
            misses = 0
            for item in reversed(tier):
                size = item.size
                if size <= room:
                    got.append(item)
                    payloads.append(item.payload)
                    room -= size
                    if room < stop:
                        break
                else:
                    misses += 1
                    if misses >= _MISSES_MAX:
                        break
            if got:
                moves.append((transmits, got))
            if room < stop:
                break
        self._promote(moves, transmit_limit)
        return payloads

    def _promote(self, moves: list[tuple[int, list[_Item]]], transmit_limit: int) -> None:
        """Count one transmission of each picked item, tier by tier: the oldest first,
        so the newest stays ahead within its next tier too."""
        tiers = self._tiers
        for transmits, got in moves:
            source = tiers[transmits]
            if self._extra_items:
                got = self._spend_extra(got)
            after = transmits + 1
            if after >= transmit_limit:
                by_name = self._by_name
                for item in got:
                    del source[item]
                    del by_name[item.name]
                    self._forget_size(item.size)
                self._count -= len(got)
                continue
            if after == len(tiers):
                tiers.append({})
            target = tiers[after]
            for item in reversed(got):
                del source[item]
                item.transmits = after
                target[item] = None

    def _spend_extra(self, got: list[_Item]) -> list[_Item]:
        """Spend an extra send of each picked item that has one left, keeping it where
        it is; returns the items that count a transmission as usual."""
        counted = []
        for item in got:
            if item.extra:
                item.extra -= 1
                if not item.extra:
                    self._extra_items -= 1
            else:
                counted.append(item)
        return counted

    def _get_broadcasts_shrunk(self, room: int, transmit_limit: int) -> list[bytes]:
        """`get_broadcasts` when tiers at or past the transmit limit hold items (the
        cluster shrank): those are dropped as the walk reaches them, as they always were."""
        tiers = self._tiers
        picked: list[_Item] = []
        for transmits, tier in enumerate(tiers):
            if not tier:
                continue
            if transmits >= transmit_limit:
                for item in list(tier):
                    self._remove(item)
                continue
            misses = 0
            for item in reversed(tier):
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
        moves: list[tuple[int, list[_Item]]] = []
        for item in picked:
            if moves and moves[-1][0] == item.transmits:
                moves[-1][1].append(item)
            else:
                moves.append((item.transmits, [item]))
        self._promote(moves, transmit_limit)
        return [item.payload for item in picked]

    def get_oversize(self, n: int) -> list[bytes]:
        """All updates too big for a packet, each counting one transmission.

        The caller sends each as its own reliable message.
        """
        if not self._oversize:
            return []
        transmit_limit = retransmit_limit(self._retransmit_mult, n)
        payloads = []
        for item in list(self._oversize):
            payloads.append(item.payload)
            item.transmits += 1
            if item.transmits >= transmit_limit:
                self._remove(item)
        return payloads

    def _remove(self, item: _Item) -> None:
        if item.extra:
            self._extra_items -= 1
        size = item.size
        if size > self._oversize_size:
            del self._oversize[item]
        else:
            del self._tiers[item.transmits][item]
            self._forget_size(size)
        del self._by_name[item.name]
        self._count -= 1

    def _forget_size(self, size: int) -> None:
        """One queued update of `size` bytes left the tiers: keep `_sizes` and the
        smallest-size bound true (recomputed lazily when its size is gone)."""
        sizes = self._sizes
        left = sizes[size] - 1
        if left:
            sizes[size] = left
        else:
            del sizes[size]
            self._smallest = None if sizes else 0

    def _evict_one(self) -> None:
        for tier in reversed(self._tiers):
            if tier:
                self._remove(next(iter(tier)))
                self._evicted += 1
                return
        self._remove(next(iter(self._oversize)))
        self._evicted += 1
