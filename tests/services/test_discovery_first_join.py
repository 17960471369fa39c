"""The daemon's start: its first join goes to one bootstrap peer, a retry to all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import trio
import trio.testing

from overlay.base import Address
from populi_p2p.services.discovery import Discovery
from populi_p2p.services.membership import MembershipService

SEEDS: list[Address] = [("127.0.0.1", 7001), ("127.0.0.1", 7002), ("127.0.0.1", 7003)]


class LonelyMembership:
    """A membership that records joins and never hears an answer (stays alone)."""

    node_id = "me"
    has_left = False

    def __init__(self) -> None:
        self.joins: list[list[Address]] = []

    async def join(self, seeds: Sequence[Address]) -> None:
        self.joins.append(list(seeds))

    def num_alive(self) -> int:
        return 1

    def member(self, node_id: str) -> Any:
        return None

    def members(self) -> list[Any]:
        return []


async def test_the_first_join_goes_to_one_seed_and_a_retry_to_all(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = LonelyMembership()
    discovery = Discovery(
        cast(MembershipService, fake),
        ("127.0.0.1", 7000),
        bootstrap=SEEDS,
        remembered=list,
        probe_interval=1.0,
    )
    assert not await discovery._try_join(SEEDS)  # nobody answers within the wait
    assert not await discovery._try_join(SEEDS)
    first, retry = fake.joins
    assert len(first) == 1 and first[0] in SEEDS
    assert retry == SEEDS
