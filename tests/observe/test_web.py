"""The observability ASGI app alone: routes, read-only, the auth hook, `mount`."""

from __future__ import annotations

from typing import Any

import httpx

from populi_p2p.observe import EventService, MetricsService, make_observe_app, mount
from populi_p2p.observe.web import AsgiApp, Receive, Scope, Send, handles, sse_frame


class Backend:
    def __init__(self) -> None:
        self.events = EventService(clock=lambda: 5.0)
        self._metrics = MetricsService()

    def metrics(self) -> bytes:
        return self._metrics.render()

    def mesh(self) -> dict[str, Any]:
        return {"members": [], "tasks": None, "routes": None}


def client(app: AsgiApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")  # type: ignore[arg-type]


async def test_routes_assets_and_read_only() -> None:
    async with client(make_observe_app(Backend())) as c:
        page = await c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        # Nothing from outside: the policy allows only this origin.
        assert page.headers["content-security-policy"].startswith("default-src 'self'")
        assert "http://" not in page.text and "https://" not in page.text
        for asset in ("/static/dashboard.js", "/static/dashboard.css"):
            r = await c.get(asset)
            assert r.status_code == 200, asset
            text = r.text.replace('"http://www.w3.org/2000/svg"', "")  # a name, not a fetch
            assert "http://" not in text and "https://" not in text
        assert (await c.get("/static/../web.py")).status_code == 404
        assert (await c.get("/static/nope.js")).status_code == 404
        assert (await c.get("/metrics")).headers["content-type"].startswith("text/plain")
        assert (await c.get("/api/mesh")).json()["tasks"] is None
        for method in ("POST", "PUT", "DELETE"):
            assert (await c.request(method, "/api/mesh")).status_code == 405


async def test_authorize_hook_refuses_with_401() -> None:
    seen: list[str] = []

    async def authorize(scope: Scope) -> bool:
        seen.append(scope["path"])
        return dict(scope["headers"]).get(b"authorization") == b"Bearer good"

    async with client(make_observe_app(Backend(), authorize=authorize)) as c:
        assert (await c.get("/metrics")).status_code == 401
        ok = await c.get("/metrics", headers={"authorization": "Bearer good"})
        assert ok.status_code == 200
    assert seen == ["/metrics", "/metrics"]


async def test_mount_sends_only_observe_paths_to_the_observe_app() -> None:
    async def other(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"other"})

    app = mount(other, make_observe_app(Backend()))
    async with client(app) as c:
        assert (await c.get("/v1/chat/completions")).status_code == 299
        assert (await c.get("/metrics")).status_code == 200
        assert (await c.get("/static/dashboard.js")).status_code == 200
    assert handles("/events") and not handles("/v1/status")


def test_sse_frame_is_one_event() -> None:
    frame = sse_frame({"seq": 3, "kind": "x", "message": "line\nbreak"})
    assert frame.startswith(b"id: 3\ndata: {") and frame.endswith(b"\n\n")
    assert frame.count(b"\n\n") == 1  # the newline in the message is escaped by JSON
