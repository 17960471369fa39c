"""Server-sent events as the OpenAI streaming API uses them, and the continuation
request that resumes a broken stream on another node. Pure functions.

A stream is ``data: {json}\\n\\n`` events ending with ``data: [DONE]\\n\\n``. The relay
passes each event through as it comes, keeps the text it carried, and holds back the
upstream's ``[DONE]`` so that the client sees exactly one, after the last node.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Final

__all__ = ["DONE", "SseSplitter", "chunk_text", "continuation", "error_event", "event_data"]

DONE: Final = b"data: [DONE]\n\n"
#: The longest single event the splitter buffers (a hostile upstream cannot make it
#: hold more).
MAX_EVENT: Final = 1 << 20


class SseSplitter:
    """Cuts a byte stream into whole events (``\\n\\n``-terminated; ``\\r\\n`` accepted)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The whole events completed by `data`. Raises ValueError past `MAX_EVENT`."""
        self._buffer += data.replace(b"\r\n", b"\n")
        events = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                break
            events.append(self._buffer[: end + 2])
            self._buffer = self._buffer[end + 2 :]
        if len(self._buffer) > MAX_EVENT:
            raise ValueError("an upstream event is over the size limit")
        return events


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
