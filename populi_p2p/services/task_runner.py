"""How the lease service runs a task: the narrow `TaskRunner` interface.

The lease service decides *whether* this node runs a task (it holds the lease); a
runner decides *how*. `TaskRunner` is all the lease service asks: `start`, `stop`, and
the `exits` stream of `TaskExited`. The node's runner is the `ExecutorService`
(limits, cgroups, network namespaces, an unprivileged user); tests may pass fakes.
"""

from __future__ import annotations

from typing import Protocol

import trio

from ..leases import TaskSpec
from ._task_types import TaskExited

__all__ = ["TaskExited", "TaskRunner"]


class TaskRunner(Protocol):
    """What the lease service needs from whatever runs processes."""

    #: One `TaskExited` per `start`, whatever the end (``stop`` reasons arrive as
    #: ``reason="cancelled", detail=<the reason given>``).
    exits: trio.MemoryReceiveChannel[TaskExited]

    def start(self, task_id: str, epoch: int, spec: TaskSpec, gpu_uuids: list[str]) -> None:
        """Start the task now (returns at once); its end comes on `exits`."""
        ...

    def stop(self, task_id: str, reason: str) -> None:
        """Stop the task's process group (SIGTERM, SIGKILL after a grace); its
        `TaskExited` says ``cancelled`` with `reason` as detail. Unknown ids are ignored."""
        ...
