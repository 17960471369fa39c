"""How the lease service runs a task: the narrow `TaskRunner` interface.

The lease service decides *whether* this node runs a task (it holds the lease); a
runner decides *how*. `TaskRunner` is all the lease service asks: `start`, `stop`,
`fence`, `reap_leftovers`, and the `exits` stream of `TaskExited`. The node's runner
is the `ExecutorService` (limits, cgroups, network namespaces, an unprivileged user,
fence deadlines enforced outside the daemon's event loop); tests may pass fakes.
"""

from __future__ import annotations

from typing import Protocol

import trio

from ..leases import TaskSpec
from ._types import TaskExited

__all__ = ["TaskExited", "TaskRunner"]


class TaskRunner(Protocol):
    """What the lease service needs from whatever runs processes."""

    #: One `TaskExited` per `start`, whatever the end (``stop`` reasons arrive as
    #: ``reason="cancelled", detail=<the reason given>``).
    exits: trio.MemoryReceiveChannel[TaskExited]

    def start(
        self,
        task_id: str,
        epoch: int,
        spec: TaskSpec,
        gpu_uuids: list[str],
        *,
        deadline: float | None = None,
    ) -> None:
        """Start the task now (returns at once); its end comes on `exits`. With a
        `deadline`, it is fenced from its first instant (see `fence`)."""
        ...

    def stop(self, task_id: str, reason: str, grace: float | None = None) -> None:
        """Stop the task's process group (SIGTERM, SIGKILL after `grace` seconds, or
        the runner's own grace when None); its `TaskExited` says ``cancelled`` with
        `reason` as detail. Unknown ids are ignored."""
        ...

    def fence(self, task_id: str, epoch: int, deadline: float) -> None:
        """The task may run until `deadline` (a ``time.monotonic()`` value, a clock
        shared by every process on the machine) unless a later call moves it; past
        it the task is stopped even if the caller's event loop is frozen, and its
        `TaskExited` says ``cancelled``/``fenced``. Unknown ids are ignored."""
        ...

    async def reap_leftovers(self) -> list[tuple[str, int]]:
        """Kill what an earlier daemon's tasks left running; the (task_id, epoch) of
        each task now verified gone, so its lease may be released."""
        ...
