"""Submit acknowledgements: "I have persisted task T", signed, over the app channel.

`submit` returns only once enough other members hold the task on disk. Each node that
applies a spec for the first time (the table persisted it before `apply` returned)
broadcasts a signed ack (`AppKind.LEASE_ACK`); every node passes on the acks new to it,
because one broadcast reaches only a few members and the submitter may not be among
them; the submitter counts distinct, verified ackers. A node also repeats its own ack
every `interval` for `span` (as the lease deltas are echoed): one broadcast reaches only
a few members, some of which may be dead and not yet declared so.

Only a few members ack each task (`ackers`: the first by a hash of task and member,
alike on every node that sees the same members). Every member acking made the acks
O(n^2) broadcasts per task (n acks, each relayed by n members, and repeated): at 20
daemons on one loaded machine they were five sixths of the application gossip, the
broadcast queues backed up, and claims and results took seconds to arrive, so members
claimed epochs that were already taken or done (the task benchmark, issue 10).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Final

import msgpack
import trio

from swim import AppMessage

from ..identity import NodeIdentity, verify_signature
from ..record import NodeRecord
from .app_channel import AppChannel, AppKind

__all__ = ["ACKERS_MIN", "ACK_CONTEXT", "SubmitAcks", "ackers"]

#: Signature context of an ack.
ACK_CONTEXT: Final = b"populi/lease-ack/v1"
#: Acks remembered (each is passed on once), oldest dropped first.
SEEN_ACKS_MAX: Final = 4096
#: Members that ack each task, at least (twice the acks a submit waits for, if more).
ACKERS_MIN: Final = 3


def ackers(task_id: str, members: Iterable[str], submitter: str, count: int) -> set[str]:
    """The `count` members other than `submitter` that ack `task_id`: the first by
    blake2b(task, member), so every node that sees the same members picks the same."""

    def rank(node: str) -> bytes:
        return hashlib.blake2b(f"{task_id}/{node}".encode(), digest_size=8).digest()

    return set(sorted((m for m in set(members) if m != submitter), key=rank)[:count])


class SubmitAcks:
    """Sends our acks, relays others', and counts the ones for our submissions."""

    def __init__(
        self,
        identity: NodeIdentity,
        channel: AppChannel,
        record_of: Callable[[str], NodeRecord | None],
        *,
        interval: float = 0.5,
        span: float = 5.0,
    ) -> None:
        self._interval = interval
        self._span = span
        self._mine: dict[str, tuple[bytes, float]] = {}  # key -> (our ack, repeat until)
        self._due = 0.0
        self._identity = identity
        self._channel = channel
        self.record_of = record_of
        self._to_send: list[str] = []
        self._sent: set[str] = set()
        self._seen: dict[str, None] = {}  # "task/node", oldest first
        self._waiting: dict[str, tuple[set[str], list[trio.Event]]] = {}

    def persisted(self, task_id: str) -> None:
        """A spec new to us is on our disk: ack it (once) at the next `flush`."""
        if task_id not in self._sent:
            self._sent.add(task_id)
            self._to_send.append(task_id)

    def forget(self, task_id: str) -> None:
        """The task was compacted."""
        self._sent.discard(task_id)

    async def flush(self, now: float) -> None:
        """Send new acks now; repeat recent ones every `interval` for `span`."""
        me = self._identity.node_id
        while self._to_send:
            tid = self._to_send.pop()
            sig = self._identity.sign(ACK_CONTEXT, tid.encode())
            body = msgpack.packb([tid, me, sig], use_bin_type=True)
            self._mine[f"a/{tid}/{me}"] = (body, now + self._span)
            await self._channel.broadcast(AppKind.LEASE_ACK, f"a/{tid}/{me}", body)
        if now < self._due:
            return
        self._due = now + self._interval
        for key, (body, until) in list(self._mine.items()):
            if now >= until:
                del self._mine[key]
            else:
                await self._channel.broadcast(AppKind.LEASE_ACK, key, body)

    async def on_ack(self, message: AppMessage, body: bytes) -> None:
        """A signed ack from the channel (hostile input: junk is counted, never raised)."""
        try:
            tid, node, sig = msgpack.unpackb(body, raw=False)
            record = self.record_of(node) if isinstance(node, str) else None
            seen = f"{tid}/{node}" in self._seen
        except (ValueError, TypeError, msgpack.UnpackException):
            self._channel.dropped += 1
            return
        if seen or record is None or not isinstance(sig, bytes) or not isinstance(tid, str):
            return
        if not verify_signature(record.public_key, ACK_CONTEXT, tid.encode(), sig):
            self._channel.dropped += 1
            return
        self._seen[f"{tid}/{node}"] = None
        while len(self._seen) > SEEN_ACKS_MAX:
            del self._seen[next(iter(self._seen))]
        await self._channel.broadcast(AppKind.LEASE_ACK, message.key, body)
        waiting = self._waiting.get(tid)
        if waiting is not None:
            waiting[0].add(node)
            waiting[1][0].set()

    def expect(self, task_id: str) -> None:
        """Start counting acks for `task_id` (call before broadcasting its spec)."""
        self._waiting[task_id] = (set(), [trio.Event()])

    async def wait(self, task_id: str, needed: int, timeout: float) -> int:
        """Wait until `needed` members acked `task_id`, at most `timeout`; how many did."""
        acks, event = self._waiting[task_id]
        try:
            with trio.move_on_after(timeout):
                while len(acks) < needed:
                    await event[0].wait()
                    event[0] = trio.Event()
        finally:
            del self._waiting[task_id]
        return len(acks)
