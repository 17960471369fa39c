"""`CompletionHandler`: a request for a model that is deployed but still loading waits
for it within the bound, then gets 503 `model_loading`."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing

from populi_p2p.inference.completions import CompletionHandler
from populi_p2p.inference.request_log import RequestLog
from populi_p2p.inference.route import RouteDecision, Score

SHA = "cd" * 32


class _Relay:
    async def whole(self, order: Any, path: str, request: Any) -> Any:
        return 200, b'{"ok": true}', "n1", []


def _decision(order: tuple[str, ...]) -> RouteDecision:
    score = Score(healthy=True, reliability=0.5, outstanding=0, slots=4, cost=0.0, rtt=None)
    return RouteDecision("qwen", order, dict.fromkeys(order, score), {}, {})


async def _ask(handler: CompletionHandler) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]})
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body.encode(), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await handler("/v1/chat/completions", True, receive, send, None)
    return sent[0]["status"], json.loads(sent[-1]["body"])


async def test_a_request_waits_for_a_loading_model_within_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ready_at = trio.current_time() + 5.0

    def decide(model: str, _tried: Any = ()) -> tuple[RouteDecision, list[Any]]:
        return _decision(("n1",) if trio.current_time() >= ready_at else ()), []

    handler = CompletionHandler(decide, _Relay(), RequestLog(),  # type: ignore[arg-type]
                                loading=lambda m: m == "qwen", load_wait=60.0)  # fmt: skip
    began = trio.current_time()
    status, body = await _ask(handler)
    assert status == 200 and body == {"ok": True}
    assert 5.0 <= trio.current_time() - began < 5.5
    # Past the bound: a 503 that says so, after load_wait and not before.
    never = CompletionHandler(lambda m, _t=(): (_decision(()), []), _Relay(), RequestLog(),  # type: ignore[arg-type]
                              loading=lambda m: True, load_wait=7.0)  # fmt: skip
    began = trio.current_time()
    status, body = await _ask(never)
    assert status == 503 and "deployed but no replica" in body["error"]["message"]
    assert 7.0 <= trio.current_time() - began < 7.5
    # A model nobody deployed fails at once, as before.
    unknown = CompletionHandler(lambda m, _t=(): (_decision(()), []), _Relay(), RequestLog(),  # type: ignore[arg-type]
                                loading=lambda m: False)  # fmt: skip
    began = trio.current_time()
    status, _ = await _ask(unknown)
    assert status in (404, 503) and trio.current_time() == began
