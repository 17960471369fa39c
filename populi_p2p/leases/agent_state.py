"""The agent's own bookkeeping (`agent.py`): its proposals, the leases it holds, and the
messages it repeats until a majority of the replicas answered. Plain records, no rules."""

from __future__ import annotations

from typing import Final

import attrs

from ._cancel import OperatorProof
from ._spec import TaskSpec
from .agent_wire import GrantRequest
from .grants import Ended

__all__ = ["EARLY_GRANTS_MAX", "EARLY_GRANTS_PER_SENDER", "EarlyGrants", "Owned", "Pending",
           "Proposal"]  # fmt: skip

#: Grant requests held until their task's offer arrives (more are refused as unknown),
#: in all and from one sender (one member cannot take them all).
EARLY_GRANTS_MAX: Final = 1024
EARLY_GRANTS_PER_SENDER: Final = 256


@attrs.define
class Proposal:
    """A proposal of ours: `epoch` to `owner`, and what its replicas answered."""

    epoch: int
    owner: str
    replicas: tuple[str, ...]
    why: str
    granted: set[str] = attrs.field(factory=set)
    refused: dict[str, int] = attrs.field(factory=dict)
    held: dict[str, int] = attrs.field(factory=dict)  # epoch each replica answered with
    failures: int = 0
    wait: float = 0.0
    resend_at: float = 0.0
    give_up_at: float = 0.0


@attrs.define
class Owned:
    """A lease we hold (granted by a majority), and our run of it."""

    epoch: int
    spec: TaskSpec
    why: str
    since: float
    failures: int = 0
    lease_until: float = 0.0
    started: bool = False
    stopping: str = ""  # the reason given to StopTask, once stopped
    superseded_by: set[str] = attrs.field(factory=set)


@attrs.define
class Pending:
    """A message we repeat to the replicas that have not answered yet (offer, finish,
    cancel) until a majority has, or `until`."""

    what: str
    epoch: int
    ended: Ended
    replicas: tuple[str, ...]
    until: float
    acks: set[str] = attrs.field(factory=set)
    refused: dict[str, int] = attrs.field(factory=dict)
    resend_at: float = 0.0
    done: bool = False
    failures: int = 0
    delta: bytes | None = None  # our table's change, gossiped once agreed
    operator: OperatorProof | None = None  # a cancel's operator proof, if any


class EarlyGrants:
    """First-epoch grant requests that overtook their task's offer, held until it comes
    (`take`) or for `lease_ttl` (`expire`); bounded in all and per sender."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[str, GrantRequest, float]] = {}  # task -> (sender, msg, at)
        self._by: dict[str, int] = {}  # sender -> requests of it held

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, sender: str, msg: GrantRequest, now: float) -> bool:
        """Hold `msg` (True), or not: not a first epoch, already held, or over a bound."""
        if msg.epoch != 1 or msg.task_id in self._held or len(self._held) >= EARLY_GRANTS_MAX:
            return False
        if self._by.get(sender, 0) >= EARLY_GRANTS_PER_SENDER:
            return False
        self._held[msg.task_id] = (sender, msg, now)
        self._by[sender] = self._by.get(sender, 0) + 1
        return True

    def take(self, task_id: str) -> tuple[str, GrantRequest, float] | None:
        held = self._held.pop(task_id, None)
        if held is not None:
            self._by[held[0]] -= 1
        return held

    def expire(self, before: float) -> None:
        """Drop what was held at or before `before`."""
        self._held = {t: e for t, e in self._held.items() if e[2] > before}
        self._by = {}
        for sender, _msg, _at in self._held.values():
            self._by[sender] = self._by.get(sender, 0) + 1
