"""`populi_p2p._asgi`: the lifespan handshake and whole-body answers."""

from __future__ import annotations

import json
from typing import Any

from populi_p2p._asgi import WITH_BODY, lifespan, send_body, send_json


class Recorder:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def __call__(self, message: Any) -> None:
        self.sent.append(dict(message))


async def test_lifespan_acknowledges_startup_and_returns_at_shutdown() -> None:
    incoming = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive() -> dict[str, Any]:
        return next(incoming)

    send = Recorder()
    await lifespan(receive, send)
    assert [m["type"] for m in send.sent] == [
        "lifespan.startup.complete",
        "lifespan.shutdown.complete",
    ]


async def test_a_body_comes_with_its_type_and_length() -> None:
    send = Recorder()
    await send_body(send, 201, b"hello", "text/plain", headers=[(b"x-a", b"1")])
    start, body = send.sent
    assert start["status"] == 201 and start[WITH_BODY] is True
    assert start["headers"] == [
        (b"content-type", b"text/plain"),
        (b"content-length", b"5"),
        (b"x-a", b"1"),
    ]
    assert body == {"type": "http.response.body", "body": b"hello"}


async def test_a_head_answer_has_the_length_but_no_body() -> None:
    send = Recorder()
    await send_body(send, 200, b"hello", "text/plain", head=True)
    assert (b"content-length", b"5") in send.sent[0]["headers"]
    assert send.sent[1]["body"] == b""


async def test_json_is_sorted_so_answers_are_stable() -> None:
    send = Recorder()
    await send_json(send, 200, {"b": 1, "a": [2]})
    assert send.sent[1]["body"] == b'{"a": [2], "b": 1}'
    assert json.loads(send.sent[1]["body"]) == {"a": [2], "b": 1}
    assert (b"content-type", b"application/json") in send.sent[0]["headers"]
