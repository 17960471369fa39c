"""`TaskLogs` without daemons: the peer route's checks, and the owner's answer treated
as hostile input (malformed or forged answers are one line, never a crash)."""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.executor.logs import (
    LOG_CHUNK_BYTES,
    LOG_PEER_PATH,
    TaskLogs,
    _checked,
)
from populi_p2p.executor.service import ExecutorConfig, ExecutorService
from populi_p2p.inference.peer_api import PeerRequest, PeerRoutes
from populi_p2p.inference.peer_client import PeerClient
from populi_p2p.leases import TaskEntry
from populi_p2p.leases._entry import Phase
from populi_p2p.trust.record import NodeRecord

TID = "t" * 32
OWNER = "o" * 64
ACCEPTOR = "a" * 64
MEMBER = "m" * 64


def _entry(owner: str | None = OWNER) -> TaskEntry:
    claims = [] if owner is None else [SimpleNamespace(epoch=1, owner=owner, phase=Phase.RUNNING)]
    spec = SimpleNamespace(submitted_by=ACCEPTOR)
    return cast(TaskEntry, SimpleNamespace(task_id=TID, claims=claims, spec=spec))


def _find(task_id: str) -> TaskEntry:
    if not TID.startswith(task_id) or not task_id:
        raise LookupError(f"no single task matches {task_id!r}")
    return _entry()


def _record(port: object = 7001) -> NodeRecord:
    return cast(
        NodeRecord,
        SimpleNamespace(name="owner", address="127.0.0.1", sections={"peer": {"port": port}}),
    )


class _Peer:
    """A PeerClient stand-in answering every call with (status, body), or raising."""

    def __init__(self, status: int = 200, body: bytes = b"", error: Exception | None = None,
                 delay: float = 0.0) -> None:  # fmt: skip
        self.status, self.body, self.error, self.delay = status, body, error, delay
        self.calls: list[tuple[str, str, str]] = []

    @contextlib.asynccontextmanager
    async def stream(
        self, callee: str, base_url: str, method: str, path: str, body: bytes = b""
    ) -> AsyncIterator[httpx.Response]:
        self.calls.append((callee, base_url, path))
        await trio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        yield httpx.Response(self.status, stream=httpx.ByteStream(self.body))


def _logs(tmp_path: Path, peer: _Peer | None, record: NodeRecord | None = None) -> TaskLogs:
    executor = ExecutorService(ExecutorConfig(tasks_dir=tmp_path / "tasks"))
    return TaskLogs(
        "me" * 32, find=_find, executor=executor,
        record_of=lambda node: record if node == OWNER else None,
        peer_client=lambda: cast(PeerClient | None, peer), is_member={MEMBER}.__contains__,
        timeout=5.0,
    )  # fmt: skip


def _answer(data: bytes, offset: int, done: bool = True) -> bytes:
    chunk = {"id": TID, "stream": "stdout", "data": base64.b64encode(data).decode(),
             "offset": offset, "done": done}  # fmt: skip
    return json.dumps(chunk).encode()


async def test_a_remote_chunk_is_fetched_from_the_owner_with_the_full_id(tmp_path: Path) -> None:
    peer = _Peer(body=_answer(b"hello\n", 16))
    got = await _logs(tmp_path, peer, _record()).read(TID[:8], "stdout", "10")
    assert base64.b64decode(got["data"]) == b"hello\n" and got["offset"] == 16 and got["done"]
    [(callee, base, path)] = peer.calls
    assert callee == OWNER and base == "http://127.0.0.1:7001"
    assert path == f"{LOG_PEER_PATH}?id={TID}&stream=stdout&offset=10"


@pytest.mark.parametrize(
    ("stream", "offset", "says"),
    [("passwd", 0, "stream must be"), ("stdout", "-1", "offset"),
     ("stdout", str(2**63), "offset"), ("stdout", "1e3", "offset"), ("stdout", None, "offset")],
)  # fmt: skip
async def test_bad_arguments_are_refused_before_any_call(
    tmp_path: Path, stream: str, offset: object, says: str
) -> None:
    peer = _Peer(body=_answer(b"", 0))
    with pytest.raises(ValueError, match=says):
        await _logs(tmp_path, peer, _record()).read(TID, stream, offset)
    assert peer.calls == []


@pytest.mark.parametrize(
    ("peer", "record", "says"),
    [(_Peer(), None, "not in the mesh"),
     (_Peer(), _record(port="x"), "no peer address"),
     (None, _record(), "not in the mesh"),
     (_Peer(error=httpx.ConnectError("refused")), _record(), r"unreachable \(ConnectError\)"),
     (_Peer(404, b'{"error": "the output of task t is gone from this node"}'), _record(),
      "answers: the output of task t is gone"),
     (_Peer(500, b"<html>"), _record(), "malformed answer"),
     (_Peer(200, _answer(b"abc", 5)), _record(), "malformed answer"),  # offset != start + len
     (_Peer(200, b"x" * (3 * LOG_CHUNK_BYTES)), _record(), "oversized answer")],
)  # fmt: skip
async def test_an_owner_that_is_gone_or_misbehaves_is_one_line_naming_it(
    tmp_path: Path, peer: _Peer | None, record: NodeRecord | None, says: str
) -> None:
    with pytest.raises(LookupError, match=says) as info:
        await _logs(tmp_path, peer, record).read(TID, "stdout", 0)
    line = str(info.value)
    assert "\n" not in line and (OWNER[:12] in line), line


async def test_an_owner_that_does_not_answer_times_out_in_one_line(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    logs = _logs(tmp_path, _Peer(delay=60.0), _record())
    with pytest.raises(TimeoutError, match="did not answer within 5 s"):
        await logs.read(TID, "stdout", 0)


@given(st.binary(max_size=512), st.integers(0, 600))
def test_any_answer_is_a_chunk_or_one_lookup_error(body: bytes, status: int) -> None:
    try:
        got = _checked(body, status, TID, "stdout", 0, "node x")
    except LookupError as exc:
        assert "\n" not in str(exc)
    else:
        assert len(base64.b64decode(got["data"])) == got["offset"] <= LOG_CHUNK_BYTES


@pytest.mark.parametrize(
    ("query", "status", "says"),
    [("", 404, "no single task"), (f"id={TID[:8]}", 404, "full task id"),
     (f"id={TID}&offset=-1", 400, "offset"), (f"id={TID}&offset={'9' * 5000}", 400, "offset"),
     (f"id={TID}&stream=passwd", 400, "stream must be"),
     (f"id={TID}", 404, "gone from this node|ran on node|not run")],
)  # fmt: skip
async def test_the_peer_route_checks_like_the_local_route(
    tmp_path: Path, query: str, status: int, says: str
) -> None:
    routes = PeerRoutes()
    _logs(tmp_path, None).register_peer_routes(routes)
    handler = routes.find("GET", LOG_PEER_PATH)
    assert callable(handler)
    answer = await handler(PeerRequest(MEMBER, "GET", LOG_PEER_PATH, query, b""))
    assert answer.status == status and isinstance(answer.body, bytes)
    error: Any = json.loads(answer.body)["error"]
    assert isinstance(error, str) and "\n" not in error
    assert re.search(says, error), error


@pytest.mark.parametrize(
    ("caller", "status"), [(MEMBER, 404), (ACCEPTOR, 404), (OWNER, 403), ("x" * 64, 403)]
)
async def test_the_peer_route_serves_only_members_and_the_acceptor(
    tmp_path: Path, caller: str, status: int
) -> None:
    """An enrolled key that is not a current member (here: not even the last owner, now
    gone) reads nothing, and is counted; a member or the task's acceptor gets the route's
    answer (404 here: this node never ran the task)."""
    logs = _logs(tmp_path, None)
    routes = PeerRoutes()
    logs.register_peer_routes(routes)
    handler = routes.find("GET", LOG_PEER_PATH)
    assert callable(handler)
    answer = await handler(PeerRequest(caller, "GET", LOG_PEER_PATH, f"id={TID}", b""))
    assert answer.status == status
    assert logs.refused_not_member == (status == 403)
    if status == 403:
        assert isinstance(answer.body, bytes)
        assert json.loads(answer.body)["error"] == "task output is served to current members only"
