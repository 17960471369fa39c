"""The daemon's discovery: a joined node joins a bootstrap peer it does not hold."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import cast

import trio
import trio.testing

from overlay.base import Address
from populi_p2p.services.discovery import Discovery
from populi_p2p.services.membership import MembershipService
from swim import Member, MemberState

ME: Address = ("127.0.0.1", 7000)
SEED_A: Address = ("127.0.0.1", 7001)
SEED_B: Address = ("127.0.0.1", 7002)


class HalfMesh:
    """Any join lets us in through seed A; seed B is never heard of (the other half)."""

    node_id = "me"
    has_left = False

    def __init__(self) -> None:
        self.joins: list[tuple[float, list[Address]]] = []
        self.held: list[Member] = []

    async def join(self, seeds: Sequence[Address]) -> None:
        self.joins.append((trio.current_time(), list(seeds)))
        self.held = [Member("a", SEED_A, MemberState.ALIVE, 1)]

    def num_alive(self) -> int:
        return 1 + len(self.held)

    def member(self, node_id: str) -> Member | None:
        return next((m for m in self.held if m.name == node_id), None)

    def members(self) -> list[Member]:
        return list(self.held)


async def test_a_joined_daemon_joins_its_missing_bootstrap_peer_a_few_times(
    autojump_clock: trio.testing.MockClock,
) -> None:
    mesh = HalfMesh()
    discovery = Discovery(
        cast(MembershipService, mesh),
        ME,
        bootstrap=[ME, SEED_A, SEED_B],
        remembered=list,
        probe_interval=1.0,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(discovery.bootstrapper.run)
        start = trio.current_time()
        await trio.sleep(300)
        nursery.cancel_scope.cancel()
    first, *again = [(t - start, seeds) for t, seeds in mesh.joins]
    # The start's join: one bootstrap peer, a random one, never ourselves.
    assert first[0] == 0.0 and first[1] in ([SEED_A], [SEED_B])
    # Joined through A: B (never held) is asked again, backed off, a bounded number of
    # times; A (held) and our own address never.
    assert [seeds for _, seeds in again] == [[SEED_B]] * 4
    times = [t for t, _ in again]
    assert times[0] <= 5.0 + 1e-6 and all(b - a >= 4.0 for a, b in itertools.pairwise(times))
