"""``populi-node logs``: a task's full output, read from the node that ran it.

The executor keeps each epoch's stdout and stderr on the owner (only bounded tails
travel in results). The API serves them in bounded chunks from an offset, so the CLI
follows a running task by asking again from where it stopped; a chunk is base64 so
the bytes arrive exactly as written. When another node ran the task, the answer says
which one and to ask there: output is not fetched across the mesh yet (no
authenticated node-to-node call exists for it).
"""

from __future__ import annotations

import base64
import os
from typing import Any, Final, cast

from ..leases import TaskEntry
from ..leases._entry import Phase
from .executor import ExecutorService, Stream

__all__ = ["LOG_CHUNK_BYTES", "read_log"]

#: Most bytes of output one API answer carries (the CLI asks again for more).
LOG_CHUNK_BYTES: Final = 64 * 1024


def read_log(
    executor: ExecutorService, entry: TaskEntry, me: str, stream: object, offset: object
) -> dict[str, Any]:
    """Up to `LOG_CHUNK_BYTES` of the task's `stream` from `offset`, and whether more
    can come (``done``: the task is not running here and everything was read).

    Raises:
        ValueError: a bad stream or offset (one line).
        LookupError: this node never ran the task (one line naming the node that did).
    """
    tid = entry.task_id
    if not isinstance(offset, str | int) or not str(offset).isdigit():
        raise ValueError("offset must be a non-negative integer")
    start = int(offset)
    try:
        path = executor.log_path(tid, cast(Stream, stream if isinstance(stream, str) else "?"))
    except FileNotFoundError:
        raise LookupError(_elsewhere(entry, me)) from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise LookupError(f"the output of task {tid} is gone from this node") from None
    try:
        data = os.pread(fd, LOG_CHUNK_BYTES, start)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    running = tid in executor.running()
    end = start + len(data)
    return {
        "id": tid,
        "stream": stream,
        "data": base64.b64encode(data).decode(),
        "offset": end,
        "done": not running and end >= size,
    }


def _elsewhere(entry: TaskEntry, me: str) -> str:
    ran = [c for c in entry.claims if c.phase >= Phase.RUNNING and c.owner != me]
    tid = entry.task_id
    if not ran:
        return f"task {tid} has not run anywhere yet (see populi-node task {tid})"
    owner = ran[-1].owner
    return (
        f"task {tid} ran on node {owner}, which keeps its output: run"
        f" populi-node logs {tid} on that node"
    )
