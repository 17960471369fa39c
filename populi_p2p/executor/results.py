"""From the executor's `TaskExited` to the signed `TaskResult` the owner posts.

The result carries an integer exit code and a bounded output tail; an end that was
not the command's own choice (a limit, a failed start) also says why, in one line at
the end of the tail, so `populi-node task` shows ``memory: used more than ...``. A
command that cannot run as given (not found, not executable) makes a `final` result:
the task fails for good, with ``; not retried`` at the end of that line.
"""

from __future__ import annotations

from typing import Final

from ..leases import TaskResult
from ..leases._entry import OUTPUT_TAIL_MAX
from ._types import TaskExited

__all__ = ["RESULT_TAIL_BYTES", "START_FAILED_CODE", "result_of", "result_tail"]

#: The exit code of a result whose command never ran (``start_failed`` without a
#: process): 127, as a shell reports a command it could not run.
START_FAILED_CODE: Final = 127
#: Bytes of each of stdout and stderr the node keeps in a result: results gossip in
#: datagrams, so they stay small (the full output stays on the owner).
RESULT_TAIL_BYTES: Final = 200


def result_tail(stdout_tail: bytes, stderr_tail: bytes) -> bytes:
    """The output tail of a result: stdout's, then stderr's after a marker."""
    if not stderr_tail:
        return stdout_tail
    return stdout_tail + b"\n[stderr]\n" + stderr_tail


def result_of(exited: TaskExited) -> TaskResult:
    """The result of one epoch's end; never zero unless the command exited 0 itself."""
    code = exited.exit_code
    if code is None:
        code = START_FAILED_CODE
    if exited.reason != "exited" and code == 0:
        code = 1  # stopped by a limit right as it exited 0: still a failure
    tail = result_tail(exited.stdout_tail, exited.stderr_tail)
    if exited.reason != "exited":
        after = "; not retried" if exited.final else ""
        line = f"\n[populi] {exited.reason}: {exited.detail}"[:280] + after
        encoded = line.encode("utf-8", "replace")
        tail = tail[-(OUTPUT_TAIL_MAX - len(encoded)) :] + encoded
    duration = max(0.0, exited.ended_at - exited.started_at)
    return TaskResult(
        code, tail[-OUTPUT_TAIL_MAX:], duration, final=exited.final,
        outputs=exited.outputs, holders=exited.holders,
    )  # fmt: skip
