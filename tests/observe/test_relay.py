"""`UnixRelay`: a loopback TCP port that relays bytes both ways to a unix socket."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from populi_p2p.observe.relay import UnixRelay


@pytest.fixture
def upper_server(tmp_path: Path) -> Iterator[Path]:
    """A unix socket that answers each connection's bytes upper-cased, then closes."""
    path = tmp_path / "api.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while chunk := conn.recv(4096):  # until the relay shuts its write side
                    data += chunk
                conn.sendall(data.upper())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    listener.close()


def _exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    return answer


def test_bytes_go_to_the_socket_and_the_answer_comes_back(upper_server: Path) -> None:
    relay = UnixRelay(upper_server)
    try:
        assert relay.url == f"http://127.0.0.1:{relay.port}/"
        big = b"get / http/1.1\r\n" * 10_000  # more than one recv
        assert _exchange(relay.port, big) == big.upper()
        assert _exchange(relay.port, b"again") == b"AGAIN"  # one thread per connection
    finally:
        relay.close()


def test_a_gone_daemon_is_a_closed_connection(tmp_path: Path) -> None:
    relay = UnixRelay(tmp_path / "nothing.sock")
    try:
        assert _exchange(relay.port, b"hello") == b""
    finally:
        relay.close()


def test_close_stops_listening(upper_server: Path) -> None:
    relay = UnixRelay(upper_server)
    relay.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", relay.port), timeout=10).close()
