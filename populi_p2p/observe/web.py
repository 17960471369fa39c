"""The observability routes as one self-contained ASGI app, and a way to mount it.

=======================  ===============================================================
``GET /``                the dashboard page (static HTML, JS and CSS from the package)
``GET /static/<file>``   the page's assets; nothing is fetched from outside
``GET /metrics``         Prometheus text format, written by prometheus-client
``GET /events``          server-sent events: the buffered recent events, then live ones
``GET /api/mesh``        a JSON snapshot for the page: this node and every member
=======================  ===============================================================

Read-only: every other method is 405. The app is served on the local API socket now
(`populi_p2p.services.api_server`), and `mount` puts the same routes in front of any
other ASGI app (the HTTP listener of the OpenAI API), with an `authorize` hook so that
listener can require its API keys: a request the hook refuses gets 401 and nothing else.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import trio

from .._asgi import AsgiApp, Receive, Scope, Send, lifespan, send_body, send_json
from .events import EventService
from .metrics import content_type

__all__ = [
    "LIVE_MARK",
    "OBSERVE_PATHS",
    "SSE_HEARTBEAT",
    "Authorize",
    "ObserveBackend",
    "handles",
    "make_observe_app",
    "mount",
    "sse_frame",
]

#: Whether a request may see the observability routes (True) or gets 401 (False).
Authorize = Callable[[Scope], bool | Awaitable[bool]]

#: Seconds between SSE comments that keep idle proxies from closing the stream.
SSE_HEARTBEAT: Final = 15.0
#: The SSE comment between the buffered events and the live ones.
LIVE_MARK: Final = b": live\n\n"
#: The exact paths the app answers (plus anything under ``/static/``).
OBSERVE_PATHS: Final = frozenset({"/", "/index.html", "/metrics", "/events", "/api/mesh"})
_STATIC_PREFIX: Final = "/static/"
_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
#: The page may load only what this node serves (no CDN, no inline script).
_SECURITY_HEADERS: Final = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]

_log = logging.getLogger("populi.observe")


class ObserveBackend(Protocol):
    """What the routes read from the node."""

    events: EventService

    def metrics(self) -> bytes: ...

    def mesh(self) -> dict[str, Any]: ...


@functools.cache
def _static_files() -> dict[str, tuple[bytes, str]]:
    """Every asset, read once, at the first request for one: a request can only ever
    name one of these. (Not at start-up: importlib.resources and the zipfile module it
    loads cost an idle node half a MiB.)"""
    from importlib import resources

    files: dict[str, tuple[bytes, str]] = {}
    root = resources.files(__package__ or "populi_p2p.observe") / "static"
    for entry in root.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return files


async def _respond(
    send: Send, status: int, body: bytes, content_type: str, head: bool = False
) -> None:
    await send_body(send, status, body, content_type, headers=_SECURITY_HEADERS, head=head)


async def _json(send: Send, status: int, body: object) -> None:
    await send_json(send, status, body, headers=_SECURITY_HEADERS)


def sse_frame(event: dict[str, Any]) -> bytes:
    """One server-sent event: its `seq` as the id, the event as JSON data."""
    data = json.dumps(event, sort_keys=True, separators=(",", ":"))
    return f"id: {event.get('seq', '')}\ndata: {data}\n\n".encode()


async def _stream_events(events: EventService, receive: Receive, send: Send) -> None:
    recent, channel = events.subscribe()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream"),
                (b"x-accel-buffering", b"no"),
                *_SECURITY_HEADERS,
            ],
        }
    )

    async def until_disconnect(scope: trio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async with channel, trio.open_nursery() as nursery:
        nursery.start_soon(until_disconnect, nursery.cancel_scope)
        # The retry hint makes a browser reconnect quickly after a daemon restart.
        await send({"type": "http.response.body", "body": b"retry: 2000\n\n", "more_body": True})
        for ev in recent:
            await send({"type": "http.response.body", "body": sse_frame(ev), "more_body": True})
        # A comment marks the end of the buffered events (`populi-node events` without
        # --follow stops here); browsers ignore comments.
        await send({"type": "http.response.body", "body": LIVE_MARK, "more_body": True})
        while True:
            with trio.move_on_after(SSE_HEARTBEAT):
                try:
                    ev = await channel.receive()
                except trio.EndOfChannel:  # the node is stopping
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    nursery.cancel_scope.cancel()
                    return
                body = sse_frame(ev)
                await send({"type": "http.response.body", "body": body, "more_body": True})
                continue
            await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})


def make_observe_app(backend: ObserveBackend, *, authorize: Authorize | None = None) -> AsgiApp:
    """The ASGI app of the routes above. `authorize` None lets every request in (the
    local socket: the file mode already says who may connect)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # served on its own, the server asks this first
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if authorize is not None:
            allowed = authorize(scope)
            if inspect.isawaitable(allowed):
                allowed = await allowed
            if not allowed:
                await _json(send, 401, {"error": "an API key that may read metrics is needed"})
                return
        path: str = scope["path"]
        method: str = scope["method"]
        if method not in ("GET", "HEAD"):
            await _json(send, 405, {"error": f"{path} is read-only (GET)"})
            return
        head = method == "HEAD"
        try:
            if path in ("/", "/index.html"):
                body, kind = _static_files()["index.html"]
                await _respond(send, 200, body, kind, head)
            elif path.startswith(_STATIC_PREFIX):
                asset = _static_files().get(path[len(_STATIC_PREFIX) :])
                if asset is None:
                    await _json(send, 404, {"error": f"no such asset {path}"})
                else:
                    await _respond(send, 200, asset[0], asset[1], head)
            elif path == "/metrics":
                await _respond(send, 200, backend.metrics(), content_type(), head)
            elif path == "/api/mesh":
                await _json(send, 200, backend.mesh())
            elif path == "/events":
                await _stream_events(backend.events, receive, send)
            else:
                await _json(send, 404, {"error": f"no such endpoint {path}"})
        except trio.Cancelled:
            raise
        except Exception as exc:  # a bug in a view must not take the daemon down
            _log.exception("observe.error path=%s", path)
            await _json(send, 500, {"error": f"internal error: {type(exc).__name__}: {exc}"})

    return app


def handles(path: str) -> bool:
    """Whether `path` is one of the observability routes."""
    return path in OBSERVE_PATHS or path.startswith(_STATIC_PREFIX)


def mount(app: AsgiApp, observe: AsgiApp) -> AsgiApp:
    """`app` with the observability routes in front: those paths go to `observe`,
    everything else (and lifespan) to `app`. Build `observe` with `make_observe_app`
    and the listener's own `authorize` hook."""

    async def mounted(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and handles(scope["path"]):
            await observe(scope, receive, send)
        else:
            await app(scope, receive, send)

    return mounted
