"""`ExecutorConfig`: where tasks run, as whom, and the executor's named bounds."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import attrs

from ._isolation import DEFAULT_TASK_UIDS, check_uid_range

__all__ = ["TAIL_BYTES_MAX", "ExecutorConfig"]

#: Largest tail a result may carry per stream; a result gossips, so it stays small.
TAIL_BYTES_MAX: Final = 64 * 1024


@attrs.frozen
class ExecutorConfig:
    """How the executor runs commands. Every duration is in seconds.

    Raises:
        ValueError: one line naming the bad field, from ``__attrs_post_init__``.
    """

    #: Where work directories go: ``tasks_dir/<task_id>/<epoch>/``. The node passes
    #: ``state_dir / "tasks"``.
    tasks_dir: Path = attrs.field(converter=Path)
    #: The user commands run as when the daemon is root. None: each task a uid of its
    #: own from `task_uids`; a name: every task as that user (they can then reach each
    #: other's files); ``"root"``: keep root, no isolation (the operator's explicit
    #: choice). Ignored-but-checked when not root: naming another user then is an
    #: error, since only root can switch.
    task_user: str | None = None
    #: The uids (and gids) handed to tasks one each, FIRST and LAST included, when
    #: `task_user` is None and the daemon is root. Keep them out of every user's and
    #: group's ids (those in use are skipped anyway); it bounds the running tasks.
    task_uids: tuple[int, int] = attrs.field(default=DEFAULT_TASK_UIDS, converter=check_uid_range)
    #: Give each task its own PID, mount and IPC namespaces (a private /tmp) when the
    #: daemon is root and the kernel allows it; False never tries.
    namespaces: bool = True
    #: Time between SIGTERM and SIGKILL when a task is stopped, cancelled or timed out.
    #: Longer lets tasks save state; shorter frees the machine sooner.
    grace_period: float = 5.0
    #: How long before a fence deadline the task gets SIGTERM (SIGKILL at the deadline).
    #: Keep it below the time between the lease's renewals and its deadline.
    fence_grace: float = 1.0
    #: Bytes of stdout and of stderr kept in `TaskExited` (the full output stays on disk).
    tail_bytes: int = 4096
    #: How often the watchdog reads the group's memory and CPU time, and how often
    #: `follow_log` looks for new output. Shorter catches a runaway sooner, costs CPU.
    poll_interval: float = 0.25
    #: Use cgroup v2 when `probe` finds a usable one; False forces rlimits.
    use_cgroup: bool = True
    #: A delegated cgroup to put task cgroups under; None: look at our own cgroup.
    cgroup_parent: Path | None = attrs.field(
        default=None, converter=attrs.converters.optional(Path)
    )
    #: `TaskExited` events buffered for a slow reader before supervisors wait.
    exits_buffer: int = 256

    def __attrs_post_init__(self) -> None:
        if not 0 < self.grace_period <= 300:
            raise ValueError(f"grace_period must be in (0, 300] seconds, got {self.grace_period}")
        if not 0 <= self.fence_grace <= 300:
            raise ValueError(f"fence_grace must be in [0, 300] seconds, got {self.fence_grace}")
        if not 0 <= self.tail_bytes <= TAIL_BYTES_MAX:
            raise ValueError(f"tail_bytes must be in 0..{TAIL_BYTES_MAX}, got {self.tail_bytes}")
        if not 0.01 <= self.poll_interval <= 10:
            raise ValueError(f"poll_interval must be in [0.01, 10] s, got {self.poll_interval}")
        if self.exits_buffer < 1:
            raise ValueError(f"exits_buffer must be at least 1, got {self.exits_buffer}")
        if self.task_user is not None and not self.task_user:
            raise ValueError("task_user must be a user name, or None for a uid per task")
