"""This node's own engines as an upstream: for requests it accepted itself, and for
other members' relayed requests (the peer route ``/peer/v1/engine/...``)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Final

import httpx

from ._tls import tls_context
from ._tls import url as _url
from ._transport import coalescing_transport, open_response, request_timeouts
from .engines import EngineService
from .openai_errors import openai_error
from .peer_api import PeerRequest, PeerResponse

__all__ = ["ENGINE_ANSWER_HEADER", "PEER_PREFIX", "QUEUE_HEADER", "LocalEngine"]

#: The peer routes' prefix: ``/v1/chat/completions`` is served at
#: ``/peer/v1/engine/chat/completions``.
PEER_PREFIX: Final = "/peer/v1/engine"
#: Set on every answer the peer route relays from the engine, so that the calling node
#: tells the engine's 4xx (the client's answer) from the peer API's own (a refused call).
ENGINE_ANSWER_HEADER: Final = "x-populi-engine-answer"
#: Set on every answer from this node's engines: their requests in flight for the
#: model, this one included (the accepting node's `load.LoadBook` reads it).
QUEUE_HEADER: Final = "x-populi-queue"


class LocalEngine:
    """Args: engines: this node's engines (None: it serves no model itself).

    One keep-alive connection pool to the engines on loopback, closed by `aclose`.
    """

    def __init__(self, engines: EngineService | None) -> None:
        self._engines = engines
        transport, _ = coalescing_transport(  # each request in one write, as to peers
            httpx.Limits(max_connections=256, max_keepalive_connections=64), tls_context()
        )
        self._transport = transport
        self._extensions = request_timeouts(httpx.Timeout(None, connect=2.0))

    async def aclose(self) -> None:
        await self._transport.aclose()

    @contextlib.asynccontextmanager
    async def open(
        self, path: str, body: bytes, events: list[int] | None = None
    ) -> AsyncIterator[httpx.Response]:
        """Our engine's answer to `body` (503 when no healthy engine serves its model);
        `events[0]` (when given) is the number of streamed events the caller saw, for
        the tokens/s this node reports."""
        try:
            model = json.loads(body).get("model")
        except (ValueError, AttributeError):
            model = None
        url = None
        if self._engines is not None and isinstance(model, str):
            url = self._engines.engine_for(model)
        if url is None or self._engines is None:
            # As a stream, like an engine's answer: callers read it with aiter_raw().
            error = openai_error(
                f"this node has no healthy engine for {model!r}", "engine_unavailable"
            )
            yield httpx.Response(
                503,
                headers={"content-type": "application/json"},
                stream=httpx.ByteStream(json.dumps(error).encode()),
            )
            return
        assert isinstance(model, str)
        request = httpx.Request(
            "POST", _url(url, path), content=body,
            headers={"content-type": "application/json"}, extensions=self._extensions,
        )  # fmt: skip
        started = time.monotonic()
        self._engines.begin(model)
        try:
            try:
                response = await open_response(self._transport, request)
            except httpx.ConnectError as exc:
                self._engines.mark_failed(url, f"connection refused: {exc}")
                raise
            response.headers[QUEUE_HEADER] = str(self._engines.inflight(model))
            try:
                yield response
            finally:
                await response.aclose()
        finally:
            self._engines.end(model, events[0] if events else 0, time.monotonic() - started)

    async def serve_peer(self, request: PeerRequest) -> PeerResponse:
        """Another member relays a request to our engine: its answer, as it comes."""
        path = "/v1" + request.path[len(PEER_PREFIX) :]
        stack = contextlib.AsyncExitStack()
        events = [0]
        try:
            response = await stack.enter_async_context(self.open(path, request.body, events))
        except httpx.HTTPError as exc:
            await stack.aclose()
            return PeerResponse(
                502,
                json.dumps(
                    openai_error(
                        f"the engine did not answer: {type(exc).__name__}", "engine_unavailable"
                    )
                ).encode(),
            )

        async def body() -> AsyncIterator[bytes]:
            async with stack:
                async for chunk in response.aiter_raw():
                    events[0] += chunk.count(b"data: {")
                    yield chunk

        content_type = response.headers.get("content-type", "application/json")
        queue = {k: v for k, v in response.headers.items() if k == QUEUE_HEADER}
        return PeerResponse(
            response.status_code,
            body(),
            content_type=content_type,
            headers={ENGINE_ANSWER_HEADER: "1", **queue},
        )
