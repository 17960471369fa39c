"""The reading end of ``GET /events`` for `populi-node events`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._terminal import terminal_safe
from ..api import ApiClient, ApiError

__all__ = ["format_event", "read_events"]


def read_events(socket_path: Path, *, follow: bool) -> Iterator[dict[str, Any]]:
    """The daemon's buffered events, then (with `follow`) each new one as it happens.

    Raises:
        ApiError: the daemon is not running, refuses, or the stream breaks (one line).
    """
    ApiClient(socket_path).get("/v1/status")  # the usual one-line errors if it is not up
    import httpx

    transport = httpx.HTTPTransport(uds=str(socket_path))
    timeout = httpx.Timeout(10.0, read=None if follow else 10.0)
    try:
        with (
            httpx.Client(transport=transport, base_url="http://populi", timeout=timeout) as c,
            c.stream("GET", "/events") as stream,
        ):
            if stream.status_code != 200:
                raise ApiError(f"the daemon refused GET /events: {stream.status_code}")
            for line in stream.iter_lines():
                if line == ": live" and not follow:
                    return
                if not line.startswith("data: "):
                    continue
                try:
                    event = json.loads(line[6:])
                except ValueError:
                    continue  # not ours to crash on
                if isinstance(event, dict):
                    yield event
    except httpx.HTTPError as exc:
        raise ApiError(f"the event stream from {socket_path} broke: {exc}") from None


def format_event(event: dict[str, Any]) -> str:
    """One line: local time, kind, message."""
    when = event.get("time")
    stamp = (
        time.strftime("%H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) else "-"
    )
    line = f"{stamp} {event.get('kind', '?')!s:<16} {event.get('message', '')}"
    return terminal_safe(line)
