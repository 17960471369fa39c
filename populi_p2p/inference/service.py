"""The inference service: the OpenAI-compatible API on every node, and the peer routes
through which other members use this node's engines.

Public listener (``--api-listen``)::

    GET  /health                 this node, its engines
    GET  /v1/models              the union over the mesh, with the nodes serving each
    POST /v1/chat/completions    routed (`route.choose_route`), relayed (`relay.Relay`)
    POST /v1/completions         same
    GET  /populi/requests        the recent routes (``populi-node requests``)
    mounted apps                 `mount(prefix, app)`: metrics, dashboard, events

Peer routes (signed calls only, `PeerApi`)::

    POST /peer/v1/engine/chat/completions, /peer/v1/engine/completions

Every answer of a routed request carries ``x-populi-node`` (the node that served the
first byte) and ``x-populi-route`` (why). Errors have OpenAI's shape and say what to do.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from typing import Any, Final

import httpx
import trio

from .._http_serve import ConnectionGate, HttpLimits
from .._log import event, get_logger
from ..leases.config import LeaseConfig
from ..leases.reliability import Outcome, earned_reliability, prior_reliability
from ._asgi import AsgiApp, Receive, Scope, Send, header_map, lifespan, send_json, serve_tcp
from .catalogue import ModelCatalogue
from .completions import LOAD_WAIT, CompletionHandler
from .engines import EngineService
from .keys import ApiKey, ApiKeyChecker
from .load import LoadBook
from .local_engine import ENGINE_ANSWER_HEADER, PEER_PREFIX, QUEUE_HEADER, LocalEngine
from .openai_errors import openai_error
from .peer_api import PeerRoutes
from .peer_client import PeerClient, peer_base_url
from .relay import Relay, UpstreamRefused
from .request_log import RequestLog
from .route import Candidate, RouteDecision, choose_route

__all__ = ["InferenceService", "openai_error"]

#: How many of its own relay outcomes a node keeps as reliability evidence.
MAX_OUTCOMES: Final = 4096
#: Seconds the earned reliability is reused between requests (it costs O(outcomes) to
#: compute, ~1 ms at 4,096). A failed request recomputes it at once, so a failing node
#: loses priority for the very next request; a success waits at most this long.
RELIABILITY_REFRESH: Final = 0.5
_ROUTED: Final = {"/v1/chat/completions": True, "/v1/completions": False}

_log = get_logger("inference")


async def _excerpt(response: httpx.Response, limit: int = 200) -> str:
    """The start of `response`'s body, on one line (at most `limit` bytes read)."""
    data = b""
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= limit:
            break
    return " ".join(data[:limit].decode("utf-8", "replace").split())


class InferenceService:
    """The wiring: the public listener's dispatch, mounts, the peer routes, the
    reliability evidence. The pieces: `LocalEngine` (this node's engines),
    `CompletionHandler` (routed requests), `ModelCatalogue` (``/v1/models``),
    `RequestLog` (recent routes), `Relay` (the stream across nodes).

    Args:
    node_id: this node.
    view: the mesh as this node sees it, one `Candidate` per member (itself too).
    address_of: a member's peer API (host, port), from its verified record.
    peer_client: signed calls to other members.
    engines: this node's engines (None: it serves no model itself).
    listen: (host, port) of the public API, or None for none.
    keys: the API key check (None: no keys are demanded).
    stall_timeout: mid-stream stall timeout (None: adaptive).
    outcomes: the reliability evidence source (the lease table's task outcomes); this
        node's own relay outcomes are always added to it.
    on_outcome: where relay outcomes go as well (the lease table, metrics).
    state_of: one member's state (``alive``, ...), checked mid-stream every 100 ms;
        None: looked up in `view()` (fine for tests, O(members) per check).
    loading: whether a model no node serves yet is deployed (a request then waits up
        to `load_wait` seconds for a replica, instead of failing at once).
    """

    def __init__(
        self,
        node_id: str,
        *,
        view: Callable[[], list[Candidate]],
        address_of: Callable[[str], tuple[str, int] | None],
        peer_client: PeerClient | None,
        engines: EngineService | None,
        listen: tuple[str, int] | None,
        keys: ApiKeyChecker | None = None,
        stall_timeout: float | None = None,
        outcomes: Callable[[], Iterable[Outcome] | None] | None = None,
        on_outcome: Callable[[Outcome], None] | None = None,
        lease_config: LeaseConfig | None = None,
        state_of: Callable[[str], str | None] | None = None,
        loading: Callable[[str], bool] | None = None,
        load_wait: float = LOAD_WAIT,
    ) -> None:
        self.node_id = node_id
        self._view = view
        self._state_of = state_of
        self._address_of = address_of
        self._peer = peer_client
        self._engines = engines
        self._listen = listen
        self._keys = keys
        self._outcomes_source = outcomes
        self._on_outcome = on_outcome
        self._lease_config = lease_config or LeaseConfig()
        self._own_outcomes: deque[Outcome] = deque(maxlen=MAX_OUTCOMES)
        self._reliability_cache: tuple[float, dict[str, float]] | None = None
        self._mounts: dict[str, AsgiApp] = {}
        self._path_mounts: list[tuple[Callable[[str], bool], AsgiApp]] = []
        self._local = LocalEngine(engines)
        #: Requests outstanding at each node, and recent failures (the route's input).
        self.load = LoadBook()
        self.relay = Relay(
            self._open_upstream,
            self._is_alive,
            stall_timeout=stall_timeout,
            on_outcome=self._record_outcome,
            node_gone=self._is_gone,
        )
        self.catalogue = ModelCatalogue(view)
        self.log = RequestLog()
        self._completions = CompletionHandler(
            self.decide, self.relay, self.log, loading=loading, load_wait=load_wait
        )
        #: Requests by outcome, time to first token, failovers (``/metrics``).
        self.stats = self._completions.stats
        self.port: int | None = None
        #: The public listener's connection caps and their counters.
        self.gate = ConnectionGate(HttpLimits.for_open_files())
        self._stop = trio.Event()

    ####################################################################################
    # Wiring
    def mount(self, prefix: str, app: AsgiApp) -> None:
        """Serve `app` for every path under `prefix` (e.g. ``/metrics``) on the public
        listener. The app sees the full path. Raises ValueError if taken or reserved."""
        if not prefix.startswith("/") or prefix.rstrip("/") in ("", "/v1", "/health"):
            raise ValueError(f"cannot mount at {prefix!r}")
        if prefix in self._mounts:
            raise ValueError(f"{prefix!r} is already mounted")
        self._mounts[prefix] = app

    def mount_paths(self, handles: Callable[[str], bool], app: AsgiApp) -> None:
        """Serve `app` for every path `handles(path)` accepts (exact paths such as
        ``/``, ``/metrics``, ``/events``: e.g. ``observe.web.handles``), consulted before
        this service's own routes. The mounted app does its own authorization."""
        self._path_mounts.append((handles, app))

    def register_peer_routes(self, routes: PeerRoutes) -> None:
        for path in _ROUTED:
            routes.add("POST", PEER_PREFIX + path[3:], self._local.serve_peer)

    def recent_routes(self) -> list[dict[str, Any]]:
        return self.log.recent()

    def engines(self) -> list[dict[str, Any]]:
        return [] if self._engines is None else self._engines.engines()

    def stop(self) -> None:
        self._stop.set()

    async def run(
        self, *, task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            if self._listen is None:
                task_status.started(None)
                await trio.sleep_forever()
            host, port = self._listen
            async with trio.open_nursery() as nursery:
                self.port = await nursery.start(
                    lambda task_status: serve_tcp(
                        self.app,
                        host,
                        port,
                        logger_name="populi.inference.server",
                        gate=self.gate,
                        shutdown_trigger=self._stop.wait,
                        task_status=task_status,
                    )
                )
                event(_log, 20, "inference.listening", host=host, port=self.port)
                task_status.started(self.port)
        finally:
            with trio.CancelScope(shield=True):
                await self._local.aclose()

    ####################################################################################
    # Reliability

    def _record_outcome(self, node: str, success: bool) -> None:
        outcome = Outcome(node, success, trio.current_time())
        self._own_outcomes.append(outcome)
        self.load.outcome(node, success, outcome.at)
        if not success:
            self._reliability_cache = None
        if self._on_outcome is not None:
            self._on_outcome(outcome)

    def _reliability(self) -> dict[str, float]:
        # The same earned reliability that places tasks (leases.reliability), so routing
        # and placement agree. Its evidence: the lease table's task outcomes, seen by
        # every node, plus the relay outcomes this node saw itself.
        now = trio.current_time()
        cached = self._reliability_cache
        if cached is not None and now - cached[0] < RELIABILITY_REFRESH:
            return cached[1]
        source = self._outcomes_source() if self._outcomes_source is not None else None
        outcomes = [*(source or ()), *self._own_outcomes]
        value = earned_reliability(outcomes, now, self._lease_config)
        self._reliability_cache = (now, value)
        return value

    def _is_alive(self, node: str) -> bool:
        return self._state(node) == "alive"

    def _is_gone(self, node: str) -> bool:
        return self._state(node) not in ("alive", "suspect")

    def _state(self, node: str) -> str | None:
        if self._state_of is not None:
            return self._state_of(node)
        for c in self._view():
            if c.node_id == node:
                return c.state
        return None

    def decide(
        self, model: str, exclude: Collection[str] = ()
    ) -> tuple[RouteDecision, list[Candidate]]:
        """The route for `model` from the view as it is now (`exclude`: the nodes
        already tried for this request)."""
        view = self._view()
        now = trio.current_time()
        serving = [(c.node_id, c.models[model]) for c in view if model in c.models]
        decision = choose_route(
            model, view, self._reliability(), prior_reliability(self._lease_config),
            outstanding=self.load.outstanding(model, serving, now),
            failing=self.load.failing(now), exclude=exclude, salt=self.node_id,
        )  # fmt: skip
        return decision, view

    ####################################################################################
    # Upstreams

    @contextlib.asynccontextmanager
    async def _open_upstream(
        self, node: str, model: str, path: str, body: bytes
    ) -> AsyncIterator[httpx.Response]:
        """One attempt at `node`, counted in `load` from before its request is sent
        until its answer is done; the queue the node reports is noted."""
        self.load.begin(node, model)
        try:
            if node == self.node_id:
                async with self._local.open(path, body) as response:
                    self._note_queue(node, model, response)
                    yield response
                return
            address = self._address_of(node)
            if address is None or self._peer is None:
                raise httpx.ConnectError(f"no peer address for {node}")
            base = peer_base_url(*address)
            async with self._peer.stream(node, base, "POST", PEER_PREFIX + path[3:], body) as r:
                if 400 <= r.status_code < 500 and ENGINE_ANSWER_HEADER not in r.headers:
                    excerpt = await _excerpt(r)
                    raise UpstreamRefused(f"its peer API answered {r.status_code}: {excerpt}")
                self._note_queue(node, model, r)
                yield r
        finally:
            self.load.end(node, model)

    def _note_queue(self, node: str, model: str, response: httpx.Response) -> None:
        queue = response.headers.get(QUEUE_HEADER)
        if queue is not None and queue.isdigit() and len(queue) < 10:
            self.load.reported(node, model, int(queue), trio.current_time())

    ####################################################################################
    # The public API

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = str(scope["path"]), str(scope["method"]).upper()
        for handles, handler in self._path_mounts:
            if handles(path):
                await handler(scope, receive, send)
                return
        for prefix, mounted in self._mounts.items():
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                await mounted(scope, receive, send)
                return
        if path == "/health" and method == "GET":
            await send_json(
                send,
                200,
                {
                    "status": "ok",
                    "node": self.node_id,
                    "engines": self._engines.engines() if self._engines is not None else [],
                },
            )
            return
        headers = header_map(scope)
        key: ApiKey | None = None
        if self._keys is not None and path.startswith(("/v1/", "/populi/")):
            checked = self._keys.check(headers.get("authorization", ""), time.time())
            if isinstance(checked, tuple):
                status, message, extra = checked
                kind = "rate_limit_exceeded" if status == 429 else "invalid_api_key"
                await send_json(send, status, openai_error(message, kind, kind), extra)
                return
            key = checked
        if path == "/v1/models" and method == "GET":
            await send_json(send, 200, self.models())
        elif path == "/populi/requests" and method == "GET":
            await send_json(send, 200, {"requests": self.recent_routes()})
        elif path in _ROUTED and method == "POST":
            await self._completions(path, _ROUTED[path], receive, send, key)
        elif path in _ROUTED or path in ("/v1/models", "/populi/requests"):
            await send_json(
                send,
                405,
                openai_error(f"{method} is not allowed on {path}", "invalid_request_error"),
            )
        else:
            await send_json(
                send,
                404,
                openai_error(
                    f"no route {path}: this API serves /v1/models, /v1/chat/completions,"
                    " /v1/completions and /health",
                    "invalid_request_error",
                ),
            )

    def models(self) -> dict[str, Any]:
        """``/v1/models``: every model some alive member serves, with those members."""
        return self.catalogue.models()
