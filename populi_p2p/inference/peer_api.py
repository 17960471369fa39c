"""The peer API: authenticated node-to-node HTTP on the node's overlay address.

Other services register routes (`PeerRoutes.add`); every request is checked by
`PeerCallVerifier` before any handler sees it, so a handler only ever meets enrolled,
unrevoked members. The caller, certificate, timestamp and nonce are checked from the
headers before a byte of the body is read; then the body is read against its limit and
its signature checked. A refused call is 401 with a one-line reason (and ``Connection:
close`` when it came with a body) and is counted by reason (`statistics()`); a handler
that raises is a 500, never a dead listener. The listener's connection caps and
timeouts are `populi_p2p._http_serve`'s, counted under ``connections``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import attrs
import trio

from .._asgi import WITH_BODY
from .._http_serve import ConnectionGate, HttpLimits
from .._log import event, get_logger
from ._asgi import (
    BodyTooLarge,
    Receive,
    Scope,
    Send,
    header_map,
    lifespan,
    read_body,
    send_json,
    send_stream,
    serve_tcp,
)
from .peer_auth import PeerAuthError, PeerCallVerifier

__all__ = ["PeerApi", "PeerRequest", "PeerResponse", "PeerRoutes"]

#: The largest peer-call body, bytes (a chat request with a long history fits).
MAX_PEER_BODY: Final = 4 * 1024 * 1024

_log = get_logger("peer")


@attrs.frozen
class PeerRequest:
    """A verified call: `caller` is the calling member's node id."""

    caller: str
    method: str
    path: str
    query: str
    body: bytes


@attrs.frozen
class PeerResponse:
    """A handler's answer: a whole body, or chunks sent as they come."""

    status: int
    body: bytes | AsyncIterator[bytes]
    content_type: str = "application/json"
    headers: dict[str, str] = attrs.field(factory=dict)
    #: Send chunks that are already there together (SSE); False for large pieces, so
    #: memory stays one piece per transfer.
    coalesce: bool = True


PeerHandler = Callable[[PeerRequest], Awaitable[PeerResponse]]


class PeerRoutes:
    """The registry of peer routes: (method, path) to handler. Exact paths only."""

    def __init__(self) -> None:
        self._routes: dict[tuple[str, str], PeerHandler] = {}

    def add(self, method: str, path: str, handler: PeerHandler) -> None:
        """Register `handler` for ``method path``. Raises ValueError if taken."""
        key = (method.upper(), path)
        if key in self._routes:
            raise ValueError(f"peer route {method} {path} is already registered")
        self._routes[key] = handler

    def find(self, method: str, path: str) -> PeerHandler | bool | None:
        """The handler; False when the path exists with other methods; None if unknown."""
        handler = self._routes.get((method.upper(), path))
        if handler is not None:
            return handler
        return False if any(p == path for _, p in self._routes) else None


class PeerApi:
    """The service: serves `routes` on ``host:port`` behind `verifier`.

    `port` 0 lets the kernel choose; `run` is started with the bound port.
    """

    def __init__(
        self,
        verifier: PeerCallVerifier,
        routes: PeerRoutes,
        *,
        host: str,
        port: int,
        max_body: int = MAX_PEER_BODY,
        limits: HttpLimits | None = None,
    ) -> None:
        self._verifier = verifier
        self.routes = routes
        self._host = host
        self._port = port
        self._max_body = max_body
        self._stop = trio.Event()
        #: The listener's connection caps and their counters.
        self.gate = ConnectionGate(limits or HttpLimits.for_open_files())
        self.port: int | None = None
        self._refused: dict[str, int] = {}
        self._accepted = 0
        self._errors = 0

    def stop(self) -> None:
        self._stop.set()

    def statistics(self) -> dict[str, Any]:
        return {
            "accepted": self._accepted,
            "refused": dict(sorted(self._refused.items())),
            "handler_errors": self._errors,
            "connections": self.gate.statistics(),
        }

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            port: int = await nursery.start(
                lambda task_status: serve_tcp(
                    self.app, self._host, self._port, logger_name="populi.peer.server",
                    gate=self.gate, shutdown_trigger=self._stop.wait, task_status=task_status,
                )
            )  # fmt: skip
            self.port = port
            task_status.started(port)

    async def _refuse(self, send: Send, exc: PeerAuthError, path: str) -> None:
        self._refused[exc.reason] = self._refused.get(exc.reason, 0) + 1
        # Debug: counted, and an outsider's flood of refusals must not flood the log.
        event(_log, 10, "peer.refused", reason=exc.reason, path=path)
        await send_json(send, 401, {"error": f"peer call refused: {exc}"})

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app (public so tests can call it without a socket)."""
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method = str(scope["method"]).upper()
        path = str(scope["path"])
        query = bytes(scope.get("query_string", b"")).decode("latin-1")
        target = f"{path}?{query}" if query else path
        try:  # the headers alone: an outsider's body is never read
            pending = self._verifier.check_headers(method, target, header_map(scope))
        except PeerAuthError as exc:
            await self._refuse(send, exc, path)
            return
        handler = self.routes.find(method, path)
        if handler is None:
            await send_json(send, 404, {"error": f"no peer route {path}"})
            return
        if handler is False:
            await send_json(send, 405, {"error": f"{method} is not allowed on {path}"})
            return
        try:
            body = await read_body(receive, self._max_body)
        except BodyTooLarge as exc:
            await send_json(send, 413, {"error": str(exc)})
            return
        try:
            caller = self._verifier.check_body(pending, body)
        except PeerAuthError as exc:
            await self._refuse(send, exc, path)
            return
        assert not isinstance(handler, bool)
        self._accepted += 1
        try:
            response = await handler(PeerRequest(caller, method, path, query, body))
        except Exception as exc:
            self._errors += 1
            event(_log, 40, "peer.handler_error", path=path, error=repr(exc))
            await send_json(send, 500, {"error": f"the handler failed: {exc!r}"})
            return
        if isinstance(response.body, bytes):
            headers = {"content-type": response.content_type, **response.headers}
            await send({
                "type": "http.response.start", "status": response.status,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()]
                + [(b"content-length", str(len(response.body)).encode())],
                WITH_BODY: True,
            })  # fmt: skip
            await send({"type": "http.response.body", "body": response.body})
        else:
            try:
                await send_stream(
                    send, response.status, response.body, content_type=response.content_type,
                    headers=response.headers, coalesce=response.coalesce,
                )  # fmt: skip
            finally:  # the handler's generator frees what it holds, however this ends
                aclose = getattr(response.body, "aclose", None)
                if aclose is not None:
                    with trio.CancelScope(shield=True):
                        await aclose()
