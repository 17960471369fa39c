"""The API service: serves the control API on ``STATE_DIR/api.sock``.

Commands in: `stop` (the leave, once it is announced). hypercorn is imported only here,
when the service starts.
"""

from __future__ import annotations

from pathlib import Path

import trio

from ..api import ApiBackend, make_app, serve_api

__all__ = ["ApiService"]


class ApiService:
    """Args: the socket path and the backend that answers."""

    def __init__(self, socket_path: Path, backend: ApiBackend) -> None:
        self.socket_path = socket_path
        self._backend = backend
        self._stop = trio.Event()
        self.done = trio.Event()

    def stop(self) -> None:
        """Stop accepting; in-flight answers are still sent (then `done` is set)."""
        self._stop.set()

    async def run(self, *, task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await serve_api(
                make_app(self._backend),
                self.socket_path,
                shutdown_trigger=self._stop.wait,
                task_status=task_status,
            )
        finally:
            self.done.set()
