"""The recent routes, for ``GET /populi/requests`` and ``populi-node requests``."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Final

from .route import RouteDecision

__all__ = ["RECENT_ROUTES", "RequestLog"]

#: How many routed requests the log keeps (the oldest drop out).
RECENT_ROUTES: Final = 256


class RequestLog:
    """A bounded log of routed requests: one dict each, filled in as the request goes."""

    def __init__(self, size: int = RECENT_ROUTES) -> None:
        self._recent: deque[dict[str, Any]] = deque(maxlen=size)

    def open(
        self,
        model: str,
        path: str,
        stream: bool,
        decision: RouteDecision,
        names: dict[str, str],
        decision_ms: float,
    ) -> dict[str, Any]:
        """A new entry for a routed request; the caller adds the outcome to it later."""
        entry: dict[str, Any] = {
            "at": time.time(),
            "model": model,
            "path": path,
            "stream": stream,
            "order": [names.get(n, n) for n in decision.order],
            "route": decision.header(),
            "decision_ms": round(decision_ms, 3),
        }
        self._recent.append(entry)
        return entry

    def recent(self) -> list[dict[str, Any]]:
        return list(self._recent)
