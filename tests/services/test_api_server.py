"""`ApiService`: the control API on its unix socket, the observability routes mounted in
front, and a stop that lets in-flight answers go out."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from populi_p2p._asgi import send_json
from populi_p2p.api import ApiClient, ApiError
from populi_p2p.services.api_server import ApiService


class Backend:
    def status(self) -> dict[str, Any]:
        return {"node": {"name": "a"}}

    def members(self) -> list[dict[str, Any]]:
        return []

    def gpus(self) -> dict[str, Any]:
        return {}

    async def probe_gpus(self) -> dict[str, Any]:
        return {}

    def request_leave(self) -> None:
        pass


async def observe(scope: Any, receive: Any, send: Any) -> None:
    await send_json(send, 200, {"observed": scope["path"]})


async def get(socket: Path, path: str) -> Any:
    return await trio.to_thread.run_sync(ApiClient(socket, timeout=10).get, path)


async def test_serves_the_backend_and_the_mounted_routes(tmp_path: Path) -> None:
    socket = tmp_path / "api.sock"
    api = ApiService(socket, Backend(), extra=observe)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(api.run) == socket
        assert stat.S_IMODE(socket.stat().st_mode) == 0o600
        assert await get(socket, "/v1/status") == {"node": {"name": "a"}}
        assert await get(socket, "/api/mesh") == {"observed": "/api/mesh"}
        assert not api.done.is_set()
        api.stop()
        with trio.fail_after(10):
            await api.done.wait()
    assert not await trio.to_thread.run_sync(ApiClient(socket).is_running)


async def test_without_extra_the_observability_paths_are_not_found(tmp_path: Path) -> None:
    socket = tmp_path / "api.sock"
    api = ApiService(socket, Backend())
    async with trio.open_nursery() as nursery:
        await nursery.start(api.run)
        assert await get(socket, "/v1/members") == []
        with pytest.raises(ApiError, match="no such endpoint /api/mesh"):
            await get(socket, "/api/mesh")
        nursery.cancel_scope.cancel()
    assert api.done.is_set()  # set however run ends
