"""What a `LeaseAgent` asks its driver to do: small frozen values, as `swim` returns
`Send`s. The trio service and the simulator carry out the same commands."""

from __future__ import annotations

import attrs

from ._spec import TaskSpec

__all__ = ["Acknowledged", "AgentCommand", "FenceTask", "Gossip", "SendTo", "StartTask", "StopTask"]


@attrs.frozen
class SendTo:
    """Send `payload` (an `agent_wire` message) to member `node`.

    `after_commit` False marks a renewal or its answer: it follows from no record this
    node wrote (a renewal writes nothing durable; what it renews was granted, and
    answered, after a commit, and a granter that restarts counts every lease it holds
    live for a whole wait), so a driver that holds messages until its pending records
    are durable (a group commit) may send it at once."""

    node: str
    payload: bytes
    after_commit: bool = True


@attrs.frozen
class Gossip:
    """Broadcast a lease-table delta (what everyone shows; `key` replaces a queued one)."""

    key: str
    payload: bytes


@attrs.frozen
class StartTask:
    """Start the task now. It must be dead by `deadline` (the agent's clock) unless a
    `FenceTask` moves the deadline on: a stopped owner's replacement may start after."""

    task_id: str
    epoch: int
    spec: TaskSpec
    deadline: float


@attrs.frozen
class FenceTask:
    """The lease was renewed: the task may run until `deadline` (the agent's clock)."""

    task_id: str
    epoch: int
    deadline: float


@attrs.frozen
class StopTask:
    """Stop the task's processes. `reason`: cancelled, superseded, fenced or handoff.
    Its exit is reported back with `LeaseAgent.task_exited` as usual."""

    task_id: str
    epoch: int
    reason: str


@attrs.frozen
class Acknowledged:
    """A submit or cancel reached a majority of the task's replicas (`refusal` None), or
    was refused by them (`refusal`: one line, e.g. the task already succeeded).
    `forbidden`: refused because this node may not cancel the task (`_cancel.py`)."""

    task_id: str
    what: str  # "submit" or "cancel"
    acks: int
    refusal: str | None = None
    forbidden: bool = False


AgentCommand = SendTo | Gossip | StartTask | FenceTask | StopTask | Acknowledged
