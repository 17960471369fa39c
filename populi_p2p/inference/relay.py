"""The relay: one client request, served by the route's nodes in turn, as one stream.

Before the first byte reaches the client, a refused or reset connection, a timeout, an
engine error (5xx) or a refusal by the node's peer API (`UpstreamRefused`) moves to the
next node at once. An engine's 4xx is the client's answer: passed back as it is, never
a node fault, never a failover (a 4xx to a continuation, mid-stream, is neither the
client's nor the node's fault: the next node is asked, and nobody's reliability
changes). Once the stream has started, a
lost connection, a gap between tokens longer than the stall timeout, an error event
from the engine, or the membership saying the node is no longer alive (checked every
`WATCH_INTERVAL`) moves the stream to the next node with a continuation request (the
original request plus the text already sent, `sse.continuation`). The upstream's
``[DONE]`` is replaced by the relay's own: the client gets exactly one, with the events
of the batch that held the upstream's (at once, not after the upstream's end of body:
a one-token answer's token is in that batch), or a clear error event when no node is
left.

The request path never waits for failure detection: a reset or refusal is seen in
milliseconds; SWIM only adds the case of a node that goes silent without a reset.

The hot path passes bytes through: what has arrived goes out in one write, scanned
(`sse.scan_batch`), not decoded; the text sent is decoded only at failover
(`sse.recover_text`).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, Final, TypeAlias

import attrs
import httpx
import trio

from .sse import (
    DONE,
    SseSplitter,
    chunk_text,
    continuation,
    error_event,
    event_data,
    recover_text,
    scan_batch,
    split_events,
)

__all__ = [
    "Attempt", "GapStats", "NextNode", "OpenUpstream", "Relay", "StreamResult",
    "UpstreamRefused",
]  # fmt: skip

#: Seconds between checks that the serving node is still alive, mid-stream.
WATCH_INTERVAL: Final = 0.1
#: The stall timeout's floor, seconds (the issue's "max(3x recent p99 gap, 2 s)").
STALL_FLOOR: Final = 2.0
#: Seconds a node may take to its first token (its prefill) before it counts as
#: stalled: never below the stall timeout.
FIRST_TOKEN_TIMEOUT: Final = 10.0
#: Most nodes one request is tried on (the first and up to three that take over).
MAX_ATTEMPTS: Final = 4

#: (node, model, path, body): the node's answer, as a stream.
OpenUpstream = Callable[
    [str, str, str, bytes], contextlib.AbstractAsyncContextManager[httpx.Response]
]
Emit = Callable[[bytes], Awaitable[None]]
#: The node to try next, given those already tried for this request (None: none left).
#: The service chooses it again from the view as it is at that moment.
NextNode: TypeAlias = Callable[[Sequence[str]], str | None]


def _next_node(route: Sequence[str] | NextNode) -> NextNode:
    """`route` as a chooser (a fixed order is taken in turn)."""
    if callable(route):
        return route
    fixed = list(route)
    return lambda tried: fixed[len(tried)] if len(tried) < len(fixed) else None


class GapStats:
    """Recent inter-token gaps, for the adaptive stall timeout.

    The timeout (3x the p99 gap) is computed again only after `RECOMPUTE_AFTER` new
    gaps: every stream asks for it at its start, and sorting the last 1,024 gaps each
    time would be on every stream's path to its first token."""

    #: New gaps before the p99 is computed again.
    RECOMPUTE_AFTER: Final = 32

    def __init__(self, size: int = 1024) -> None:
        self._gaps: deque[float] = deque(maxlen=size)
        self._timeout: float | None = None
        self._new = 0

    def add(self, gap: float) -> None:
        self._gaps.append(gap)
        self._new += 1

    def stall_timeout(self, configured: float | None) -> float:
        if configured is not None:
            return configured
        if len(self._gaps) < 20:
            return STALL_FLOOR
        if self._timeout is None or self._new >= self.RECOMPUTE_AFTER:
            ordered = sorted(self._gaps)
            p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
            self._timeout = max(3 * p99, STALL_FLOOR)
            self._new = 0
        return self._timeout


class UpstreamRefused(httpx.HTTPError):
    """The node refused the call itself, before its engine saw it (a peer API's 401,
    404, 413): a node fault, unlike the engine's own 4xx. The message says why."""


def _why(exc: httpx.HTTPError) -> str:
    return str(exc) if isinstance(exc, UpstreamRefused) else type(exc).__name__


@attrs.frozen
class Attempt:
    """One node's part in serving a request."""

    node: str
    outcome: str  # "served", "refused: ...", "broken: ...", "client error (4xx)"
    tokens: int = 0


@attrs.define
class StreamResult:
    attempts: list[Attempt] = attrs.field(factory=list)
    done: bool = False
    tokens: int = 0
    #: The first byte's node and status, once the response has started.
    status: int = 0
    first_node: str | None = None
    #: The stream's last bytes, not emitted: the caller sends them as the end of its
    #: answer, in one write ([DONE] or the error event; nothing when the [DONE] went
    #: out with the last events).
    final: bytes = b""


class _Broken(Exception):
    """A node failed mid-stream: `why`, and what it had sent (the text and its tokens,
    decoded now; text None when it cannot be known)."""

    def __init__(self, why: str, text: str | None = "", tokens: int = 0) -> None:
        super().__init__(why)
        self.why = why
        self.text = text
        self.tokens = tokens


class _BrokenAfter(Exception):
    """A bad event after good ones in one batch: emit `data` (the good ones), then
    raise `broken`."""

    def __init__(self, data: bytes, broken: _Broken) -> None:
        super().__init__(broken.why)
        self.data = data
        self.broken = broken


class Relay:
    """Args: how to open an upstream (node, path, body), whether a node is still
    alive, the configured stall timeout (None: adaptive), where outcomes go, how long
    a node may take to its first token (`first_token_timeout`, its prefill), how many
    nodes one request may be tried on (`max_attempts`), and whether a node is gone
    (`node_gone`: dead or left; a node tried while suspect, the route's last resort,
    is left when it is gone, not for staying suspect)."""

    def __init__(
        self,
        open_upstream: OpenUpstream,
        node_alive: Callable[[str], bool],
        *,
        stall_timeout: float | None,
        on_outcome: Callable[[str, bool], None],
        gaps: GapStats | None = None,
        first_token_timeout: float = FIRST_TOKEN_TIMEOUT,
        max_attempts: int = MAX_ATTEMPTS,
        node_gone: Callable[[str], bool] | None = None,
    ) -> None:
        self._open = open_upstream
        self._gone = node_gone
        self.max_attempts = max_attempts
        self.first_token_timeout = first_token_timeout
        self._alive = node_alive
        self._stall = stall_timeout
        self._on_outcome = on_outcome
        self.gaps = gaps if gaps is not None else GapStats()

    def _nodes(self, route: Sequence[str] | NextNode) -> Iterator[str]:
        """The nodes to try, each asked of `route` only when the one before failed (at
        most `max_attempts`)."""
        next_node = _next_node(route)
        tried: list[str] = []
        while len(tried) < self.max_attempts:
            node = next_node(tried)
            if node is None:
                return
            tried.append(node)
            yield node

    ####################################################################################
    # Not streamed: try each node until one answers.

    async def whole(
        self, route: Sequence[str] | NextNode, path: str, request: dict[str, Any]
    ) -> tuple[int, bytes, str | None, list[Attempt]]:
        """(status, body, serving node, attempts); status 0 when every node failed.
        `route`: the nodes in turn, or the chooser of the next one."""
        attempts: list[Attempt] = []
        body = json.dumps(request).encode()
        model = str(request.get("model", ""))
        for node in self._nodes(route):
            try:
                async with self._open(node, model, path, body) as response:
                    data = await response.aread()
                    status = response.status_code
            except httpx.HTTPError as exc:
                attempts.append(Attempt(node, f"refused: {_why(exc)}"))
                self._on_outcome(node, False)
                continue
            if status >= 500:
                attempts.append(Attempt(node, f"refused: engine answered {status}"))
                self._on_outcome(node, False)
                continue
            if status >= 400:  # the engine's answer to the client's request
                attempts.append(Attempt(node, f"client error ({status})"))
                return status, data, node, attempts
            attempts.append(Attempt(node, "served"))
            self._on_outcome(node, True)
            return status, data, node, attempts
        return 0, b"", None, attempts

    ####################################################################################
    # Streamed: one stream to the client, across nodes.

    async def stream(
        self,
        route: Sequence[str] | NextNode,
        path: str,
        request: dict[str, Any],
        chat: bool,
        start: Callable[[int, str, bytes | None], Awaitable[None]],
        emit: Emit,
    ) -> StreamResult:
        """Serve `request` along `route`: the nodes in turn, or the chooser of the
        next node, asked at each failover.

        `start(status, node, body)` is called once, before anything is emitted: with
        200 when a node has begun streaming, or with an error status and the engine's
        body (a 4xx, passed through), or with 0 when no node could start (the caller
        answers with an error). Then `emit` gets the SSE bytes, and the result's
        `final` the last of them.
        """
        result = StreamResult()
        model = str(request.get("model", ""))
        streamed = ""
        started = False
        for node in self._nodes(route):
            body = request if not streamed else continuation(request, chat, streamed, result.tokens)
            raw = json.dumps(body).encode()
            sent_before = result.tokens
            alive = self._alive(node)  # else a suspect node, the route's last resort
            try:
                async with self._open(node, model, path, raw) as response:
                    status = response.status_code
                    if status != 200:
                        data = await response.aread()
                        if not 400 <= status < 500:
                            raise _Broken(f"engine answered {status}")
                        if not started:  # the engine's answer to the client's request
                            result.attempts.append(Attempt(node, f"client error ({status})"))
                            result.status = status
                            await start(status, node, data)
                            return result
                        # It refused our continuation: not the node's fault, nor the
                        # client's (it was served until the break); ask the next node.
                        result.attempts.append(
                            Attempt(node, f"client error ({status}) to the continuation")
                        )
                        continue
                    if not started:
                        started = True
                        result.status, result.first_node = 200, node
                        await start(200, node, None)
                    end = await _Pump(self, node, response, chat, emit, result, alive).run()
                    result.attempts.append(Attempt(node, "served", result.tokens - sent_before))
                    self._on_outcome(node, True)
                    result.done = True
                    result.final = end  # [DONE] unless it went out with the last events
                    return result
            except (httpx.HTTPError, _Broken) as exc:
                why = exc.why if isinstance(exc, _Broken) else _why(exc)
                result.attempts.append(
                    Attempt(node, ("broken: " if started else "refused: ") + why)
                )
                self._on_outcome(node, False)
                if isinstance(exc, _Broken):
                    if exc.text is None:
                        result.final = error_event(
                            f"the stream broke ({why}) after an event that is not JSON, so it"
                            " cannot be continued elsewhere. Retry the request."
                        )
                        return result
                    streamed += exc.text
                    result.tokens = sent_before + exc.tokens
        if not started:
            await start(0, "", None)
            return result
        result.final = error_event(
            "the stream broke and no other node could continue it: "
            + "; ".join(f"{a.node[:12]} {a.outcome}" for a in result.attempts)
            + ". Retry the request."
        )
        return result

    @staticmethod
    def _take(whole: bytes, chat: bool, out: list[bytes]) -> tuple[int, bool]:
        """Queue the whole events `whole` on `out` (not [DONE]): (tokens, whether the
        upstream said it is done). Raises `_Broken` on a bad event.

        The usual batch (plain tokens) is only scanned (`scan_batch`); the rest is
        decoded event by event.
        """
        tokens = scan_batch(whole, chat)
        if tokens is not None:
            out.append(whole)
            return tokens, False
        tokens, done = 0, False
        for ev in split_events(whole):
            payload = event_data(ev)
            if payload is None:
                continue
            if payload.strip() == "[DONE]":
                done = True
                continue
            try:
                parsed = json.loads(payload)
            except ValueError:
                raise _Broken("the engine sent an event that is not JSON") from None
            if isinstance(parsed, dict) and "error" in parsed:
                raise _Broken("the engine sent an error event")
            piece, fin = chunk_text(parsed, chat)
            done = done or fin
            tokens += bool(piece)
            out.append(ev)
        return tokens, done


class _Pump:
    """One node's streamed response: a reader task that queues the raw chunks, and a
    consumer that passes them on in batches, watching for a stall or the node's death.
    The two share this state: the stall clock, the raw events sent (decoded only at
    failover), and the held-back end.

    The first chunk is read by the consumer itself (`_read_first`), so that the first
    token is not handed over between tasks; a watcher task cancels that read if the
    node dies or stalls meanwhile. The reader task takes over from the second chunk."""

    def __init__(
        self,
        relay: Relay,
        node: str,
        response: httpx.Response,
        chat: bool,
        emit: Emit,
        result: StreamResult,
        alive: bool,
    ) -> None:
        self._relay = relay
        self._node = node
        self._response = response
        self._chat = chat
        self._emit = emit
        self._result = result
        self._chunks_in, self._chunks_out = trio.open_memory_channel[bytes | BaseException](64)
        self._feed = SseSplitter().feed_whole
        self._take = relay._take
        self._sent: list[bytes] = []  # the raw events forwarded, decoded only at failover
        self._stall = relay.gaps.stall_timeout(relay._stall)
        self._first = result.tokens
        #: Alive when its attempt began; else a suspect tried as the last resort.
        self._started_alive = alive
        self._last = 0.0  # when the last token (or the end) came
        #: The first chunk, or an end (b"") or an error seen behind a batch: handled
        #: next, before anything else is received.
        self._pending: bytes | BaseException | None = None
        self._finished = False  # the upstream said it is done
        self._said_done = False  # our [DONE] went out (with the upstream's last events)

    async def run(self) -> bytes:
        """Pass the response's events to `emit` until it finishes. Returns what is
        left for the end of the answer: nothing when our [DONE] went out with the
        upstream's last events, else [DONE] (the upstream finished without one).

        Raises:
            _Broken: when the node fails mid-stream, with the text it had sent.
        """
        outcome: bytes | _Broken
        self._last = trio.current_time()
        chunks = aiter(self._response.aiter_raw())
        async with trio.open_nursery() as nursery:
            try:
                first = await self._read_first(chunks, nursery)
                if isinstance(first, bytes) and first:
                    nursery.start_soon(self._read, chunks)
                else:
                    self._chunks_in.close()  # the end, or an error: nothing more to read
                self._pending = first
                outcome = await self._consume()
            except _Broken as exc:
                outcome = exc
            nursery.cancel_scope.cancel()
        if isinstance(outcome, _Broken):
            raise outcome
        return outcome

    async def _read_first(
        self, chunks: AsyncIterator[bytes], nursery: trio.Nursery
    ) -> bytes | BaseException:
        """The first chunk (b"": the stream ended; or the error that ended it), read
        here. Meanwhile a watcher task does `_consume`'s watch: it cancels the read and
        raises here when the node dies or stalls (the connection is given up with it)."""
        broken: list[_Broken] = []
        read, watching = trio.CancelScope(), trio.CancelScope()

        async def watch() -> None:
            with watching:
                while True:
                    await trio.sleep(WATCH_INTERVAL)
                    try:
                        self._watch()
                    except _Broken as exc:
                        broken.append(exc)
                        read.cancel()
                        return

        nursery.start_soon(watch)
        item: bytes | BaseException = b""
        with read:
            try:
                item = await anext(chunks)
            except StopAsyncIteration:
                pass
            except (httpx.HTTPError, trio.BrokenResourceError) as exc:
                item = exc
        watching.cancel()
        if read.cancelled_caught:
            raise broken[0]
        return item

    async def _read(self, chunks: AsyncIterator[bytes]) -> None:
        """Queue the response's raw chunks after the first, then the error that ended
        it, if any."""
        chunks_in = self._chunks_in
        async with chunks_in:
            try:
                async for chunk in chunks:
                    # No checkpoint while httpx hands out chunks it already has, so
                    # that the consumer takes them all in one write.
                    try:
                        chunks_in.send_nowait(chunk)
                    except trio.WouldBlock:
                        await chunks_in.send(chunk)
            except (httpx.HTTPError, trio.BrokenResourceError) as exc:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await chunks_in.send(exc)

    def _broken(self, why: str) -> _Broken:
        recovered = recover_text(self._sent, self._chat)
        if recovered is None:
            return _Broken(why, None)
        return _Broken(why, *recovered)

    async def _consume(self) -> bytes:
        """Pass the chunks on, batch by batch, until the end: what is left for it."""
        chunks_out, emit = self._chunks_out, self._emit
        while True:
            item, self._pending = self._pending, None
            while item is None:
                with trio.move_on_after(WATCH_INTERVAL):
                    try:
                        item = await chunks_out.receive()
                    except trio.EndOfChannel:
                        item = b""
                        break
                if item is None:
                    self._watch()
            if isinstance(item, BaseException) or item == b"":
                if self._finished:
                    return b"" if self._said_done else DONE
                if item == b"":
                    raise self._broken("connection closed before the end of the stream")
                raise self._broken(f"connection lost ({type(item).__name__})")
            try:
                data = self._batch(self._gather(item))
            except _BrokenAfter as exc:
                await emit(exc.data)
                raise exc.broken from None
            if data is not None:
                await emit(data)

    def _watch(self) -> None:
        """Raises `_Broken` when the node is no longer alive or has stalled (called
        every `WATCH_INTERVAL` without a chunk)."""
        relay = self._relay
        if self._started_alive:
            if not relay._alive(self._node):
                raise self._broken("the node is no longer alive (membership)")
        elif relay._gone is not None and relay._gone(self._node):
            raise self._broken("the node is gone (membership)")
        limit = (
            self._stall
            if self._result.tokens > self._first
            else max(self._stall, self._relay.first_token_timeout)
        )
        if trio.current_time() - self._last > limit:
            raise self._broken(f"no token for {limit:.1f} s (stall)")

    def _gather(self, item: bytes) -> bytes:
        """`item` and whatever else has already arrived, as one batch that goes out
        in one write; an end or error met behind them waits in `_pending`."""
        parts = [item]
        chunks_out = self._chunks_out
        while self._pending is None:
            try:
                more = chunks_out.receive_nowait()
            except trio.WouldBlock:
                break
            except trio.EndOfChannel:
                self._pending = b""
                break
            if isinstance(more, bytes) and more:
                parts.append(more)
            else:
                self._pending = more
        return b"".join(parts) if len(parts) > 1 else item

    def _batch(self, batch: bytes) -> bytes | None:
        """The whole events of `batch` to emit now (None: none), with our [DONE] when
        the batch held the upstream's, its tokens counted and the gap since the last
        ones timed.

        Raises:
            _Broken: on a bad event or an event over the splitter's limit.
            _BrokenAfter: on a bad event after good ones, which go out first.
        """
        out: list[bytes] = []
        try:
            whole = self._feed(batch)
            tokens, done = self._take(whole, self._chat, out) if whole else (0, False)
        except ValueError as exc:  # the splitter's size limit
            raise self._broken(str(exc)) from None
        except _Broken as exc:
            if out:
                self._sent.append(b"".join(out))
                raise _BrokenAfter(self._sent[-1], self._broken(exc.why)) from None
            raise self._broken(exc.why) from None
        result = self._result
        if tokens:
            now = trio.current_time()
            if result.tokens > self._first:
                self._relay.gaps.add(now - self._last)
            self._last = now
            result.tokens += tokens
        data = None
        if self._said_done:
            pass  # after the upstream's [DONE], nothing more is the client's
        elif done and whole.rstrip().endswith(b"[DONE]"):
            # The end: its events and our one [DONE] go out now, without waiting for the
            # upstream's end of body (one more hop's write and wake-up).
            data = b"".join(out) + DONE
            self._said_done = True
        elif out:
            data = out[0] if len(out) == 1 else b"".join(out)
            self._sent.append(data)
        if done:
            self._finished = True
            self._last = trio.current_time()
        return data
