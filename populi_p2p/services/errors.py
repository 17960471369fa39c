"""The one error a service may raise out of the node's start-up, and how a failed
start-up becomes that one line."""

from __future__ import annotations

import errno

__all__ = ["NodeStartError", "describe_os_error", "first_os_error", "start_error"]


class NodeStartError(Exception):
    """The daemon cannot start; the message is one line with the cause and the fix."""


def describe_os_error(exc: OSError, what: str, fix: str) -> str:
    """One line for `exc` about `what` (a path), ending with the fix."""
    code = exc.errno
    if code == errno.EROFS:
        return f"{what} is on a read-only file system ({fix})"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left for {what}: the disk is full (free some space, {fix})"
    if code in (errno.EACCES, errno.EPERM):
        return f"no permission to write {what} ({fix})"
    reason = exc.strerror or type(exc).__name__
    return f"cannot use {what}: {reason} ({fix})"


def first_os_error(exc: BaseException) -> OSError | None:
    """The first `OSError` in `exc` (itself, or a leaf of an exception group)."""
    pending = [exc]
    while pending:
        current = pending.pop(0)
        if isinstance(current, OSError):
            return current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
    return None


def start_error(group: BaseExceptionGroup[BaseException]) -> NodeStartError | None:
    """The one line to show for a start-up that failed inside the nursery, if any.

    A service that cannot start raises `NodeStartError`, or an `OSError` from a library
    (hypercorn binding the socket): either becomes one line. Anything else is a bug and
    is left to propagate.
    """
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        else:
            leaves.append(exc)
    for exc in leaves:
        if isinstance(exc, NodeStartError):
            return exc
    for exc in leaves:
        if isinstance(exc, OSError):
            return NodeStartError(
                describe_os_error(exc, "start-up", "check --state-dir, --bind and --port")
            )
    return None
