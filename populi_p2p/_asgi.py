"""The small ASGI pieces the node's HTTP apps share: the types, the lifespan handshake,
and whole-body answers (bytes or JSON).

HTTP itself is hypercorn's; this only speaks ASGI to it. Used by the control API
(`api.py`), the observability routes (`observe/web.py`) and the inference listeners
(`inference/_asgi.py` adds body limits, streaming and serving on a TCP address).
Imports nothing beyond the standard library, so the CLI can import `api` cheaply.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

__all__ = [
    "WITH_BODY", "AsgiApp", "Message", "Receive", "Scope", "Send", "lifespan", "send_body",
    "send_json",
]  # fmt: skip

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Set (True) on an ``http.response.start`` whose first ``http.response.body`` the app
#: sends right after it, with nothing to wait for in between: the listener
#: (`_http_serve.guard_app`) then sends the head and that body in one write, which
#: saves the client a wake-up for a head alone. Other servers ignore the key.
WITH_BODY = "populi.with_body"


async def lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge the server's lifespan protocol (nothing to set up); return at shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def send_body(
    send: Send,
    status: int,
    body: bytes,
    content_type: str,
    *,
    headers: Sequence[tuple[bytes, bytes]] = (),
    head: bool = False,
) -> None:
    """Answer with the whole `body` and its length (no body for a HEAD: `head`)."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
            WITH_BODY: True,
        }
    )
    await send({"type": "http.response.body", "body": b"" if head else body})


async def send_json(
    send: Send, status: int, body: object, *, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer with `body` as JSON (keys sorted, so answers are stable byte for byte)."""
    data = json.dumps(body, sort_keys=True).encode()
    await send_body(send, status, data, "application/json", headers=headers)
