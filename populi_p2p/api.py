"""The local control API: JSON over HTTP on a unix socket in the state directory.

Why a unix socket: only processes on this machine that can open the file may talk to
the daemon, and the file mode (0600, inside a 0700 directory) says exactly who: the
user that runs the daemon. No port to firewall, no token to leak. HTTP (served by
hypercorn with its Trio worker, inside the daemon's own nursery) because every language
and ``curl --unix-socket`` can speak it; the `populi-node` CLI uses httpx.

Endpoints (all JSON):

=======================  ===============================================================
``GET  /v1/status``      this node, its overlay and what it accepts, a cluster summary
``GET  /v1/members``     every member: name, node id, address, state, incarnation, RTT,
                         capabilities, labels
``GET  /v1/gpus``        this node's GPU report (the GPU monitor's view)
``POST /v1/gpus/probe``  re-probe the GPUs now; answers with the new report (a change
                         is signed into a new NodeRecord that gossips)
``POST /v1/leave``       announce a graceful leave, then the daemon exits
``POST /v1/tasks``       submit a task (JSON spec); answers once it is durable
``GET  /v1/tasks``       every task this node's lease table holds
``GET  /v1/tasks/ID``    one task: spec, epochs, result (``/explain``: its placement)
``POST /v1/tasks/ID/cancel``  cancel a task everywhere (409 once it has finished; 403
                         unless this node accepted it or the body carries an
                         ``operator`` proof: ``populi-node cancel --operator-key``)
``GET  /v1/tasks/ID/logs``  ``?stream=stdout|stderr&offset=N``: a base64 chunk of the
                         task's full output from N (fetched from the node that ran it
                         when that is another), the next offset, and ``done`` once it
                         ended and all was read
``POST /v1/drain``       take no new work (``{"handoff": true}`` hands running tasks on)
``POST /v1/undrain``     take work again
``GET  /v1/inference/    the inference API's recent routes (``populi-node requests``)
requests``
``GET  /v1/blobs``       the blobs held here and the ones members advertise
``POST /v1/blobs/add``   ``{"path", "name"}``: store a local file (``model add``)
``POST /v1/blobs/rm``    ``{"blob"}``; ``/pin`` and ``/unpin``: ``{"blob", "by"}``
``POST /v1/blobs/pull``  ``{"blob"}``: start fetching from holders (``model pull``)
``GET  /v1/blobs/        ``?blob=HASH``: a pull's progress
progress``
=======================  ===============================================================

The task routes are served when the backend is also a `TaskBackend`. A bad spec or
argument is a 400 with one line, an unknown task a 404, a request the task's state
refuses (`ConflictError`: cancelling a finished task) a 409, one this node may not make
(`ForbiddenError`: a cancel of a task accepted elsewhere, without an operator proof) a
403, a submit without enough acknowledgements a 504.

The app only translates: it asks an `ApiBackend` (the node) for plain dicts and encodes
them, so it is tested without a daemon. Unknown paths are 404, wrong methods 405, and a
backend bug is a 500 with a one-line message, never a crashed daemon.

`ApiClient` is the other end, shared by the CLI, the demo, tests and benchmarks. Every
failure is an `ApiError` whose message is one line saying what is wrong and how to fix
it (daemon not running, no permission, ...).
"""

from __future__ import annotations

import errno
import functools
import inspect
import json
import os
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

import trio

from ._asgi import AsgiApp, Receive, Scope, Send, lifespan
from ._asgi import send_json as _respond
from ._log import get_logger

__all__ = [
    "API_SOCKET_MODE",
    "ApiBackend",
    "ApiClient",
    "ApiError",
    "ConflictError",
    "ForbiddenError",
    "TaskBackend",
    "make_app",
    "serve_api",
]

#: The API socket's mode: only the daemon's user may connect.
API_SOCKET_MODE: Final = 0o600
#: The longest the CLI waits for the daemon to answer.
CLIENT_TIMEOUT: Final = 10.0
#: The largest request body the API reads (a task spec is at most a few KiB).
BODY_BYTES_MAX: Final = 64 * 1024

_log = get_logger("api")


class ApiBackend(Protocol):
    """What the API asks of the daemon. Each method returns JSON-ready plain data."""

    def status(self) -> dict[str, Any]: ...

    def members(self) -> list[dict[str, Any]]: ...

    def gpus(self) -> dict[str, Any]: ...

    async def probe_gpus(self) -> dict[str, Any]:
        """Re-probe the GPUs now; return the same shape as `gpus`."""
        ...

    def request_leave(self) -> None:
        """Start a graceful leave and shutdown; return at once."""


@runtime_checkable
class TaskBackend(Protocol):
    """The tasks part of the API (the lease service behind the node)."""

    async def submit(self, spec: dict[str, Any]) -> dict[str, Any]: ...

    def tasks(self) -> list[dict[str, Any]]: ...

    def task(self, task_id: str) -> dict[str, Any]: ...

    def explain(self, task_id: str) -> dict[str, Any]: ...

    async def cancel(self, task_id: str, operator: object = None) -> dict[str, Any]:
        """`operator`: the request's ``operator`` field (a proof, `operator.py`)."""
        ...

    async def logs(self, task_id: str, stream: object, offset: object) -> dict[str, Any]: ...

    async def drain(self, handoff: bool) -> dict[str, Any]: ...

    async def undrain(self) -> dict[str, Any]: ...


class ConflictError(Exception):
    """The request is well formed but the resource's state refuses it (e.g. cancelling
    a task that already finished). The API answers 409 with the message: one line."""


class ForbiddenError(Exception):
    """This node may not do what was asked (e.g. cancel a task another node accepted,
    without an operator proof). The API answers 403 with the message: one line."""


class _BadRequest(Exception):
    pass


async def _read_json(receive: Receive) -> Any:
    """The request body as JSON ({} when empty); bounded; `_BadRequest` otherwise."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > BODY_BYTES_MAX:
            raise _BadRequest(f"request body over {BODY_BYTES_MAX} bytes")
        if not message.get("more_body", False):
            break
    if not body:
        return {}
    try:
        return json.loads(body)
    except ValueError:
        raise _BadRequest("request body is not JSON") from None


def _task_route(
    backend: TaskBackend, method: str, path: str, body: Any
) -> Callable[[], object] | None:
    """The handler of a task route, or None when `path` is not one."""
    parts = path.strip("/").split("/")[1:]  # after "v1"
    if parts == ["tasks"]:
        return (lambda: backend.submit(body)) if method == "POST" else backend.tasks
    if parts == ["drain"] and method == "POST":
        return lambda: backend.drain(bool(isinstance(body, dict) and body.get("handoff")))
    if parts == ["undrain"] and method == "POST":
        return backend.undrain
    if len(parts) == 2 and parts[0] == "tasks" and method == "GET":
        return lambda: backend.task(parts[1])
    if len(parts) == 3 and parts[0] == "tasks" and parts[2] == "explain" and method == "GET":
        return lambda: backend.explain(parts[1])
    if len(parts) == 3 and parts[0] == "tasks" and parts[2] == "cancel" and method == "POST":
        operator = body.get("operator") if isinstance(body, dict) else None
        return lambda: backend.cancel(parts[1], operator)
    if len(parts) == 3 and parts[0] == "tasks" and parts[2] == "logs" and method == "GET":
        query = body if isinstance(body, dict) else {}
        return lambda: backend.logs(parts[1], query.get("stream", "stdout"), query.get("offset", 0))
    return None


def _query(scope: Scope) -> dict[str, str]:
    """A GET's query parameters (the last of each name wins; junk is just absent)."""
    raw = scope.get("query_string", b"")
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else ""
    return dict(urllib.parse.parse_qsl(text[:1024]))


def _leave(backend: ApiBackend) -> dict[str, bool]:
    backend.request_leave()
    return {"leaving": True}


def make_app(backend: ApiBackend) -> AsgiApp:
    """The ASGI application serving `backend` (see the module docstring for routes)."""
    routes: dict[str, tuple[str, Callable[[], object]]] = {
        "/v1/status": ("GET", backend.status),
        "/v1/members": ("GET", backend.members),
        "/v1/gpus": ("GET", backend.gpus),
        "/v1/gpus/probe": ("POST", backend.probe_gpus),
        "/v1/leave": ("POST", lambda: _leave(backend)),
    }
    # Services add read-only endpoints through the backend (additive; optional).
    extra = getattr(backend, "extra_routes", None)
    if callable(extra):
        routes.update({p: r for p, r in extra().items() if p not in routes})
    # And endpoints that take the request (a POST's JSON body, a GET's query).
    with_request = getattr(backend, "request_routes", None)
    taking: dict[str, tuple[str, Callable[[Any], object]]] = (
        with_request() if callable(with_request) else {}
    )

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets are not offered; hypercorn closes the connection
        route = routes.get(scope["path"].rstrip("/") or "/")
        handler: Callable[[], object] | None = None
        takes = taking.get(scope["path"].rstrip("/"))
        if route is None and takes is not None and scope["method"] == takes[0]:
            try:
                request = await _read_json(receive) if scope["method"] == "POST" else _query(scope)
            except _BadRequest as exc:
                await _respond(send, 400, {"error": str(exc)})
                return
            handler = functools.partial(takes[1], request)
        elif route is None and isinstance(backend, TaskBackend):
            try:
                request = await _read_json(receive) if scope["method"] == "POST" else _query(scope)
            except _BadRequest as exc:
                await _respond(send, 400, {"error": str(exc)})
                return
            handler = _task_route(backend, scope["method"], scope["path"], request)
        if route is None and handler is None:
            await _respond(send, 404, {"error": f"no such endpoint {scope['path']}"})
            return
        if route is not None:
            method, handler = route
            if scope["method"] != method:
                await _respond(send, 405, {"error": f"{scope['path']} takes {method}"})
                return
        assert handler is not None
        try:
            body = handler()
            if inspect.isawaitable(body):
                body = await body
        except ValueError as exc:  # a bad spec or argument: the caller's to fix
            await _respond(send, 400, {"error": str(exc)})
            return
        except ConflictError as exc:
            await _respond(send, 409, {"error": str(exc)})
            return
        except ForbiddenError as exc:
            await _respond(send, 403, {"error": str(exc)})
            return
        except LookupError as exc:
            await _respond(send, 404, {"error": str(exc.args[0] if exc.args else exc)})
            return
        except TimeoutError as exc:
            await _respond(send, 504, {"error": str(exc)})
            return
        except Exception as exc:  # a backend bug must not take the daemon down
            _log.exception("api.error path=%s", scope["path"])
            await _respond(send, 500, {"error": f"internal error: {type(exc).__name__}: {exc}"})
            return
        await _respond(send, 200, body)

    return app


async def serve_api(
    app: AsgiApp,
    socket_path: Path,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on the unix socket `socket_path` (mode 0600) until cancelled.

    Reports started (with the path) once the socket accepts connections. A stale socket
    file from a crashed daemon is replaced; the caller makes sure no live daemon owns it
    (see `ApiClient.is_running`). When `shutdown_trigger` returns, the server stops
    accepting and returns once in-flight responses are sent (at most about 1 s), so the
    answer to ``POST /v1/leave`` is delivered before the daemon exits. The connection
    cap and timeouts are the TCP listeners' (`populi_p2p._http_serve`), with every
    client counted as one source.
    """
    from ._http_serve import ConnectionGate, HttpLimits, serve_http

    caps = HttpLimits.for_open_files()  # one source: every client is this machine's user
    gate = ConnectionGate(HttpLimits(per_source=caps.total, total=caps.total))
    async with trio.open_nursery() as nursery:
        await nursery.start(
            functools.partial(
                serve_http, app, f"unix:{socket_path}", gate, logger_name="populi.api.server",
                # The socket is created under this umask, so it is never connectable by
                # others even for an instant; the chmod is belt and braces for odd
                # filesystems.
                umask=0o177, shutdown_trigger=shutdown_trigger,
            )
        )  # fmt: skip
        os.chmod(socket_path, API_SOCKET_MODE)
        task_status.started(socket_path)


class ApiError(Exception):
    """Talking to the daemon failed; the message is one line with the cause and the fix."""


class ApiClient:
    """A synchronous client of a daemon's control API (the CLI, tests, the demo)."""

    def __init__(self, socket_path: Path, timeout: float = CLIENT_TIMEOUT) -> None:
        self.socket_path = socket_path
        self._timeout = timeout

    def get(self, path: str) -> Any:
        """GET `path` and return its decoded JSON. Raises `ApiError`."""
        return self._request("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        """POST to `path` (with `body` as JSON, if given) and return its decoded JSON.
        Raises `ApiError`."""
        return self._request("POST", path, body)

    def is_running(self) -> bool:
        """Whether a daemon answers on the socket."""
        try:
            self.get("/v1/status")
        except ApiError:
            return False
        return True

    def _not_running(self) -> ApiError:
        state_dir = self.socket_path.parent
        return ApiError(
            f"the populi daemon is not running for state dir {state_dir}"
            f" (start it with: populi-node up --state-dir {state_dir})"
        )

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        if not self.socket_path.parent.exists():
            raise ApiError(
                f"state dir {self.socket_path.parent} does not exist"
                " (check --state-dir, or start a node with populi-node up)"
            )
        if not os.path.exists(self.socket_path):
            raise self._not_running()
        # Imported here: a daemon checks for a live socket at start and has none to ask
        # on a fresh start, so it never pays for the HTTP client (start-up CPU).
        import httpx

        # Plain HTTP over a unix socket: no TLS, so no CA bundle to load (the default
        # context costs about 23 ms of CPU a request, every CLI call and every submit).
        transport = httpx.HTTPTransport(uds=str(self.socket_path), verify=False)
        try:
            with httpx.Client(
                transport=transport, base_url="http://populi", timeout=self._timeout
            ) as client:
                response = client.request(method, path, json=body)
        except httpx.ConnectError as exc:
            cause = exc.__cause__ or exc.__context__
            while cause is not None and not isinstance(cause, OSError):
                cause = cause.__cause__ or cause.__context__
            if isinstance(cause, PermissionError) or (
                isinstance(cause, OSError) and cause.errno in (errno.EACCES, errno.EPERM)
            ):
                raise ApiError(
                    f"no permission to open {self.socket_path}"
                    " (run as the user that started the daemon, or use sudo)"
                ) from None
            raise self._not_running() from None
        except httpx.TimeoutException:
            raise ApiError(
                f"the daemon at {self.socket_path} did not answer within {self._timeout:.0f} s"
                " (it may be overloaded or stuck; check its log)"
            ) from None
        except httpx.HTTPError as exc:
            raise ApiError(f"talking to the daemon at {self.socket_path} failed: {exc}") from None
        try:
            answer = response.json()
        except ValueError:
            raise ApiError(
                f"the daemon answered {response.status_code} with something that is not JSON"
            ) from None
        if response.status_code != 200:
            detail = answer.get("error") if isinstance(answer, dict) else None
            if detail and (
                response.status_code in (400, 403, 409, 504) or path.startswith("/v1/tasks/")
            ):
                raise ApiError(str(detail))
            raise ApiError(f"the daemon refused {method} {path}: {detail or response.status_code}")
        return answer
