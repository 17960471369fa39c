"""What a task's process group holds right now, read from ``/proc`` (Linux).

The rlimit fallback limits each process alone; a task that forks ten children could
hold ten times its memory. This reads every process in the group, so the watchdog can
stop the task on the group's sum. Processes that vanish mid-read are skipped; a
malformed stat line is skipped, never raised.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs

__all__ = ["GroupUsage", "Groups", "SharedScan", "group_usage", "scan_groups", "summed"]

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")


@attrs.frozen
class GroupUsage:
    """The live (non-zombie) members of one process group and what they use."""

    members: int
    rss: int  # bytes, summed
    cpu_time: float  # seconds of user+system, with reaped children's, summed


#: Per process group: each live member's (pid, rss bytes, cpu ticks).
Groups = dict[int, list[tuple[int, int, int]]]


def scan_groups() -> Groups:
    """One pass over ``/proc``: every live process, by its process group."""
    groups: Groups = {}
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return groups
    for name in entries:
        if not name.isdigit():
            continue
        try:
            raw = (_PROC / name / "stat").read_bytes()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces or ')', so split after
        # the last ')'.
        _, _, rest = raw.rpartition(b")")
        fields = rest.split()
        if len(fields) < 22 or fields[0] == b"Z":
            continue
        try:
            pgid = int(fields[2])
            used = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
            pages = int(fields[21])
        except ValueError:
            continue  # skipped whole: nothing of a malformed line is counted
        groups.setdefault(pgid, []).append((int(name), pages * _PAGE, used))
    return groups


def summed(groups: Groups, pgid: int, skip: Iterable[int | None] = ()) -> GroupUsage:
    """`pgid`'s usage from a scan, but for the processes in `skip`."""
    skipped = {pid for pid in skip if pid is not None}
    members = [m for m in groups.get(pgid, ()) if m[0] not in skipped]
    rss, ticks = sum(m[1] for m in members), sum(m[2] for m in members)
    return GroupUsage(len(members), rss, ticks / _TICKS)


def group_usage(pgid: int, skip: Iterable[int | None] = ()) -> GroupUsage:
    """Sum RSS and CPU time over the processes whose process group is `pgid`, but for
    the processes in `skip` (the task's wrapper and init, not the task's to pay for)."""
    return summed(scan_groups(), pgid, skip)


class SharedScan:
    """One ``/proc`` scan shared by every task's watchdog, taken at most every
    `min_interval` and never more than `budget` of the time (a scan reads every
    process on the machine: with 50 tasks each scanning 4 times a second, 20 daemons
    on one 2-core machine spent it all there, and their leases lapsed)."""

    def __init__(
        self, min_interval: float, budget: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self._min_interval, self._budget, self._clock = min_interval, budget, clock
        self._groups: Groups = {}
        self._next = self._taken = -math.inf

    def usage(
        self, pgid: int, skip: Iterable[int | None] = (), *, not_before: float = -math.inf
    ) -> GroupUsage:
        """`pgid`'s usage from the latest scan, scanning again if that one is due or
        was taken before `not_before` (a reap must not see a group gone from a scan
        taken before its kill; reaps at about the same time share one)."""
        started = self._clock()
        if started >= self._next or self._taken < not_before:
            self._taken = started
            self._groups = scan_groups()
            took = self._clock() - started
            self._next = started + max(self._min_interval, took / self._budget)
        return summed(self._groups, pgid, skip)
