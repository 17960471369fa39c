"""The agent's own bookkeeping (`agent.py`): its proposals, the leases it holds, and the
messages it repeats until a majority of the replicas answered. Plain records, no rules."""

from __future__ import annotations

import attrs

from ._cancel import OperatorProof
from ._spec import TaskSpec
from .grants import Ended

__all__ = ["Owned", "Pending", "Proposal"]


@attrs.define
class Proposal:
    """A proposal of ours: `epoch` to `owner`, and what its replicas answered."""

    epoch: int
    owner: str
    replicas: tuple[str, ...]
    why: str
    granted: set[str] = attrs.field(factory=set)
    refused: dict[str, int] = attrs.field(factory=dict)
    highest: int = 0
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
