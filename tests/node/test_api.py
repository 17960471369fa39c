"""The control API served by hypercorn over a unix socket, talked to with ApiClient."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import trio

from populi_p2p.api import ApiClient, ApiError, make_app, serve_api


class FakeBackend:
    def __init__(self) -> None:
        self.leaves = 0
        self.leave_requested = trio.Event()

    def status(self) -> dict[str, Any]:
        return {"node": {"name": "a", "node_id": "x"}}

    def members(self) -> list[dict[str, Any]]:
        return [{"name": "a", "state": "alive"}]

    def gpus(self) -> dict[str, Any]:
        raise RuntimeError("probe exploded")

    async def probe_gpus(self) -> dict[str, Any]:
        await trio.sleep(0)  # the node awaits the monitor's fresh probe
        return {"table": "probed", "report": None}

    def request_leave(self) -> None:
        self.leaves += 1
        self.leave_requested.set()


async def test_api_over_unix_socket(tmp_path: Path) -> None:
    backend = FakeBackend()
    sock = tmp_path / "api.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_api, make_app(backend), sock)
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        client = ApiClient(sock)
        status = await trio.to_thread.run_sync(client.get, "/v1/status")
        assert status["node"]["name"] == "a"
        members = await trio.to_thread.run_sync(client.get, "/v1/members")
        assert members == [{"name": "a", "state": "alive"}]
        # A backend bug is a 500 with one line, and the server keeps serving.
        try:
            await trio.to_thread.run_sync(client.get, "/v1/gpus")
        except ApiError as exc:
            assert "probe exploded" in str(exc)
            assert "\n" not in str(exc)
        else:
            raise AssertionError("a failing backend must give an ApiError")
        # An async handler is awaited: POST /v1/gpus/probe answers with the new report.
        probed = await trio.to_thread.run_sync(client.post, "/v1/gpus/probe")
        assert probed == {"table": "probed", "report": None}
        # Wrong method and unknown path are refused, not crashes.
        for method, path in (("get", "/v1/leave"), ("get", "/v1/gpus/probe"), ("get", "/nope")):
            try:
                await trio.to_thread.run_sync(getattr(client, method), path)
            except ApiError as exc:
                assert "refused" in str(exc)
            else:
                raise AssertionError(f"{method} {path} must fail")
        assert backend.leaves == 0
        result = await trio.to_thread.run_sync(client.post, "/v1/leave")
        assert result == {"leaving": True}
        await backend.leave_requested.wait()
        assert await trio.to_thread.run_sync(client.is_running)
        nursery.cancel_scope.cancel()


def test_client_errors_are_one_line(tmp_path: Path) -> None:
    missing_dir = ApiClient(tmp_path / "nope" / "api.sock")
    try:
        missing_dir.get("/v1/status")
    except ApiError as exc:
        assert "does not exist" in str(exc) and "\n" not in str(exc)
    no_daemon = ApiClient(tmp_path / "api.sock")
    try:
        no_daemon.get("/v1/status")
    except ApiError as exc:
        assert "not running" in str(exc) and "populi-node up" in str(exc)
    # A stale socket file from a crashed daemon: nobody listens.
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "api.sock"))
    s.close()
    try:
        no_daemon.get("/v1/status")
    except ApiError as exc:
        assert "not running" in str(exc)
    else:
        raise AssertionError("a stale socket must read as not running")
    assert not no_daemon.is_running()
