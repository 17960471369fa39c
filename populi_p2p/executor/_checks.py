"""What the executor checks before a task starts: its arguments and the task user.

Every argument from the lease service is treated as hostile: a bad one is one line in
a ``start_failed`` result, never an exception.
"""

from __future__ import annotations

import os
import pwd
import re
from typing import Final

__all__ = ["EPOCH_MAX", "TASK_ID", "check_arguments", "resolve_task_user"]

#: A task id is a path component: letters, digits, ``_`` and ``-`` only (lease ids are hex).
TASK_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
#: A GPU UUID goes into a comma-separated variable: no commas, no spaces.
_GPU_UUID: Final = re.compile(r"[A-Za-z0-9_:.-]{1,96}")
EPOCH_MAX: Final = 1 << 62


def check_arguments(task_id: object, epoch: object, gpu_uuids: object) -> str | None:
    """One line saying what is wrong with the arguments, or None."""
    if not isinstance(task_id, str) or not TASK_ID.fullmatch(task_id):
        return "task id must be 1..128 letters, digits, '_' or '-'"
    if type(epoch) is not int or not 0 <= epoch < EPOCH_MAX:
        return f"epoch must be an integer in 0..{EPOCH_MAX - 1}"
    if not isinstance(gpu_uuids, list) or not all(
        isinstance(u, str) and _GPU_UUID.fullmatch(u) for u in gpu_uuids
    ):
        return "gpu uuids must be a list of GPU UUID strings (letters, digits, ':', '.', '_', '-')"
    return None


def resolve_task_user(name: str | None) -> tuple[int | None, int | None, str]:
    """(uid, gid, name) to switch to, or (None, None, name) to stay who we are.

    Raises:
        ValueError: one line: no such user, or the daemon is not root and names another.
    """
    me = pwd.getpwuid(os.geteuid()).pw_name if os.geteuid() >= 0 else "?"
    if os.geteuid() != 0:
        if name not in (None, me):
            raise ValueError(
                f"--task-user {name}: only a daemon running as root can switch users; omit it"
            )
        return None, None, me
    name = name or "nobody"
    if name == "root":
        return None, None, "root"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"--task-user {name}: no such user on this machine (try nobody)") from None
    if entry.pw_uid == 0:
        return None, None, name
    return entry.pw_uid, entry.pw_gid, name
