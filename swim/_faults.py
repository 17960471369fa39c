"""BUGGIFY-style fault hooks, for the simulator only.

Production code never branches on "am I simulated?". Instead the simulator may pass a
`faults` object to `Membership`; the core asks it at a few chosen points whether to
misbehave in a way real systems do (a minimal gossip fan-out, a refute that is slow to
go out). Any object with some of these methods works: missing methods mean "no fault".
The simulator's own random generator should gate its answers, so the core's injected
`rng` sequence stays the same with or without faults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Faults(Protocol):
    """The hooks the core consults. Every method is optional."""

    def gossip_fanout(self, fanout: int) -> int:
        """The number of members this gossip round goes to (default: `fanout`)."""
        ...

    def drop_refute(self) -> bool:
        """True to skip this refute; the next accusation triggers it again."""
        ...


class FaultHooks:
    """The hooks resolved once at construction, so the hot path pays one `is None`."""

    __slots__ = ("drop_refute", "gossip_fanout")

    def __init__(self, faults: object | None) -> None:
        fanout = getattr(faults, "gossip_fanout", None)
        drop = getattr(faults, "drop_refute", None)
        self.gossip_fanout: Callable[[int], int] | None = fanout if callable(fanout) else None
        self.drop_refute: Callable[[], bool] | None = drop if callable(drop) else None
