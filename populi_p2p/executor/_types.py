"""The executor's value types: the limits a task runs under, a running task, its end.

Frozen attrs classes, as the rest of the node's events are: the lease service reads
them, never changes them.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

__all__ = [
    "EXIT_REASONS",
    "RunningTask",
    "TaskExited",
    "TaskLimits",
]

#: Every `TaskExited.reason`; only ``exited`` means the command itself chose its end.
EXIT_REASONS: Final = frozenset(
    {
        "exited",  # the command exited (any code) or was killed by a signal we did not send
        "timeout",  # the spec's timeout passed; the group was stopped
        "memory",  # the memory limit was broken (cgroup OOM, watchdog, or failed allocation)
        "cpu",  # the CPU-time limit was broken (SIGXCPU or the watchdog)
        "cancelled",  # `stop()` was called (a cancel, a drain with handoff, a lost lease)
        "shutdown",  # the node shut down while the task ran; the group was killed
        "start_failed",  # nothing ran: bad id, missing command, no namespace, no user...
        "outputs",  # exited 0, but its outputs could not be stored or held by k members
    }
)


def _optional_positive(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and not (isinstance(value, int | float) and value > 0):
        raise ValueError(f"{attribute.name} must be positive or None, got {value!r}")


@attrs.frozen
class TaskLimits:
    """Limits beyond the spec's (``no_network`` is also a `TaskSpec` field; either asks).

    ``None`` means "derive from the spec": memory from ``requirements.ram`` (when > 0),
    CPU time from ``timeout * max(1, requirements.cpu_cores)``.
    """

    memory: int | None = attrs.field(default=None, validator=_optional_positive)  # bytes
    cpu_time: float | None = attrs.field(default=None, validator=_optional_positive)  # s
    no_network: bool = False  # run in a fresh network namespace, or refuse to start


@attrs.frozen
class RunningTask:
    """What `ExecutorService.running()` shows for one task still in our hands."""

    task_id: str
    epoch: int
    pid: int | None  # the wrapper's pid (the task's process group); None until spawned
    started_at: float  # realtime (time.time()), informational
    workdir: str
    memory_limit: int | None
    cpu_time_limit: float | None
    no_network: bool
    user: str  # the user the command runs as
    limiter: str  # "cgroup" or "rlimit"


@attrs.frozen
class TaskExited:
    """One task's end, exactly once per `start()`.

    ``exit_code`` is the process's return code (negative: killed by that signal); for
    ``start_failed`` it is None when no process was spawned, 127 when the wrapper ran
    but could not exec the command. The tails are the last bytes of each
    stream, at most the executor's ``tail_bytes``; the full output stays on disk.
    """

    task_id: str
    epoch: int
    exit_code: int | None
    reason: str
    stdout_tail: bytes
    stderr_tail: bytes
    started_at: float  # realtime seconds
    ended_at: float  # realtime seconds
    detail: str = ""  # one line for people: why it failed to start, which limit, ...
    #: ``start_failed`` because the command itself cannot run as given: not found along
    #: the task's PATH, or not executable for the task's user. No retry would do better
    #: (docs/executor.md, "A command that cannot run"): the task fails for good.
    final: bool = False
    #: The outputs stored as blobs after the command ended (`TaskOutput` values) and
    #: the nodes holding them, owner first (`artifacts.ArtifactRunner`); empty when the
    #: task declares none.
    outputs: tuple[Any, ...] = ()
    holders: tuple[str, ...] = ()

    @property
    def succeeded(self) -> bool:
        """The command ran to its own end and exited 0."""
        return self.reason == "exited" and self.exit_code == 0
