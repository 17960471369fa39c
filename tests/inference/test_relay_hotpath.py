"""The relay's hot path with scripted upstreams (no sockets): batches pass through
as bytes, the text sent is recovered exactly at failover for the continuation, and a
stream whose forwarded text cannot be decoded ends with an error event instead of a
continuation that would guess."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import trio

from populi_p2p.inference.relay import STALL_FLOOR, GapStats, Relay


def event(piece: str | None, finish: str | None = None) -> bytes:
    delta = {} if piece is None else {"content": piece}
    chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class Script:
    """Upstreams by node: the byte chunks each sends, then a clean end or a reset."""

    def __init__(self, plan: dict[str, tuple[list[bytes], bool]]) -> None:
        self.plan = plan
        self.bodies: dict[str, dict[str, Any]] = {}

    @contextlib.asynccontextmanager
    async def open(
        self, node: str, model: str, path: str, body: bytes
    ) -> AsyncIterator[httpx.Response]:
        self.bodies[node] = json.loads(body)
        chunks, clean = self.plan[node]

        async def stream() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk
            if not clean:
                raise httpx.ReadError("connection reset")

        yield httpx.Response(200, content=stream())


async def run(script: Script, order: list[str]) -> tuple[bytes, list[tuple[str, bool]]]:
    out: list[bytes] = []
    outcomes: list[tuple[str, bool]] = []

    async def start(status: int, node: str, body: bytes | None) -> None:
        assert status == 200

    async def emit(data: bytes) -> None:
        out.append(data)

    relay = Relay(script.open, lambda n: True, stall_timeout=5.0,
                  on_outcome=lambda n, ok: outcomes.append((n, ok)))  # fmt: skip
    request = {"model": "m", "stream": True, "max_tokens": 10,
               "messages": [{"role": "user", "content": "go"}]}  # fmt: skip
    result = await relay.stream(order, "/v1/chat/completions", request, True, start, emit)
    return b"".join(out) + result.final, outcomes


async def test_bytes_pass_through_and_one_done_goes_out_with_the_last_events() -> None:
    tokens = [event(f"w{i} ") for i in range(3)]
    script = Script({"a": ([b"".join(tokens[:2]), tokens[2], event(None, "stop")
                            + b"data: [DONE]\n\n"], True)})  # fmt: skip
    sent, outcomes = await run(script, ["a"])
    assert sent == b"".join(tokens) + event(None, "stop") + b"data: [DONE]\n\n"
    assert outcomes == [("a", True)]


async def test_failover_continues_after_exactly_the_text_sent() -> None:
    # The event for w2 is cut in two by the reset: only w0 and w1 reached the client.
    w2 = event("w2 ")
    script = Script({
        "a": ([event("w0 ") + event("w1 ") + w2[:10]], False),
        "b": ([event("w2 "), event(None, "stop") + b"data: [DONE]\n\n"], True),
    })  # fmt: skip
    sent, outcomes = await run(script, ["a", "b"])
    assert script.bodies["b"]["messages"][-1] == {"role": "assistant", "content": "w0 w1 "}
    assert script.bodies["b"]["max_tokens"] == 8  # 10 less the 2 tokens sent
    assert sent == (event("w0 ") + event("w1 ") + event("w2 ") + event(None, "stop")
                    + b"data: [DONE]\n\n")  # fmt: skip
    assert outcomes == [("a", False), ("b", True)]


async def test_text_that_cannot_be_recovered_ends_with_an_error_not_a_guess() -> None:
    bad = b'data: {"choices": oops, "finish_reason": null}\n\n'  # shaped like a chunk
    script = Script({"a": ([event("w0 ") + bad], False), "b": ([event("w1 ")], True)})
    sent, outcomes = await run(script, ["a", "b"])
    assert "b" not in script.bodies  # no continuation was attempted
    assert b"[DONE]" not in sent
    last = sent.rstrip().rsplit(b"\n\n", 1)[-1]
    assert b"cannot be continued" in last and json.loads(last[6:])["error"]
    assert outcomes == [("a", False)]


async def test_the_last_events_and_done_go_out_before_the_upstream_ends() -> None:
    """A one-token answer's token is in the batch with the upstream's [DONE]: it goes
    out at once, with our one [DONE], not after the upstream's end of body."""
    released = trio.Event()
    last = event("only", "stop") + b"data: [DONE]\n\n"

    @contextlib.asynccontextmanager
    async def open_(node: str, model: str, path: str, body: bytes) -> AsyncIterator[httpx.Response]:
        async def stream() -> AsyncIterator[bytes]:
            yield last
            await released.wait()  # the end of body comes only once the client has all

        yield httpx.Response(200, content=stream())

    out: list[bytes] = []

    async def start(status: int, node: str, body: bytes | None) -> None:
        assert status == 200

    async def emit(data: bytes) -> None:
        out.append(data)
        if data.endswith(b"data: [DONE]\n\n"):
            released.set()

    relay = Relay(open_, lambda n: True, stall_timeout=5.0, on_outcome=lambda n, ok: None)
    request = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    with trio.fail_after(5):
        result = await relay.stream(["a"], "/v1/chat/completions", request, True, start, emit)
    assert out == [last] and result.final == b"" and result.done and result.tokens == 1


async def test_the_first_chunk_is_passed_on_without_a_hand_over_between_tasks() -> None:
    """The first token is read by the task that sends it: another task made runnable
    as the upstream hands out its first chunk does not run before the chunk is sent
    (with a reader task in between, it did: the hand-over took a scheduling round)."""
    log: list[str] = []

    async def canary() -> None:
        log.append("another task ran")

    async with trio.open_nursery() as nursery:

        @contextlib.asynccontextmanager
        async def open_(
            node: str, model: str, path: str, body: bytes
        ) -> AsyncIterator[httpx.Response]:
            async def stream() -> AsyncIterator[bytes]:
                nursery.start_soon(canary)
                yield event("first ")
                yield event(None, "stop") + b"data: [DONE]\n\n"

            yield httpx.Response(200, content=stream())

        async def start(status: int, node: str, body: bytes | None) -> None:
            assert status == 200

        async def emit(data: bytes) -> None:
            log.append(f"sent {data[:20]!r}")

        relay = Relay(open_, lambda n: True, stall_timeout=5.0, on_outcome=lambda n, ok: None)
        request = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
        result = await relay.stream(["a"], "/v1/chat/completions", request, True, start, emit)
    assert log[0] == f"sent {event('first ')[:20]!r}" and "another task ran" in log
    assert result.done and result.tokens == 1


async def _silent_then_served(
    first_token_timeout: float, *, dies: bool = False, suspect: bool = False
) -> tuple[bytes, list[str], float]:
    """Node "a" answers 200 and then sends nothing (and is declared dead once its
    attempt began, if it `dies`; it was suspect all along, if `suspect`: tried as the
    last resort); node "b" serves. What the client got, each attempt's outcome, and
    when "a" was given up (relay time)."""
    gone: set[str] = set()

    @contextlib.asynccontextmanager
    async def open_(node: str, model: str, path: str, body: bytes) -> AsyncIterator[httpx.Response]:
        async def stream() -> AsyncIterator[bytes]:
            if node == "a":
                if dies:
                    gone.add("a")
                await trio.sleep_forever()
            yield event("b0 ") + event(None, "stop") + b"data: [DONE]\n\n"

        yield httpx.Response(200, content=stream())

    out: list[bytes] = []
    moved: list[float] = []

    async def start(status: int, node: str, body: bytes | None) -> None:
        assert status == 200

    async def emit(data: bytes) -> None:
        moved.append(trio.current_time())
        out.append(data)

    relay = Relay(
        open_, lambda n: n not in gone and not (suspect and n == "a"), stall_timeout=0.2,
        on_outcome=lambda n, ok: None, node_gone=gone.__contains__,
    )  # fmt: skip
    relay.first_token_timeout = first_token_timeout
    request = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    began = trio.current_time()
    result = await relay.stream(["a", "b"], "/v1/chat/completions", request, True, start, emit)
    return b"".join(out) + result.final, [a.outcome for a in result.attempts], moved[0] - began


async def test_a_node_silent_before_its_first_chunk_is_left_at_the_first_token_timeout(
    autojump_clock: Any,
) -> None:
    sent, outcomes, after = await _silent_then_served(first_token_timeout=1.0)
    assert sent.startswith(event("b0 ")) and sent.count(b"[DONE]") == 1
    assert "no token for 1.0 s" in outcomes[0] and outcomes[1] == "served"
    assert 1.0 <= after <= 1.0 + 0.25  # within a watch interval or two


async def test_a_node_that_dies_before_its_first_chunk_is_left_at_the_next_watch(
    autojump_clock: Any,
) -> None:
    sent, outcomes, after = await _silent_then_served(first_token_timeout=60, dies=True)
    assert sent.startswith(event("b0 ")) and "no longer alive" in outcomes[0]
    assert after <= 0.25


async def test_a_node_tried_while_suspect_is_left_when_it_is_declared_dead(
    autojump_clock: Any,
) -> None:
    """Its staying suspect does not cut it (it was tried as the last resort); its
    death does, at the next watch, not at the first-token timeout."""
    sent, outcomes, after = await _silent_then_served(
        first_token_timeout=60, dies=True, suspect=True
    )
    assert sent.startswith(event("b0 ")) and "the node is gone" in outcomes[0]
    assert after <= 0.25
    _, outcomes, after = await _silent_then_served(first_token_timeout=1.0, suspect=True)
    assert "no token for 1.0 s" in outcomes[0] and after >= 1.0  # suspect: not left for it


async def test_an_upstream_that_ends_without_done_still_gets_one() -> None:
    script = Script({"a": ([event("w0 "), event(None, "stop")], True)})
    sent, outcomes = await run(script, ["a"])
    assert sent == event("w0 ") + event(None, "stop") + b"data: [DONE]\n\n"
    assert sent.count(b"[DONE]") == 1 and outcomes == [("a", True)]


def test_the_stall_timeout_follows_the_gaps_and_is_not_sorted_per_stream() -> None:
    gaps = GapStats()
    assert gaps.stall_timeout(7.0) == 7.0  # configured: fixed
    for _ in range(19):
        gaps.add(0.01)
    assert gaps.stall_timeout(None) == STALL_FLOOR  # too few gaps to judge
    gaps.add(0.01)
    assert gaps.stall_timeout(None) == STALL_FLOOR  # 3 x 0.01 s is under the floor
    for _ in range(GapStats.RECOMPUTE_AFTER - 1):
        gaps.add(1.0)
    assert gaps.stall_timeout(None) == STALL_FLOOR  # not computed again yet
    gaps.add(1.0)
    assert gaps.stall_timeout(None) == 3.0  # the p99 gap is now 1 s
