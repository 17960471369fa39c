"""The event stream of a real daemon: `--follow` sees live events, and a leave ends
open streams cleanly and at once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.node.harness import Mesh, wait_until


@pytest.mark.slow
def test_follow_prints_live_events_and_leave_ends_streams(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    follow = None
    try:
        a = mesh.start("a")
        out_path = tmp_path / "follow.jsonl"
        with out_path.open("wb") as out:
            follow = subprocess.Popen(
                [sys.executable, "-m", "populi_p2p.cli", "events", "--follow", "--json",
                 "--state-dir", str(a.state_dir)],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

        def followed() -> list[dict[str, object]]:
            return [json.loads(line) for line in out_path.read_text().splitlines()]

        # The buffered GPU report arrives first; then b joins while we follow.
        wait_until(lambda: any(e["kind"] == "gpu.report" for e in followed()), 20, "buffer")
        b = mesh.start("b", "--bootstrap", a.address)
        wait_until(
            lambda: any(e["kind"] == "member.joined" and e["node_id"] == b.node_id
                        for e in followed()),
            20, "b's join followed live",
        )  # fmt: skip
        assert follow.poll() is None  # --follow keeps going

        # A raw reader of /events, to see how its stream ends.
        ended: list[str] = []
        connected = threading.Event()
        transport = httpx.HTTPTransport(uds=str(a.client.socket_path))

        def read() -> None:
            try:
                with (
                    httpx.Client(transport=transport, base_url="http://p", timeout=None) as c,
                    c.stream("GET", "/events") as stream,
                ):
                    for line in stream.iter_lines():
                        if line == ": live":
                            connected.set()
                ended.append("clean")
            except httpx.HTTPError as exc:
                ended.append(f"cut: {exc}")

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert connected.wait(timeout=10)
        a.client.post("/v1/leave")
        started = time.monotonic()
        assert a.wait_exit(timeout=20) == 0
        reader.join(timeout=10)
        assert ended == ["clean"]
        # Ending the streams means the leave does not wait for the server's grace period.
        assert time.monotonic() - started < 5
        assert follow.wait(timeout=10) == 0
    finally:
        if follow is not None and follow.poll() is None:
            follow.kill()
            follow.wait()
        mesh.stop_all()
