"""What a task's process group holds right now, read from ``/proc`` (Linux).

The rlimit fallback limits each process alone; a task that forks ten children could
hold ten times its memory. This reads every process in the group, so the watchdog can
stop the task on the group's sum. Processes that vanish mid-read are skipped; a
malformed stat line is skipped, never raised.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import attrs

__all__ = ["GroupUsage", "group_usage"]

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")


@attrs.frozen
class GroupUsage:
    """The live (non-zombie) members of one process group and what they use."""

    members: int
    rss: int  # bytes, summed
    cpu_time: float  # seconds of user+system, with reaped children's, summed


def group_usage(pgid: int, skip: Iterable[int | None] = ()) -> GroupUsage:
    """Sum RSS and CPU time over the processes whose process group is `pgid`, but for
    the processes in `skip` (the task's wrapper and init, not the task's to pay for)."""
    members, rss, ticks = 0, 0, 0
    skipped = {str(pid) for pid in skip if pid is not None}
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return GroupUsage(0, 0, 0.0)
    for name in entries:
        if not name.isdigit() or name in skipped:
            continue
        try:
            raw = (_PROC / name / "stat").read_bytes()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces or ')', so split after
        # the last ')'.
        _, _, rest = raw.rpartition(b")")
        fields = rest.split()
        if len(fields) < 22:
            continue
        try:
            if int(fields[2]) != pgid or fields[0] == b"Z":
                continue
            used = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
            pages = int(fields[21])
        except ValueError:
            continue  # skipped whole: nothing of a malformed line is counted
        members, rss, ticks = members + 1, rss + pages * _PAGE, ticks + used
    return GroupUsage(members, rss, ticks / _TICKS)
