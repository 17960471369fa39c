"""The API service: serves the control API on ``STATE_DIR/api.sock``.

Commands in: `stop` (the leave, once it is announced). hypercorn is imported only here,
when the service starts.
"""

from __future__ import annotations

from pathlib import Path

import trio

from .._asgi import AsgiApp
from ..api import ApiBackend, make_app, serve_api
from ..observe.web import mount

__all__ = ["ApiService"]


class ApiService:
    """Args: the socket path, the backend that answers, and an `extra` app whose routes
    (`observe.web.handles`) are mounted in front: metrics, events, the dashboard."""

    def __init__(
        self, socket_path: Path, backend: ApiBackend, *, extra: AsgiApp | None = None
    ) -> None:
        self.socket_path = socket_path
        self._backend = backend
        self._extra = extra
        self._stop = trio.Event()
        self.done = trio.Event()

    def stop(self) -> None:
        """Stop accepting; in-flight answers are still sent (then `done` is set)."""
        self._stop.set()

    async def run(self, *, task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            app = make_app(self._backend)
            await serve_api(
                app if self._extra is None else mount(app, self._extra),
                self.socket_path,
                shutdown_trigger=self._stop.wait,
                task_status=task_status,
            )
        finally:
            self.done.set()
