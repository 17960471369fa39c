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
answer names the part it answers); such a set is never sent as a digest.

An owner needs a majority of each lease's replicas, not all of them. After a round that
renewed every lease with a majority, the next round's digests ask only the replicas
that make up a majority of each lease again (`answering`: those that answered last
first); the others get a `quiet` digest, renew just the same, and answer only when it
misses. A quiet replica's renewal extends its lease without telling the owner, so it
only makes that granter wait longer: the owner's fence and starts count answers alone.
A round that misses a majority makes the next one ask everyone. Pure: time comes in as
`now`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Final

import attrs

from .agent_wire import RENEW_DIGEST_BYTES, Renew, RenewAnswer, RenewDigest
from .config import LeaseConfig
from .grants import Ended, GrantRecord, Refusal
from .quorum import is_quorum

__all__ = [
    "RENEW_CHUNK",
    "RenewPart",
    "RenewalRounds",
    "answering",
    "lease_digest",
    "refused_for_good",
    "renewable",
    "renewed_all",
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


def renewed_all(at: float, lease_ends: Iterable[float], config: LeaseConfig) -> bool:
    """Whether the round sent at `at` renewed every lease we hold with a majority (each
    now ends at ``at + lease_ttl`` or later)."""
    return all(end >= at + config.lease_ttl for end in lease_ends)


def steady_round(
    due: float | None, at: float, lease_ends: Iterable[float], config: LeaseConfig
) -> float | None:
    """When the owner's next round is due, once an answer to the round sent at `at`
    came: `lease_renew_steady` after that round if it renewed every lease we hold
    (`renewed_all`), else `due` unchanged (`lease_renew_interval` after the last round).
    So a steady owner sends less, and one that missed a majority tries again soon; None:
    nothing to renew."""
    if due is None or not renewed_all(at, lease_ends, config):
        return due
    return max(due, at + config.lease_renew_steady)


def answering(
    per_node: Mapping[str, Collection[tuple[str, int]]],
    replicas: Mapping[str, Sequence[str]],
    loud: Collection[str],
    preference: Sequence[str],
) -> set[str]:
    """The replicas a round asks to answer: `loud` (ourselves, and those sent a full
    list, who answer anyway), then, for each lease, replicas taken in `preference`
    order until those asked make a majority of its set (`quorum.is_quorum`). A lease
    that no choice covers leaves all its replicas asked.

    Args:
        per_node: the leases the round renews at each replica.
        replicas: each task's replica set.
    """
    asked = set(loud)
    holders: dict[str, list[str]] = {}
    rank = {node: i for i, node in enumerate(preference)}
    for node in sorted(per_node, key=lambda n: (rank.get(n, len(rank)), n)):
        for tid, _epoch in per_node[node]:
            holders.setdefault(tid, []).append(node)
    for tid, nodes in holders.items():
        members = replicas.get(tid, ())
        for node in nodes:
            if is_quorum(members, asked.intersection(nodes)):
                break
            asked.add(node)
    return asked


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
        #: Per replica: when it last answered (`answering` asks the freshest first).
        self._answered_at: dict[str, float] = {}
        self.digests_sent = 0
        self.quiet_sent = 0
        self.full_sent = 0

    def messages(
        self,
        per_node: Mapping[str, list[tuple[str, int]]],
        now: float,
        quiet: tuple[str, Mapping[str, Sequence[str]]] | None = None,
    ) -> list[tuple[str, Renew | RenewDigest]]:
        """This round's messages: a digest where the replica holds our set, else the
        full list in parts. With `quiet` (our name and each task's replica set), the
        digests to replicas that `answering` leaves out are quiet."""
        self._prune(now)
        digest = {
            node
            for node, pairs in per_node.items()
            if len(pairs) <= RENEW_CHUNK and frozenset(pairs) == self._basis.get(node)
        }
        asked: Collection[str] = per_node.keys()
        if quiet is not None:
            me, replicas = quiet
            preference = sorted(self._answered_at, key=lambda n: -self._answered_at[n])
            asked = answering(per_node, replicas, {me} | (per_node.keys() - digest), preference)
        out: list[tuple[str, Renew | RenewDigest]] = []
        for node, pairs in per_node.items():
            if node not in digest:
                out += self.full(node, pairs, now)
                continue
            seq = self._next(RenewPart(now, node, tuple(pairs), True))
            hush = node not in asked
            out.append((node, RenewDigest(seq, len(pairs), lease_digest(pairs), hush)))
            self.digests_sent += 1
            self.quiet_sent += hush
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
        self._answered_at[sender] = max(self._answered_at.get(sender, part.at), part.at)
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
        for node in [n for n, at in self._answered_at.items() if at < horizon]:
            del self._answered_at[node]
