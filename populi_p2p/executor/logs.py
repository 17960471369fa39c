"""``populi-node logs``: a task's full output, read from the node that ran it.

The executor keeps each epoch's stdout and stderr on the owner (only bounded tails
travel in results). The API serves them in bounded chunks from an offset, so the CLI
follows a running task by asking again from where it stopped; a chunk is base64 so
the bytes arrive exactly as written.

When another node ran the task's latest epoch, `TaskLogs` fetches the chunk from that
node over the peer API (`LOG_PEER_PATH`, a signed call that only enrolled, unrevoked
keys pass), with the same checks on both sides and a bounded wait, so ``logs`` and
``logs --follow`` work from any node. An owner that is gone or does not answer is one
line naming it.

A certificate alone does not read anyone's output: the peer route answers a caller that
is a current member (alive or suspect in our membership) or the node that accepted the
task; any other caller gets 403 and is counted (`refused_not_member`).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import urllib.parse
from collections.abc import Callable
from typing import Any, Final, cast

import httpx
import trio

from ..inference.peer_api import PeerRequest, PeerResponse, PeerRoutes
from ..inference.peer_client import PeerClient, peer_base_url
from ..leases import TaskEntry
from ..leases._entry import Phase
from ..trust.record import NodeRecord
from .service import ExecutorService, Stream

__all__ = ["LOG_CHUNK_BYTES", "LOG_FETCH_TIMEOUT", "LOG_PEER_PATH", "TaskLogs", "read_log"]

#: Most bytes of output one API answer carries (the CLI asks again for more).
LOG_CHUNK_BYTES: Final = 64 * 1024
#: The largest offset asked for (a file offset beyond it is not a real log).
MAX_LOG_OFFSET: Final = 2**62
#: The peer route serving a chunk of a log kept here (``?id=&stream=&offset=``).
LOG_PEER_PATH: Final = "/populi/v1/task-logs"
#: Seconds one fetch from the owner may take, connect to last byte: under the CLI's
#: 10 s wait for the local API, so a silent owner is named rather than this node.
LOG_FETCH_TIMEOUT: Final = 5.0
#: Most bytes of a peer's answer read (a chunk in base64 plus the JSON around it).
_MAX_ANSWER_BYTES: Final = LOG_CHUNK_BYTES * 2 + 4096


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
    start = _offset(offset)
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


def _offset(offset: object) -> int:
    """`offset` as a bounded non-negative int. Raises ValueError (one line)."""
    text = str(offset) if isinstance(offset, str | int) else ""
    if not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) > MAX_LOG_OFFSET:
        raise ValueError(f"offset must be an integer from 0 to {MAX_LOG_OFFSET}")
    return int(text)


def _latest_owner(entry: TaskEntry) -> str | None:
    """The node that ran (or runs) the task's latest epoch that reached running."""
    ran = [c for c in entry.claims if c.phase >= Phase.RUNNING]
    return max(ran, key=lambda c: c.epoch).owner if ran else None


class TaskLogs:
    """Chunks of a task's output: read here, or fetched from the node that ran it.

    Args:
        me: this node's id.
        find: a task entry by id or prefix (raises `LookupError`).
        executor: this node's executor (holds the logs of what ran here).
        record_of: a member's verified record (its ``peer`` section gives the port).
        peer_client: signed calls to members (None until the peer API is up).
        is_member: whether a node id is a current member (alive or suspect here).
        timeout: seconds one fetch from the owner may take.
    """

    def __init__(
        self,
        me: str,
        *,
        find: Callable[[str], TaskEntry],
        executor: ExecutorService,
        record_of: Callable[[str], NodeRecord | None],
        peer_client: Callable[[], PeerClient | None],
        is_member: Callable[[str], bool],
        timeout: float = LOG_FETCH_TIMEOUT,
    ) -> None:
        self._me, self._find, self._executor = me, find, executor
        self._record_of, self._peer, self._timeout = record_of, peer_client, timeout
        self._is_member = is_member
        #: Peer calls refused: the caller is neither a member nor the task's acceptor.
        self.refused_not_member = 0

    def register_peer_routes(self, routes: PeerRoutes) -> None:
        routes.add("GET", LOG_PEER_PATH, self._serve)

    async def read(self, task_id: str, stream: object, offset: object) -> dict[str, Any]:
        """The chunk the local API answers (see `read_log`), from wherever it is.

        Raises:
            ValueError: a bad stream or offset.
            LookupError: no such task, it never ran, or its owner is gone (one line).
            TimeoutError: the owner did not answer within the timeout (one line).
        """
        entry = self._find(task_id)
        owner = _latest_owner(entry)
        if owner is None or owner == self._me:
            return read_log(self._executor, entry, self._me, stream, offset)
        if stream not in ("stdout", "stderr"):
            raise ValueError("stream must be stdout or stderr")
        return await self._fetch(owner, entry.task_id, str(stream), _offset(offset))

    async def _fetch(self, owner: str, tid: str, stream: str, start: int) -> dict[str, Any]:
        record = self._record_of(owner)
        peer = record.sections.get("peer") if record is not None else None
        port = peer.get("port") if isinstance(peer, dict) else None
        client = self._peer()
        where = f"node {owner[:12]} ({record.name})" if record is not None else f"node {owner}"
        if record is None or not isinstance(port, int) or client is None:
            raise LookupError(
                f"task {tid} ran on {where}, which keeps its output and is not in the mesh"
                " now (no peer address known): its output cannot be fetched"
            )
        query = urllib.parse.urlencode({"id": tid, "stream": stream, "offset": start})
        base = peer_base_url(record.address, port)
        body = b""
        status = 0
        with trio.move_on_after(self._timeout) as scope:
            try:
                async with client.stream(owner, base, "GET", f"{LOG_PEER_PATH}?{query}") as r:
                    status = r.status_code
                    async for part in r.aiter_raw():
                        body += part
                        if len(body) > _MAX_ANSWER_BYTES:
                            raise LookupError(f"{where} sent an oversized answer for task {tid}")
            except httpx.HTTPError as exc:
                raise LookupError(
                    f"task {tid} ran on {where}, which is unreachable"
                    f" ({type(exc).__name__}): its output cannot be fetched now"
                ) from None
        if scope.cancelled_caught:
            raise TimeoutError(
                f"task {tid} ran on {where}, which did not answer within"
                f" {self._timeout:g} s: try again"
            )
        return _checked(body, status, tid, stream, start, where)

    async def _serve(self, request: PeerRequest) -> PeerResponse:
        """The peer route: a chunk of a log kept here, with the local route's checks."""
        query = dict(urllib.parse.parse_qsl(request.query[:1024]))
        try:
            entry = self._find(query.get("id", ""))
            if entry.task_id != query.get("id"):
                raise LookupError("ask with the full task id")
            acceptor = entry.spec.submitted_by if entry.spec is not None else None
            if request.caller != acceptor and not self._is_member(request.caller):
                self.refused_not_member += 1
                return _json(403, {"error": "task output is served to current members only"})
            answer = read_log(
                self._executor, entry, self._me, query.get("stream", "stdout"),
                query.get("offset", "0"),
            )  # fmt: skip
        except ValueError as exc:
            return _json(400, {"error": str(exc)})
        except LookupError as exc:
            return _json(404, {"error": str(exc.args[0] if exc.args else exc)})
        return _json(200, answer)


def _json(status: int, body: dict[str, Any]) -> PeerResponse:
    return PeerResponse(status, json.dumps(body, sort_keys=True).encode())


def _checked(
    body: bytes, status: int, tid: str, stream: str, start: int, where: str
) -> dict[str, Any]:
    """The owner's answer, checked like any input from the network."""
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise LookupError(f"{where} sent a malformed answer for task {tid} (HTTP {status})")
    if status != 200:
        error = answer.get("error")
        reason = error if isinstance(error, str) else f"HTTP {status}"
        raise LookupError(f"task {tid} ran on {where}, which answers: {reason[:300]}")
    data, offset, done = answer.get("data"), answer.get("offset"), answer.get("done")
    try:
        raw = base64.b64decode(data, validate=True) if isinstance(data, str) else None
    except (binascii.Error, ValueError):
        raw = None
    if (
        raw is None
        or len(raw) > LOG_CHUNK_BYTES
        or type(offset) is not int
        or offset != start + len(raw)
        or not isinstance(done, bool)
    ):
        raise LookupError(f"{where} sent a malformed answer for task {tid}")
    return {"id": tid, "stream": stream, "data": data, "offset": offset, "done": done}
