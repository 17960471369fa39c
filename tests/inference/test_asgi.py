"""`inference._asgi`: headers, bounded bodies, JSON and streamed answers, serving on TCP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from populi_p2p._asgi import WITH_BODY
from populi_p2p.inference._asgi import (
    BodyTooLarge,
    Message,
    header_map,
    lifespan,
    read_body,
    send_json,
    send_stream,
    serve_tcp,
)


def receiver(*messages: Message) -> Any:
    queue = list(messages)

    async def receive() -> Message:
        return queue.pop(0)

    return receive


class Sent(list[Message]):
    async def __call__(self, message: Message) -> None:
        self.append(message)

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self if m["type"] == "http.response.body"]


def test_header_map_lower_cases_names_and_keeps_the_last_repeat() -> None:
    scope = {"headers": [(b"Content-Type", b"application/json"), (b"X-A", b"1"), (b"x-a", b"2"),
                         (b"x-l", "caf\u00e9".encode("latin-1"))]}  # fmt: skip
    assert header_map(scope) == {"content-type": "application/json", "x-a": "2", "x-l": "caf\u00e9"}
    assert header_map({}) == {}


async def test_read_body_joins_the_chunks() -> None:
    receive = receiver(
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": True},
        {"type": "http.request", "body": b"e"},
    )
    assert await read_body(receive, limit=5) == b"abcde"


async def test_read_body_stops_at_a_disconnect() -> None:
    receive = receiver(
        {"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.disconnect"}
    )
    assert await read_body(receive, limit=5) == b"ab"


async def test_a_body_over_the_limit_is_refused_as_it_arrives() -> None:
    receive = receiver(
        {"type": "http.request", "body": b"abc", "more_body": True},
        {"type": "http.request", "body": b"def", "more_body": True},
    )  # a third message would fail the test (pop from an empty list)
    with pytest.raises(BodyTooLarge, match="over 5 bytes"):
        await read_body(receive, limit=5)


async def test_send_json_with_headers_as_a_dict() -> None:
    sent = Sent()
    await send_json(sent, 429, {"b": 1, "a": 2}, headers={"retry-after": "3"})
    start = sent[0]
    assert start["status"] == 429
    assert (b"retry-after", b"3") in start["headers"]
    assert (b"content-type", b"application/json") in start["headers"]
    assert json.loads(b"".join(sent.bodies())) == {"a": 2, "b": 1}


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        await trio.lowlevel.checkpoint()
        yield part


async def test_send_stream_sends_the_head_with_the_first_chunk_and_skips_empty_ones() -> None:
    sent = Sent()
    parts = chunks(b"data: 1\n\n", b"", b"data: 2\n\n")
    route = {"x-populi-route": "r"}
    await send_stream(sent, 200, parts, content_type="text/event-stream", headers=route)
    start = sent[0]
    assert start["type"] == "http.response.start" and start[WITH_BODY] is True
    assert start["headers"] == [(b"content-type", b"text/event-stream"), (b"x-populi-route", b"r")]
    assert sent.bodies() == [b"data: 1\n\n", b"data: 2\n\n", b""]
    assert [m.get("more_body", False) for m in sent[1:]] == [True, True, False]


async def test_an_empty_stream_is_a_head_and_an_empty_end() -> None:
    sent = Sent()
    await send_stream(sent, 204, chunks(), content_type="text/plain")
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent.bodies() == [b""]


@pytest.mark.parametrize("parts", [(b"a", b"b", b"c"), (b"a", b"", b"b"), ()])
async def test_a_coalesced_stream_carries_the_same_bytes_and_ends_once(
    parts: tuple[bytes, ...],
) -> None:
    sent = Sent()
    await send_stream(sent, 200, chunks(*parts), content_type="text/plain", coalesce=True)
    assert sent[0]["type"] == "http.response.start"
    assert b"".join(sent.bodies()) == b"".join(parts)
    assert [m.get("more_body", False) for m in sent[1:]].count(False) == 1
    assert sent[-1].get("more_body", False) is False


async def test_a_coalesced_stream_sends_its_first_chunk_at_once_and_joins_the_rest() -> None:
    """The first chunk is what the client waits for: it goes out alone, as soon as it
    comes. What is already there after it goes out in one write, the end with it."""

    async def ready() -> AsyncIterator[bytes]:
        for part in (b"a", b"b", b"c", b"d"):  # no checkpoint between them
            yield part

    sent = Sent()
    await send_stream(sent, 200, ready(), content_type="text/plain", coalesce=True)
    assert sent.bodies() == [b"a", b"bcd"]
    assert [m.get("more_body", False) for m in sent[1:]] == [True, False]


async def test_a_coalesced_stream_sends_its_first_chunk_before_the_next_comes() -> None:
    later = trio.Event()

    class Watched(Sent):
        async def __call__(self, message: Message) -> None:
            await super().__call__(message)
            if self.bodies():
                later.set()  # the source's next chunk comes only after a body was sent

    async def slow() -> AsyncIterator[bytes]:
        yield b"first"
        await later.wait()
        yield b"second"

    sent = Watched()
    with trio.fail_after(5):
        await send_stream(sent, 200, slow(), content_type="text/plain", coalesce=True)
    assert sent.bodies() == [b"first", b"second"]


async def test_a_coalesced_stream_closes_its_source() -> None:
    closed = trio.Event()

    async def source() -> AsyncIterator[bytes]:
        try:
            yield b"a"
        finally:
            closed.set()

    await send_stream(Sent(), 200, source(), content_type="text/plain", coalesce=True)
    assert closed.is_set()


async def test_serve_tcp_reports_its_port_and_serves_the_app() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await send_json(send, 200, {"path": scope["path"]})
        elif scope["type"] == "lifespan":
            await lifespan(receive, send)

    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_tcp(
                app, "127.0.0.1", 0, logger_name="test", task_status=task_status
            )
        )
        assert port > 0
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"http://127.0.0.1:{port}/v1/x")
        assert response.json() == {"path": "/v1/x"}
        nursery.cancel_scope.cancel()
