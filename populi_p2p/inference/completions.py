"""``POST /v1/chat/completions`` and ``/v1/completions``: read the request, check it
(`request_check`: a client's mistake is its 400, before any node is tried), route it,
relay it (streamed or whole), and log where it went."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

import trio

from .._asgi import WITH_BODY, Message
from ._asgi import BodyTooLarge, Receive, Send, read_body, send_json
from .catalogue import ModelCatalogue
from .engines import continues_partial
from .keys import ApiKey
from .openai_errors import openai_error
from .relay import NextNode, Relay
from .request_check import InvalidRequest, check_request, describe
from .request_log import RequestLog
from .route import Candidate, RouteDecision
from .stats import InferenceStats, outcome_of

__all__ = ["LOAD_WAIT", "MAX_REQUEST_BODY", "CompletionHandler"]

#: The largest request body the public API reads, bytes.
MAX_REQUEST_BODY: Final = 4 * 1024 * 1024
#: Default seconds a request for a deployed model that no node serves yet waits
#: (``up --load-wait``): a replica fetching or loading its model answers once ready.
LOAD_WAIT: Final = 60.0
#: Seconds between looks at the view while a request waits for a loading model.
LOAD_POLL: Final = 0.05
_SSE_HEADERS: Final = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class _Refused(Exception):
    """The request is refused before routing: `status` and OpenAI's error `body`."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


def _decode(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object. Raises `_Refused` (400)."""
    try:
        request = json.loads(raw)
    except RecursionError:
        message = "the body is nested too deeply to read: send a flat JSON object"
        raise _Refused(400, openai_error(message, "invalid_request_error")) from None
    except ValueError as exc:
        message = f"the body is not a JSON object ({exc})"
        raise _Refused(400, openai_error(message, "invalid_request_error")) from None
    if not isinstance(request, dict):
        message = f"the body is not a JSON object (it is {describe(request)})"
        raise _Refused(400, openai_error(message, "invalid_request_error"))
    return request


def _accepted(request: dict[str, Any], chat: bool, key: ApiKey | None) -> str:
    """The model `request` names, once it may be routed: the model is named and the key
    may use it, and the request is well formed (`request_check`). Raises `_Refused`."""
    model = request.get("model")
    if not isinstance(model, str) or not model:
        message = 'say which model: the body needs "model" (GET /v1/models lists them)'
        raise _Refused(400, openai_error(message, "invalid_request_error", param="model"))
    if key is not None and key.models and model not in key.models:
        message = f"API key {key.name!r} may use only: {', '.join(key.models)}"
        raise _Refused(403, openai_error(message, "permission_denied", "model_not_allowed"))
    try:
        check_request(request, chat)
    except InvalidRequest as exc:
        raise _Refused(400, exc.body()) from None
    return model


Decide = Callable[[str, Collection[str]], tuple[RouteDecision, list[Candidate]]]


def _continues_exactly(model: str, decision: RouteDecision, view: list[Candidate]) -> bool:
    """Whether every node the stream may move to runs an engine known to continue a
    partial answer (`engines.continues_partial`): any other node serving `model` in
    the view, since a failover may choose again from it."""
    first = decision.order[0]
    for c in view:
        facts = c.models.get(model)
        if (
            c.node_id != first
            and facts is not None
            and not continues_partial(str(facts.get("kind", "")))
        ):
            return False
    return True


class CompletionHandler:
    """Args: decide: the route for a model, from the view as it is now, leaving out
    the nodes given (those already tried), and the view it used; relay: serves it;
    log: where each routed request is recorded; stats: what ``/metrics`` counts."""

    def __init__(
        self,
        decide: Decide,
        relay: Relay,
        log: RequestLog,
        stats: InferenceStats | None = None,
        *,
        loading: Callable[[str], bool] | None = None,
        load_wait: float = LOAD_WAIT,
    ) -> None:
        self._loading = loading
        self._load_wait = load_wait
        self._decide = decide
        self._relay = relay
        self._log = log
        self.stats = stats if stats is not None else InferenceStats()

    async def __call__(
        self, path: str, chat: bool, receive: Receive, send: Send, key: ApiKey | None
    ) -> None:
        try:
            request = _decode(await read_body(receive, MAX_REQUEST_BODY))
            model = _accepted(request, chat, key)
        except BodyTooLarge as exc:
            self.stats.request("rejected")
            await send_json(send, 413, openai_error(str(exc), "invalid_request_error"))
            return
        except _Refused as exc:  # the client's mistake: never a node's fault
            self.stats.request("rejected")
            await send_json(send, exc.status, exc.body)
            return
        decision_start = time.perf_counter()
        decision, view = self._decide(model, ())
        if not decision.order and self._loading is not None and self._loading(model):
            decision, view = await self._wait_for(model, decision, view)
            decision_start = time.perf_counter()
        decision_ms = (time.perf_counter() - decision_start) * 1000
        if not decision.order:
            self.stats.request("no_route")
            status, body = ModelCatalogue.no_route(model, decision, view)
            if self._loading is not None and self._loading(model):
                status, body = 503, openai_error(
                    f"model {model!r} is deployed but no replica served it within"
                    f" {self._load_wait:.0f} s (see populi-node deployments)", "model_loading"
                )  # fmt: skip
            await send_json(send, status, body)
            return
        names = {c.node_id: c.name for c in view}
        streamed = request.get("stream") is True
        entry = self._log.open(model, path, streamed, decision, names, decision_ms)
        header = decision.header()
        if streamed and not _continues_exactly(model, decision, view):
            header += ";continuation=inexact"
        route_header = (b"x-populi-route", header.encode())
        route = self._chooser(model, decision, names)
        if streamed:
            await self._stream(
                path, chat, request, route, names, entry, route_header, send, decision_start
            )
            return
        status, data, node, attempts = await self._relay.whole(route, path, request)
        self.stats.attempts(attempts)
        self.stats.request(outcome_of(status))
        entry.update(
            node=names.get(node or "", node),
            attempts=[f"{names.get(a.node, a.node)}: {a.outcome}" for a in attempts],
        )
        if status == 0:
            await self._all_failed(send, "every capable node failed", entry, route_header)
            return
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                    (b"x-populi-node", (node or "").encode()),
                    route_header,
                ],
                WITH_BODY: True,
            }
        )
        await send({"type": "http.response.body", "body": data})

    def _chooser(self, model: str, decision: RouteDecision, names: dict[str, str]) -> NextNode:
        """The relay's next node: the decision's first, then, at each failover, the
        route chosen again from the view as it is then (a node suspect for a moment
        when the request came is back in; the nodes tried are left out)."""

        def next_node(tried: Sequence[str]) -> str | None:
            if not tried:
                return decision.order[0]
            again, view = self._decide(model, tried)
            names.update((c.node_id, c.name) for c in view if c.node_id not in names)
            return again.order[0] if again.order else None

        return next_node

    async def _stream(
        self,
        path: str,
        chat: bool,
        request: dict[str, Any],
        route: NextNode,
        names: dict[str, str],
        entry: dict[str, Any],
        route_header: tuple[bytes, bytes],
        send: Send,
        began: float,
    ) -> None:
        first = True
        # The head waits for the first events: both go out in one write (WITH_BODY).
        head: list[Message] = []

        async def start(status: int, node: str, body: bytes | None) -> None:
            if status == 0:
                return
            headers = [(b"x-populi-node", node.encode()), route_header]
            if status == 200:
                headers += _SSE_HEADERS
                head.append(
                    {"type": "http.response.start", "status": 200, "headers": headers,
                     WITH_BODY: True}
                )  # fmt: skip
                return
            data = body or b""
            headers += [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ]
            await send({"type": "http.response.start", "status": status, "headers": headers,
                        WITH_BODY: True})  # fmt: skip
            await send({"type": "http.response.body", "body": data})

        async def emit(data: bytes) -> None:
            nonlocal first
            if first:
                first = False
                self.stats.first_token(time.perf_counter() - began)
            if head:
                await send(head.pop())
            await send({"type": "http.response.body", "body": data, "more_body": True})

        result = await self._relay.stream(route, path, request, chat, start, emit)
        self.stats.attempts(result.attempts)
        served = result.status == 200 and result.done
        self.stats.request("failed" if result.status == 200 and not served
                           else outcome_of(result.status))  # fmt: skip
        entry.update(
            node=names.get(result.first_node or "", result.first_node),
            attempts=[f"{names.get(a.node, a.node)}: {a.outcome}" for a in result.attempts],
            tokens=result.tokens,
            done=result.done,
        )
        if result.status == 0:
            await self._all_failed(
                send, "every capable node failed before the first token", entry, route_header
            )
        elif result.status == 200:
            if first and result.tokens:  # the only tokens came with the end
                self.stats.first_token(time.perf_counter() - began)
            if head:
                await send(head.pop())
            await send({"type": "http.response.body", "body": result.final})

    async def _wait_for(
        self, model: str, decision: RouteDecision, view: list[Candidate]
    ) -> tuple[RouteDecision, list[Candidate]]:
        """A deployed model no node serves yet (its replicas fetch or load): look again
        every `LOAD_POLL` s, up to `load_wait` s, while it stays deployed."""
        deadline = trio.current_time() + self._load_wait
        while not decision.order and trio.current_time() < deadline:
            await trio.sleep(LOAD_POLL)
            if self._loading is None or not self._loading(model):
                break
            decision, view = self._decide(model, ())
        return decision, view

    @staticmethod
    async def _all_failed(
        send: Send, what: str, entry: dict[str, Any], route_header: tuple[bytes, bytes]
    ) -> None:
        await send_json(
            send,
            503,
            openai_error(
                f"{what}: "
                + "; ".join(entry["attempts"])
                + ". Retry, or check populi-node requests.",
                "no_capable_node",
            ),
            {"x-populi-route": route_header[1].decode()},
        )
