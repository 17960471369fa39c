"""`observe.client`: the reading end of ``GET /events`` and the one-line format."""

from __future__ import annotations

import http.server
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from populi_p2p.api import ApiError
from populi_p2p.observe.client import format_event, read_events

#: What the fake daemon streams: two buffered events, junk it skips, then live ones.
STREAM = [
    ": comment",
    'data: {"kind": "member.joined", "message": "a joined"}',
    "data: not json",
    "data: [1, 2]",
    'data: {"kind": "member.failed", "message": "b failed"}',
    ": live",
    'data: {"kind": "gpu.report", "message": "new"}',
]


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _handler(events_status: int) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/v1/status":
                body = b"{}"
                self.send_response(200)
                self.send_header("content-type", "application/json")
            else:
                body = "".join(line + "\n" for line in STREAM).encode()
                self.send_response(events_status)
                self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def address_string(self) -> str:  # a unix socket's peer has no host
            return "unix"

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture(params=[200], ids=["ok"])
def daemon(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "api.sock"
    server = _Server(str(path), _handler(request.param))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()


def test_without_follow_the_buffered_events_only(daemon: Path) -> None:
    events = list(read_events(daemon, follow=False))
    assert [e["kind"] for e in events] == ["member.joined", "member.failed"]


def test_with_follow_the_live_events_too(daemon: Path) -> None:
    events = list(read_events(daemon, follow=True))  # the fake ends its stream
    assert [e["kind"] for e in events] == ["member.joined", "member.failed", "gpu.report"]


@pytest.mark.parametrize("daemon", [503], indirect=True, ids=["refused"])
def test_a_refused_stream_is_one_line(daemon: Path) -> None:
    with pytest.raises(ApiError, match="refused GET /events: 503"):
        list(read_events(daemon, follow=False))


def test_no_daemon_is_the_usual_error(tmp_path: Path) -> None:
    with pytest.raises(ApiError, match="not running"):
        list(read_events(tmp_path / "api.sock", follow=False))


def test_format_event_is_time_kind_message_on_one_safe_line() -> None:
    when = 1_700_000_000.0
    line = format_event({"time": when, "kind": "member.joined", "message": "a\x1b[2Jb\nc"})
    stamp = time.strftime("%H:%M:%S", time.localtime(when))
    assert line == f"{stamp} {'member.joined':<16} a\\x1b[2Jb\\nc"
    assert format_event({}) == f"- {'?':<16} "
    assert format_event({"time": "soon", "kind": 3}).startswith("- 3 ")
    assert "\\u202e" in format_event({"kind": "\u202e"})  # a bidi override, escaped
