"""Renewal rounds: what an owner sends each replica every `lease_renew_interval`.

An owner renews every lease it holds, one message per replica, not per task. Most
rounds renew the very set the replica renewed last time, so once a replica has
renewed a set in full with no refusal, the next rounds send only its digest
(`RenewDigest`: a count and 16 bytes of BLAKE2b over the sorted (task, epoch) pairs).
The replica computes the same digest over the leases it granted to that owner and
still holds open (`renewable`); if both agree it renews them all, exactly as the full
list would have, else it answers `missed` and the owner sends the full list at once.
A digest renews nothing that the full message would not: only leases this granter
granted to the sender, at the epoch it granted.

A full list longer than `RENEW_CHUNK` is split, each part its own sequence number (an
answer names the part it answers); such a set is never sent as a digest. Pure: time
comes in as `now`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from .agent_wire import RENEW_DIGEST_BYTES, Renew, RenewAnswer, RenewDigest
from .config import LeaseConfig
from .grants import Ended, GrantRecord, Refusal

__all__ = [
    "RENEW_CHUNK",
    "RenewPart",
    "RenewalRounds",
    "lease_digest",
    "refused_for_good",
    "renewable",
    "steady_round",
]

#: Leases one full renewal message names at most (well under the wire's bound).
RENEW_CHUNK: Final = 1024
_PERSON: Final = b"populi-renew"


def lease_digest(pairs: Iterable[tuple[str, int]]) -> bytes:
    """BLAKE2b over the sorted (task id, epoch) pairs: the same set, the same bytes."""
    h = hashlib.blake2b(digest_size=RENEW_DIGEST_BYTES, person=_PERSON)
    for tid, epoch in sorted(pairs):
        h.update(bytes.fromhex(tid))
        h.update(epoch.to_bytes(8, "big"))
    return h.digest()


def renewable(grants: Mapping[str, GrantRecord], owner: str) -> list[tuple[str, int]]:
    """The leases this granter granted to `owner`, that `owner` renewed here since, and
    that are still open: (task, epoch). A grant its owner never took up (it was busy
    with an older run, or the `Own` was lost) is not in the owner's set either."""
    return [
        (tid, rec.epoch)
        for tid, rec in grants.items()
        if rec.owner == owner and rec.ended is Ended.NO and rec.renewed and not rec.final
    ]


def refused_for_good(refusal: int, *, early: bool) -> bool:
    """Whether a replica that refused to renew a lease will refuse it every round, so
    the owner stops naming it there (else the replica's set never matches the owner's
    and every round is a full list).

    A finished or superseded lease stays so. A replica that does not know the task, or
    that never granted us the epoch (`UNKNOWN`, `NOT_OWNER`), missed the grant request,
    which nobody repeats once a majority granted; but a round sent `early`, within one
    renewal interval of our `Own`, may have overtaken a request still on its way, so
    such a refusal is not taken for good. A lease needs a majority's renewals anyway:
    this only saves bytes."""
    if refusal in (Refusal.FINISHED, Refusal.SUPERSEDED):
        return True
    return not early and refusal in (Refusal.UNKNOWN, Refusal.NOT_OWNER)


def steady_round(
    due: float | None, at: float, lease_ends: Iterable[float], config: LeaseConfig
) -> float | None:
    """When the owner's next round is due, once an answer to the round sent at `at`
    came: `lease_renew_steady` after that round if it renewed every lease we hold with
    a majority (each now ends at ``at + lease_ttl`` or later), else `due` unchanged
    (`lease_renew_interval` after the last round). So a steady owner sends less, and
    one that missed a majority tries again soon; None: nothing to renew."""
    if due is None or any(end < at + config.lease_ttl for end in lease_ends):
        return due
    return max(due, at + config.lease_renew_steady)


@attrs.frozen
class RenewPart:
    """One renewal message sent: when, to whom, which leases, and whether as a digest."""

    at: float
    node: str
    pairs: tuple[tuple[str, int], ...]
    digest: bool


class RenewalRounds:
    """The owner's side: builds each round's messages and remembers them for answers.

    Args:
        keep_for: seconds a sent part is remembered (an answer later than the lease's
            length renews nothing anyway).
    """

    def __init__(self, keep_for: float) -> None:
        self._keep_for = keep_for
        self._seq = 0
        self.sent: dict[int, RenewPart] = {}
        #: Per replica: the set it last renewed in full with no refusal.
        self._basis: dict[str, frozenset[tuple[str, int]]] = {}
        self.digests_sent = 0
        self.full_sent = 0

    def messages(
        self, per_node: Mapping[str, list[tuple[str, int]]], now: float
    ) -> list[tuple[str, Renew | RenewDigest]]:
        """This round's messages: a digest where the replica holds our set, else the
        full list in parts."""
        self._prune(now)
        out: list[tuple[str, Renew | RenewDigest]] = []
        for node, pairs in per_node.items():
            if len(pairs) <= RENEW_CHUNK and frozenset(pairs) == self._basis.get(node):
                seq = self._next(RenewPart(now, node, tuple(pairs), True))
                out.append((node, RenewDigest(seq, len(pairs), lease_digest(pairs))))
                self.digests_sent += 1
                continue
            out += self.full(node, pairs, now)
        return out

    def full(
        self, node: str, pairs: list[tuple[str, int]], now: float
    ) -> list[tuple[str, Renew | RenewDigest]]:
        """The full list for `node`, in parts of at most `RENEW_CHUNK` leases."""
        out: list[tuple[str, Renew | RenewDigest]] = []
        for i in range(0, len(pairs), RENEW_CHUNK):
            part = tuple(pairs[i : i + RENEW_CHUNK])
            seq = self._next(RenewPart(now, node, part, False))
            out.append((node, Renew(seq, part)))
            self.full_sent += 1
        return out

    def answered(self, sender: str, answer: RenewAnswer) -> RenewPart | None:
        """The part `answer` answers (None: unknown, too old, or not sent to `sender`);
        learns whether the next rounds may send `sender` a digest."""
        part = self.sent.get(answer.seq)
        if part is None or part.node != sender:
            return None
        if answer.missed or answer.refused:
            self._basis.pop(sender, None)
        elif not part.digest and len(part.pairs) <= RENEW_CHUNK:
            self._basis[sender] = frozenset(part.pairs)
        return part

    def _next(self, part: RenewPart) -> int:
        self._seq += 1
        self.sent[self._seq] = part
        return self._seq

    def _prune(self, now: float) -> None:
        horizon = now - self._keep_for
        for seq in [s for s, p in self.sent.items() if p.at < horizon]:
            del self.sent[seq]
