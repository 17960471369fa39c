"""The few ASGI pieces the inference listeners share: types, body reading, JSON
answers, and serving an app on a TCP address with hypercorn's Trio worker (under the
connection caps and timeouts of `populi_p2p._http_serve`).

HTTP itself is hypercorn's; this only speaks ASGI to it.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

from .. import _asgi as _shared
from .._asgi import WITH_BODY, AsgiApp, Message, Receive, Scope, Send, lifespan
from .._http_serve import ConnectionGate, HttpLimits, serve_http

__all__ = [
    "AsgiApp",
    "BodyTooLarge",
    "Receive",
    "Scope",
    "Send",
    "header_map",
    "lifespan",
    "read_body",
    "send_json",
    "send_stream",
    "serve_tcp",
]


class BodyTooLarge(Exception):
    """The request body is over the listener's limit (answer 413)."""


def header_map(scope: Scope) -> dict[str, str]:
    """Request headers, lower-case names; a repeated header keeps its last value."""
    out: dict[str, str] = {}
    for name, value in scope.get("headers", []):
        out[bytes(name).decode("latin-1").lower()] = bytes(value).decode("latin-1")
    return out


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body, at most `limit` bytes. Raises `BodyTooLarge`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the body is over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def send_json(
    send: Send, status: int, body: object, headers: dict[str, str] | None = None
) -> None:
    """The shared JSON answer, with `headers` given as a dict."""
    extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await _shared.send_json(send, status, body, headers=extra)


async def send_stream(
    send: Send,
    status: int,
    chunks: AsyncIterator[bytes],
    *,
    content_type: str,
    headers: dict[str, str] | None = None,
    coalesce: bool = False,
) -> None:
    """Answer with `chunks` as they come (each flushed at once: SSE passes through).

    The head waits for the first chunk, and both go out in one write (`WITH_BODY`).
    `coalesce`: chunks that are already there when one is written go out with it, as
    one write (a relay whose upstream runs ahead of it writes less often, never later).
    """
    extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    head: list[Message] = [
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type.encode()), *extra],
            WITH_BODY: True,
        }
    ]

    async def send_chunk(message: Message) -> None:
        if head:
            await send(head.pop())
        await send(message)

    if coalesce and await _send_coalesced(send_chunk, chunks):
        return
    if not coalesce:
        async for chunk in chunks:
            if chunk:
                await send_chunk({"type": "http.response.body", "body": chunk, "more_body": True})
    await send_chunk({"type": "http.response.body", "body": b""})


async def _send_coalesced(send: Send, chunks: AsyncIterator[bytes]) -> bool:
    """Whether the last write was the end of the answer (the iterator had ended when
    its last chunks were taken: they go out as the final body, with the end).

    The first chunk is awaited here and sent at once: it is the one the client waits
    for (the time to first token), and a reader task would add a task's start and a
    hand-over to its path. The rest is read by a task that queues what arrives while a
    write is under way, so that it goes out with the next write."""
    iterator = aiter(chunks)
    first = b""
    while not first:
        try:
            first = await anext(iterator)
        except StopAsyncIteration:
            return False
    await send({"type": "http.response.body", "body": first, "more_body": True})
    chunks_in, chunks_out = trio.open_memory_channel[bytes](64)

    async def pull() -> None:
        try:
            async with chunks_in:
                async for chunk in iterator:
                    if not chunk:
                        continue
                    # No checkpoint while the iterator hands out what it already has.
                    try:
                        chunks_in.send_nowait(chunk)
                    except trio.WouldBlock:
                        await chunks_in.send(chunk)
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                with trio.CancelScope(shield=True):
                    await aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pull)
        async for chunk in chunks_out:
            parts = [chunk]
            ended = False
            while not ended:
                try:
                    parts.append(chunks_out.receive_nowait())
                except trio.WouldBlock:
                    break
                except trio.EndOfChannel:
                    ended = True
            body = parts[0] if len(parts) == 1 else b"".join(parts)
            await send({"type": "http.response.body", "body": body, "more_body": not ended})
            if ended:
                return True
    return False


async def serve_tcp(
    app: AsgiApp,
    host: str,
    port: int,
    *,
    logger_name: str,
    gate: ConnectionGate | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on ``host:port`` until cancelled; started with the bound port.

    `gate`: the listener's connection caps and timeouts (default: those for this
    process's open-file limit, `HttpLimits.for_open_files`)."""
    if gate is None:
        gate = ConnectionGate(HttpLimits.for_open_files())
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    async with trio.open_nursery() as nursery:
        names: list[Any] = await nursery.start(
            functools.partial(
                serve_http, app, bind, gate,
                logger_name=logger_name, shutdown_trigger=shutdown_trigger,
            )
        )  # fmt: skip
        task_status.started(int(names[0][1]))
