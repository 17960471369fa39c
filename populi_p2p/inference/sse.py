"""Server-sent events as the OpenAI streaming API uses them, and the continuation
request that resumes a broken stream on another node. Pure functions.

A stream is ``data: {json}\\n\\n`` events ending with ``data: [DONE]\\n\\n``. The relay
passes each event through as it comes and holds back the upstream's ``[DONE]`` so that
the client sees exactly one, after the last node.

The hot path decodes nothing: `scan_batch` tells from the bytes alone whether a batch
of whole events is plain tokens (and how many), which is what almost every batch is;
only a batch that may end the stream or carry an error is decoded event by event. The
text already sent is needed only when a node fails mid-stream, so the relay keeps the
raw bytes it forwarded and `recover_text` decodes them then.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from typing import Any, Final

__all__ = [
    "DONE",
    "SseSplitter",
    "chunk_text",
    "continuation",
    "error_event",
    "event_data",
    "recover_text",
    "scan_batch",
]

DONE: Final = b"data: [DONE]\n\n"
#: The longest single event the splitter buffers (a hostile upstream cannot make it
#: hold more).
MAX_EVENT: Final = 1 << 20

# In valid JSON a quote inside a string is escaped, so `"key"` followed by `:` only
# matches a real key.
_FINISH_KEY: Final = re.compile(rb'"finish_reason"\s*:')
_FINISH_NULL: Final = re.compile(rb'"finish_reason"\s*:\s*null')
_CHAT_TOKEN: Final = re.compile(rb'"content"\s*:\s*"(?!")')
_TEXT_TOKEN: Final = re.compile(rb'"text"\s*:\s*"(?!")')


class SseSplitter:
    """Cuts a byte stream into whole events (``\\n\\n``-terminated; ``\\r\\n`` accepted)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed_whole(self, data: bytes) -> bytes:
        """The whole events completed by `data`, as one run of bytes (b"" if none).
        Raises ValueError past `MAX_EVENT`."""
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        buffer = self._buffer + data if self._buffer else data
        end = buffer.rfind(b"\n\n")
        whole, self._buffer = (b"", buffer) if end < 0 else (buffer[: end + 2], buffer[end + 2 :])
        if len(self._buffer) > MAX_EVENT:
            raise ValueError("an upstream event is over the size limit")
        return whole

    def feed(self, data: bytes) -> list[bytes]:
        """The whole events completed by `data`. Raises ValueError past `MAX_EVENT`."""
        return split_events(self.feed_whole(data))


def split_events(whole: bytes) -> list[bytes]:
    """Whole events (each ``\\n\\n``-terminated) cut apart."""
    return [ev + b"\n\n" for ev in whole.split(b"\n\n")[:-1]]


def scan_batch(whole: bytes, chat: bool) -> int | None:
    """How many tokens a run of whole events carries, if it is plain: every event a
    ``data:`` line of a JSON chunk with no finish reason, no error, no ``[DONE]``.
    None when it may be anything else (decode it event by event).

    A token is a chunk whose ``delta.content`` (chat) or ``text`` is a non-empty
    string, as `chunk_text` says; the scan is exact for chunks of one choice.
    """
    events = whole.count(b"\n\n")
    if (
        # Each event one line, ``data: {...}`` (raw newlines cannot occur inside JSON).
        not whole.startswith(b"data: {")
        or whole.count(b"\n") != 2 * events
        or whole.count(b"\n\ndata: {") != events - 1
        or whole.count(b"}\n\n") != events
        or b"[DONE]" in whole
        or b'"error"' in whole
        or len(_FINISH_KEY.findall(whole)) != len(_FINISH_NULL.findall(whole))
    ):
        return None
    return len((_CHAT_TOKEN if chat else _TEXT_TOKEN).findall(whole))


def recover_text(forwarded: Iterable[bytes], chat: bool) -> tuple[str, int] | None:
    """(text, tokens) of events already forwarded, decoded now (at failover).
    None if one of them is not JSON: the text cannot be known."""
    pieces: list[str] = []
    for run in forwarded:
        for event in split_events(run):
            payload = event_data(event)
            if payload is None or payload.strip() == "[DONE]":
                continue
            try:
                piece, _ = chunk_text(json.loads(payload), chat)
            except ValueError:
                return None
            if piece:
                pieces.append(piece)
    return "".join(pieces), len(pieces)


def event_data(event: bytes) -> str | None:
    """The event's data (its ``data:`` lines joined), or None if it has none."""
    lines = [
        line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
    ]
    return b"\n".join(lines).decode("utf-8", "replace") if lines else None


def chunk_text(data: Any, chat: bool) -> tuple[str, bool]:
    """(text this chunk adds, whether it carries a finish reason)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
        return "", False
    choice = choices[0]
    finished = choice.get("finish_reason") is not None
    if chat:
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else None
    else:
        text = choice.get("text")
    return (text if isinstance(text, str) else ""), finished


def continuation(request: dict[str, Any], chat: bool, streamed: str, tokens: int) -> dict[str, Any]:
    """The request that asks another node to continue after `streamed`.

    Chat: an assistant message with the partial text is appended, and the engine is
    asked to continue it (``continue_final_message``; llama.cpp and vLLM honour a final
    assistant message as a prefix). Completions: the text is appended to the prompt.
    ``max_tokens`` shrinks by the `tokens` already sent.
    """
    out = copy.deepcopy(request)
    if chat:
        messages = list(out.get("messages") or [])
        messages.append({"role": "assistant", "content": streamed})
        out["messages"] = messages
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    else:
        out["prompt"] = str(out.get("prompt", "")) + streamed
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(out.get(key), int):
            out[key] = max(1, out[key] - tokens)
    return out


def error_event(message: str, kind: str = "populi_failover") -> bytes:
    """An OpenAI-shaped error as an SSE event (what a broken stream ends with)."""
    body = {"error": {"message": message, "type": kind, "code": None, "param": None}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"
