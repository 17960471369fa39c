"""The records a `Membership` holds: members, the view as sync digests, relays, pulls.

Plain data with their own small caches, shared by every part of the core (see
`swim._membership` for how the parts stack up), and `SharedView`, the converged view
many cores are primed from at once.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from ._events import Address, Member, MemberState
from ._state import Rumor
from .suspicion import Suspicion
from .wire import DigestEntry, encode_digest_entry, encode_member_entry

_ALIVE = MemberState.ALIVE
_SUSPECT = MemberState.SUSPECT
_DEAD = MemberState.DEAD
_LEFT = MemberState.LEFT

_RUMOR_ALIVE = Rumor.ALIVE.value
_RUMOR_SUSPECT = Rumor.SUSPECT.value
_RUMOR_DEAD = Rumor.DEAD.value
_RUMOR_LEFT = Rumor.LEFT.value

#: Kinds of the timers in the heap (`_Core._push_timer`, `_Timers._fire_timer`).
_TIMER_SUSPICION = 0
_TIMER_RELAY = 1
_TIMER_REAP = 2
_TIMER_PULL = 3

_TimerEntry = tuple[float, int, int, Any]


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
