"""The packet trace behind POPULI_TRACE_DIR (`populi_p2p._trace`): off by default, and
one line per packet naming what the storm analysis needs."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from populi_p2p._trace import TRACE_DIR_ENV, PacketTrace
from swim import Member, MemberJoined, MemberState
from swim.wire import AliveRef, Ping, Pull, encode


def test_the_trace_is_off_unless_the_environment_names_a_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(TRACE_DIR_ENV, raising=False)
    assert PacketTrace.from_environment("abc") is None
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path / "t"))
    trace = PacketTrace.from_environment("abc")
    assert trace is not None
    trace.packet_out(("127.0.0.1", 7), False, encode(Ping(1, "x", "abc", ("127.0.0.1", 8))))
    assert "\tout\t127.0.0.1:7\t0\t" in (tmp_path / "t" / "abc.trace").read_text()


def test_each_line_names_the_members_a_packet_tells_of() -> None:
    stream = io.StringIO()
    trace = PacketTrace(stream)
    payload = encode(
        AliveRef("m1", 3, ("127.0.0.1", 9), b"12345678"),
        Pull("me", ("127.0.0.1", 8), ("m2", "m3")),
    )
    trace.packet_in(("127.0.0.1", 9), True, 0.25, payload)
    member = Member("m1", ("127.0.0.1", 9), MemberState.ALIVE, 3, b"", 0.0, None)
    trace.event("ev", MemberJoined(member))
    trace.packet_in(("127.0.0.1", 9), False, 0.0, b"junk")
    lines = [line.split("\t") for line in stream.getvalue().splitlines()]
    assert lines[0][1:] == ["in", "127.0.0.1:9", "1", "0.2500", "aliveref:m1/3 pull:m2,m3"]
    assert lines[1][1:] == ["ev", "MemberJoined", "m1", "3"]
    assert lines[2][-1] == "undecodable"
