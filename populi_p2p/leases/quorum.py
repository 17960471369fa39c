"""A task's replica set, and which of its replies decide: a majority, ties broken by its
primary.

Every decision about a task (its submit, each epoch's grant, each renewal round, its
end) counts once a **quorum** of its replicas (`TaskSpec.replicas`) has answered. What
makes that safe is one property: any two quorums of one set share a member, so two
decisions that exclude each other (an epoch granted to two owners, a success and a
further grant) can never both gather one.

A strict majority has that property. So does half of an even set *that includes its
first member*, the **primary**: two such halves share the primary, and a half and a
majority together hold more members than the set. Allowing those halves changes
nothing for odd sets and makes even ones more available:

* a set of **two** (a mesh of two members) decides with its primary alone, so the other
  member's sleep stops nothing; while the primary is away the task waits;
* a set of **four** survives the loss of two members, the primary not among them.

The accepting node puts first the member it would place the task on, followed by that
member's rendezvous neighbours (`neighbours`; `LeaseAgent._replica_set`): the machine
that runs the work is the one whose presence it needs, and an owner renews its leases
with the same few nodes whatever the number of tasks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence

__all__ = [
    "can_still_reach_quorum",
    "epoch_vouched",
    "is_quorum",
    "neighbours",
    "replicas_for",
]


def replicas_for(key: str, live: Collection[str], count: int) -> tuple[str, ...]:
    """The `count` live members ranked first by a rendezvous hash of (key, member):
    alike on every node that sees the same members, spread evenly over members."""

    def rank(node: str) -> bytes:
        return hashlib.blake2b(f"{key}\x00{node}".encode(), digest_size=8).digest()

    return tuple(sorted(set(live), key=rank)[:count])


def neighbours(owner: str, live: Collection[str], count: int) -> tuple[str, ...]:
    """The `count` live members other than `owner` ranked first for it by rendezvous
    hash: a task placed on `owner` takes them as its other replicas, so every lease
    `owner` holds is renewed with the same few nodes (`LeaseAgent._replica_set`)."""
    return replicas_for(f"owner\x00{owner}", set(live) - {owner}, count)


def is_quorum(replicas: Sequence[str], voters: Collection[str]) -> bool:
    """Whether the members of `voters` that are in `replicas` decide for the set: more
    than half of it, or exactly half of an even set including `replicas[0]`."""
    if not replicas:
        return False
    members = set(replicas)
    count = sum(1 for v in set(voters) if v in members)
    size = len(members)
    if 2 * count > size:
        return True
    return 2 * count == size and replicas[0] in voters


def can_still_reach_quorum(replicas: Sequence[str], refused: Collection[str]) -> bool:
    """Whether the replicas that have not refused could still form a quorum."""
    refusing = set(refused)
    return is_quorum(replicas, [r for r in replicas if r not in refusing])


def epoch_vouched(replicas: Sequence[str], held: Mapping[str, int], own: int) -> int:
    """The highest epoch held at a replica that liars among them cannot have made up:
    with `f` = the replicas beyond a strict majority (2 of 5), the (f + 1)-th highest
    of the epochs the replicas answered with and our own record. The top f may all be
    made up; the next is at most what an honest replica holds. A proposal just above it
    is one that the replicas at or below it, at least a majority when all answered, can
    grant. With f values or fewer, our own record."""
    tolerated = len(replicas) - (len(replicas) // 2 + 1)
    values = sorted([own, *(e for node, e in held.items() if node in replicas)], reverse=True)
    return values[tolerated] if len(values) > tolerated else own
