"""Keeping tasks apart: a uid of its own per running task, and what the node can add.

As root, each task runs as a uid (and gid of the same number) taken from a configured
range, as systemd's ``DynamicUser`` does: one that no user or group of this machine
names, that no running task holds and that no live process owns. The uid goes back
to the range when the task's end is reported; its work dir (and private ``/tmp``) is
then handed to root (`seal`), so whoever gets that uid next cannot reach what the task
left. `UidAllocator` hands uids out round-robin, so a uid comes back as late as the
range allows.

The namespaces the wrapper adds (PID, mount with a private ``/tmp``, IPC) are probed
once at start-up (`_wrapper.probe`); `Isolation` says which level holds, in the
one line the executor logs.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import attrs

__all__ = [
    "DEFAULT_TASK_UIDS",
    "Isolation",
    "UidAllocator",
    "parse_uid_range",
    "seal",
    "seal_leftovers",
    "uids_of_processes",
]

#: systemd's dynamic-user range: no distribution hands these out to users.
DEFAULT_TASK_UIDS: Final = (61184, 65519)
#: Never handed out: ``(uid_t) -1`` in 16 and 32 bits (they mean "unchanged" to setuid).
_NEVER: Final = frozenset({65535, 4294967295})
UID_MAX: Final = 4294967294


def parse_uid_range(text: str) -> tuple[int, int]:
    """``FIRST-LAST`` as two uids.

    Raises:
        ValueError: one line saying what is wrong and what is expected.
    """
    first, dash, last = text.strip().partition("-")
    if not dash or not first.isdigit() or not last.isdigit():
        raise ValueError(f"task uids {text!r}: expected FIRST-LAST, e.g. 61184-65519")
    return check_uid_range((int(first), int(last)))


def check_uid_range(uids: Sequence[int]) -> tuple[int, int]:
    """The range itself, once it is a usable one (no root, first <= last).

    Raises:
        ValueError: one line naming the bad bound.
    """
    if len(uids) != 2 or not all(type(uid) is int for uid in uids):
        raise ValueError(f"task uids {uids!r}: expected two integers, FIRST and LAST")
    first, last = uids
    if not 1 <= first <= last <= UID_MAX:
        raise ValueError(
            f"task uids {first}-{last}: need 1 <= FIRST <= LAST <= {UID_MAX} (default 61184-65519)"
        )
    return first, last


def _named(uid: int) -> bool:
    """A user or a group of this machine (``/etc/passwd``, ``/etc/group``, NSS) has it."""
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        pass
    try:
        grp.getgrgid(uid)
        return True
    except KeyError:
        return False


def uids_of_processes() -> set[int]:
    """The owner of every live process, from the ``/proc/PID`` directories."""
    owners = set()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError):
                    owners.add(os.stat(f"/proc/{name}").st_uid)
    return owners


class UidAllocator:
    """Hands out uids from ``first..last``, each to one running task at a time.

    `named` and `busy` say whether the machine uses a uid (tests pass their own):
    `named` for one uid, `busy` the set of uids that own a live process now.
    """

    def __init__(
        self,
        first: int,
        last: int,
        named: Callable[[int], bool] = _named,
        busy: Callable[[], set[int]] = uids_of_processes,
    ) -> None:
        self.first, self.last = check_uid_range((first, last))
        self._named, self._busy = named, busy
        self._held: set[int] = set()
        self._next = first

    @property
    def held(self) -> frozenset[int]:
        return frozenset(self._held)

    def allocate(self) -> int | None:
        """A free uid (also the task's gid), or None when every one is taken."""
        size = self.last - self.first + 1
        if len(self._held) >= size:
            return None
        busy = self._busy()
        for step in range(size):
            uid = self.first + (self._next - self.first + step) % size
            if uid in self._held or uid in _NEVER or uid in busy or self._named(uid):
                continue
            self._held.add(uid)
            self._next = uid + 1 if uid < self.last else self.first
            return uid
        return None

    def release(self, uid: int) -> None:
        """The task that held `uid` is over (a uid not held is ignored)."""
        self._held.discard(uid)


def seal(*paths: Path) -> None:
    """Hand each directory to root, mode 0700: the uid that wrote it, once given to
    another task, cannot reach what is inside. Best effort: a missing one is skipped."""
    for path in paths:
        with contextlib.suppress(OSError):
            os.chown(path, 0, 0, follow_symlinks=False)
            os.chmod(path, 0o700, follow_symlinks=False)


def seal_leftovers(tasks_dir: Path, first: int, last: int) -> int:
    """Seal the work and tmp dirs of every earlier task still owned by a uid of the
    range (a daemon that died never sealed them); how many were sealed."""
    sealed = 0
    with contextlib.suppress(OSError):
        for task in os.scandir(tasks_dir):
            if task.name.startswith(".") or not task.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                for epoch in os.scandir(task.path):
                    for part in ("work", "tmp"):
                        path = Path(epoch.path, part)
                        with contextlib.suppress(OSError):
                            if first <= path.lstat().st_uid <= last:
                                seal(path)
                                sealed += 1
    return sealed


@attrs.frozen
class Isolation:
    """What keeps this node's tasks apart, for the executor's one start-up line."""

    #: ``full``: own uids and namespaces; ``uids``: own uids only; ``namespaces``: one
    #: shared task user, in namespaces; ``none``: tasks share a uid and see each other.
    level: str
    #: Each task runs in its own PID, mount and IPC namespaces with a private /tmp.
    namespaces: bool
    #: One line for people: what holds, and what does not.
    detail: str

    @classmethod
    def decide(cls, *, root: bool, user: str, dynamic: str | None, probe: str) -> Isolation:
        """The level from who we are, who tasks run as, and the probe's answer.

        `dynamic` is the uid range (``"61184-65519"``) when each task gets its own
        uid, else None; `probe` is ``ok`` or why the kernel refused the namespaces.
        """
        namespaces = root and probe == "ok"
        spaces = "own PID, mount and IPC namespaces with a private /tmp"
        refused = f"the kernel refused namespaces ({probe})"
        if not root:
            return cls("none", False, (
                f"not root: every task runs as {user}, like the daemon, and can read and"
                " signal the other tasks and the daemon; run as root for a uid per task"
            ))  # fmt: skip
        if user == "root":
            return cls("none", False, (
                "tasks run as root (--task-user root): nothing keeps them apart"
            ))  # fmt: skip
        if dynamic is not None and namespaces:
            return cls("full", True, f"each task: its own uid from {dynamic}, {spaces}")
        if dynamic is not None:
            return cls("uids", False, (
                f"each task: its own uid from {dynamic}; {refused}: tasks share /tmp"
                " and see each other's processes (but cannot read or signal them)"
            ))  # fmt: skip
        if namespaces:
            return cls("namespaces", True, (
                f"every task runs as {user} (--task-user), with {spaces}: tasks cannot"
                " see each other's processes, but share a uid for files"
            ))  # fmt: skip
        return cls("none", False, (
            f"every task runs as {user} (--task-user) and {refused}: tasks can read and"
            " signal each other"
        ))  # fmt: skip
