"""An outsider on a daemon's HTTP ports, and a watch on what it costs the daemon
(issue 18): many connections that send a request's headers, then its body byte by byte
(`SlowBodies`) or as fast as the daemon reads it (`BigBodies`), reopened as the daemon
closes them; meanwhile `Probe` times ``/health`` and the CLI's ``status`` and samples
the daemon's open files and resident memory.
"""

from __future__ import annotations

import errno
import http.client
import os
import resource
import socket
import threading
import time

import attrs
import pytest

from tests.node.harness import Daemon

from .attacker import Address

CHUNK = 64 * 1024


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def allow_open_files(wanted: int) -> None:
    """This process may open `wanted` sockets (the attacker's), or the test skips."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return
    if hard == resource.RLIM_INFINITY or hard >= wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        return
    try:  # root may raise the hard limit too
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
    except (ValueError, OSError):
        pytest.skip(f"the attacker needs {wanted} open files; the hard limit is {hard}")


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def request_head(path: str, length: int, host: str = "populi") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n\r\n"
    ).encode()


@attrs.define
class Probe:
    """A thread that, every `interval` seconds, times ``GET /health`` on `health` and
    the control API's status, and samples the daemon's open files and RSS."""

    daemon: Daemon
    health: Address
    interval: float = 0.2
    latencies: list[float] = attrs.field(factory=list)
    failures: list[str] = attrs.field(factory=list)
    files: list[int] = attrs.field(factory=list)
    rss: list[int] = attrs.field(factory=list)
    _stop: threading.Event = attrs.field(factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return int(self.daemon.status()["node"]["pid"])

    def start(self) -> Probe:
        pid = self.pid
        self._thread = threading.Thread(target=self._run, args=(pid,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()

    def _run(self, pid: int) -> None:
        while not self._stop.is_set():
            self.files.append(open_files(pid))
            self.rss.append(rss_bytes(pid))
            self._timed("/health", self._get_health)
            self._timed("status", self.daemon.status)
            self._stop.wait(self.interval)

    def _timed(self, what: str, call: object) -> None:
        started = time.monotonic()
        try:
            call()  # type: ignore[operator]
        except Exception as exc:
            self.failures.append(f"{what}: {exc!r}")
        self.latencies.append(time.monotonic() - started)

    def _get_health(self) -> None:
        conn = http.client.HTTPConnection(*self.health, timeout=5.0)
        try:
            conn.request("GET", "/health")
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
        finally:
            conn.close()


class Flood:
    """`count` connections from `sources` to `target`, each sent `head` and then its
    body (`next_body`), kept open and reopened (at most `reopen_per_tick` per tick)
    when the daemon closes them."""

    def __init__(
        self, target: Address, sources: list[str], count: int, head: bytes, reopen_per_tick: int
    ) -> None:
        self.target = target
        self.sources = sources
        self.count = count
        self.head = head
        self.reopen_per_tick = reopen_per_tick
        self.opened = 0
        self.closed_by_daemon = 0
        self.body_bytes = 0
        self.conns: dict[socket.socket, int] = {}  # socket -> bytes of the request sent

    def _open(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((self.sources[self.opened % len(self.sources)], 0))
        code = s.connect_ex(self.target)
        if code not in (0, errno.EINPROGRESS):
            s.close()
            return
        self.opened += 1
        self.conns[s] = 0

    def _drop(self, s: socket.socket) -> None:
        self.closed_by_daemon += 1
        del self.conns[s]
        s.close()

    def fill(self) -> None:
        """Open connections up to `count` (all at first, then `reopen_per_tick`)."""
        budget = self.count if not self.opened else self.reopen_per_tick
        while len(self.conns) < self.count and budget > 0:
            self._open()
            budget -= 1

    def send(self, s: socket.socket, data: bytes) -> int:
        """Send what `s` takes of `data` now: the bytes sent (0 while it is still
        connecting or its buffer is full; 0 and dropped when the daemon closed it)."""
        try:
            return s.send(data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            if exc.errno not in (errno.ENOTCONN, errno.EAGAIN):  # else: still connecting
                self._drop(s)
            return 0

    def closed(self, s: socket.socket) -> bool:
        """Whether the daemon answered and closed `s` (read what it sent)."""
        try:
            data = s.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            if exc.errno == errno.ENOTCONN:
                return False
            self._drop(s)
            return True
        if data == b"":
            self._drop(s)
            return True
        return False

    def close(self) -> None:
        for s in list(self.conns):
            s.close()
        self.conns.clear()


class SlowBodies(Flood):
    """Each connection sends one byte per tick: of its body once its head is sent
    whole (`trickle_head` False), or of its head too (`trickle_head` True)."""

    def __init__(self, *args: object, trickle_head: bool, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.trickle_head = trickle_head

    def tick(self) -> None:
        self.fill()
        for s in list(self.conns):
            if self.closed(s):
                continue
            at = self.conns[s]
            if at >= len(self.head):
                data = b" "
            elif self.trickle_head:
                data = self.head[at : at + 1]
            else:
                data = self.head[at:] + b"{"
            sent = self.send(s, data)
            if s in self.conns:
                self.conns[s] = at + sent
                self.body_bytes += max(0, at + sent - max(at, len(self.head)))


class BigBodies(Flood):
    """Each connection sends its head, then its whole body as fast as it goes."""

    def __init__(self, *args: object, body: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.body = body
        self.filler = b" " * CHUNK

    def pump(self, seconds: float) -> None:
        total = len(self.head) + self.body
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.fill()
            for s in list(self.conns):
                if self.closed(s):
                    continue
                at = self.conns[s]
                if at >= total:
                    continue
                data = self.head[at:] if at < len(self.head) else self.filler[: total - at]
                n = self.send(s, data)
                if s not in self.conns:
                    continue
                self.conns[s] = at + n
                self.body_bytes += max(0, at + n - max(at, len(self.head)))
            time.sleep(0.002)  # pacing: the loop must not take a core from the daemon
