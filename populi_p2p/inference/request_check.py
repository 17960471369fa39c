"""The check of an OpenAI request before it is routed.

A client's mistake (``"stream": "false"``, ``"max_tokens": "abc"``) is the client's
answer: a 400 with OpenAI's ``invalid_request_error`` shape that names the field and
says what it should be. Unchecked, the request reaches the engines, which fail on it
or read it their own way (a string ``"false"`` is truthy here, false to the engine),
and each node tried would count as broken.

What is checked is what OpenAI's API reference documents for the fields below: their
JSON types and ranges, ``messages`` or ``prompt`` present, ``n`` 1 and one prompt
(populi relays one choice, `relay.Relay`). null is accepted wherever OpenAI accepts it (the engine's
default). Fields not listed (an engine's extensions) pass through unchecked. Pure:
no I/O, no clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from .openai_errors import openai_error

__all__ = ["MAX_TOKENS_LIMIT", "ROLES", "InvalidRequest", "check_request"]

#: The roles a chat message may have (OpenAI's, ``function`` included: deprecated).
ROLES: Final = ("system", "developer", "user", "assistant", "tool", "function")
#: The largest ``max_tokens`` taken: engines hold it in 32 bits.
MAX_TOKENS_LIMIT: Final = 2**31 - 1
_INT64: Final = 2**63
_SHOWN_CHARS: Final = 40
_MISSING: Final = object()


class InvalidRequest(ValueError):
    """The client's mistake: `param` is the field (``messages[0].role``); the message
    says what it should be."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message

    def body(self) -> dict[str, Any]:
        """The 400's body, in OpenAI's shape."""
        return openai_error(self.message, "invalid_request_error", None, self.param)


@attrs.frozen
class _Rule:
    """What a field should be (said to the client) and the test of it."""

    should: str
    accepts: Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    if _is_int(value):
        return True
    return isinstance(value, float) and math.isfinite(value)


def _integer(low: int, high: int, should: str) -> _Rule:
    return _Rule(should, lambda v: _is_int(v) and low <= v <= high)


def _number(low: float, high: float) -> _Rule:
    return _Rule(f"a number from {low:g} to {high:g}", lambda v: _is_number(v) and low <= v <= high)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(s, str) for s in value)


_BOOLEAN: Final = _Rule("true or false (a JSON boolean)", lambda v: isinstance(v, bool))
_STRING: Final = _Rule("a string", lambda v: isinstance(v, str))
_OBJECT: Final = _Rule("an object", lambda v: isinstance(v, dict))
_MAX_TOKENS: Final = _integer(1, MAX_TOKENS_LIMIT, f"a positive integer up to {MAX_TOKENS_LIMIT}")

#: Fields of both endpoints, checked in this order (the first mistake is answered).
_COMMON: Final[Mapping[str, _Rule]] = {
    "stream": _BOOLEAN,
    "stream_options": _Rule(
        'an object such as {"include_usage": true}',
        lambda v: isinstance(v, dict) and isinstance(v.get("include_usage", False), bool),
    ),
    "max_tokens": _MAX_TOKENS,
    "n": _integer(1, 1, "1 (populi relays one choice per request: send one request per choice)"),
    "temperature": _number(0, 2),
    "top_p": _number(0, 1),
    "presence_penalty": _number(-2, 2),
    "frequency_penalty": _number(-2, 2),
    "stop": _Rule("a string or an array of strings", lambda v: isinstance(v, str) or _strings(v)),
    "seed": _integer(-_INT64, _INT64 - 1, "an integer (64-bit)"),
    "user": _STRING,
    "logit_bias": _Rule(
        "an object of token ids to numbers from -100 to 100",
        lambda v: (
            isinstance(v, dict) and all(_is_number(x) and -100 <= x <= 100 for x in v.values())
        ),
    ),
    # Extensions of llama.cpp's and vLLM's servers that clients commonly send.
    "top_k": _integer(-_INT64, _INT64 - 1, "an integer"),
    "min_p": _number(0, 1),
}
_CHAT: Final[Mapping[str, _Rule]] = {
    "max_completion_tokens": _MAX_TOKENS,
    "logprobs": _BOOLEAN,
    "top_logprobs": _integer(0, 20, "an integer from 0 to 20"),
    "response_format": _Rule(
        'an object with a "type" ("text", "json_object", "json_schema")',
        lambda v: isinstance(v, dict) and isinstance(v.get("type"), str),
    ),
    "tools": _Rule(
        "an array of objects", lambda v: isinstance(v, list) and all(isinstance(t, dict) for t in v)
    ),
    "tool_choice": _Rule(
        '"none", "auto", "required" or an object', lambda v: isinstance(v, (str, dict))
    ),
    "parallel_tool_calls": _BOOLEAN,
}
_COMPLETION: Final[Mapping[str, _Rule]] = {
    "logprobs": _integer(0, 5, "an integer from 0 to 5"),
    "echo": _BOOLEAN,
    "suffix": _STRING,
    "best_of": _integer(1, 20, "an integer from 1 to 20"),
}


def describe(value: Any) -> str:
    """`value` as the client sent it, short (for "must be X, not <this>")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        shown = json.dumps(value[:_SHOWN_CHARS]) + ("..." if len(value) > _SHOWN_CHARS else "")
        return f"the string {shown}"
    if isinstance(value, int):
        return str(value) if value.bit_length() < 64 else f"a {value.bit_length()}-bit integer"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return f"an array of {len(value)} items" if value else "an empty array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _wrong(param: str, should: str, value: Any) -> InvalidRequest:
    if value is _MISSING:
        return InvalidRequest(param, f"{param} is required: {should}")
    return InvalidRequest(param, f"{param} must be {should}, not {describe(value)}")


def _check_content(where: str, role: str, message: Mapping[str, Any]) -> None:
    content = message.get("content", _MISSING)
    if content is _MISSING or content is None:
        if role in ("assistant", "function"):  # an assistant's tool calls carry no text
            return
        raise _wrong(f"{where}.content", "a string or an array of content parts", content)
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not all(
        isinstance(part, dict) and isinstance(part.get("type"), str) for part in content
    ):
        raise _wrong(
            f"{where}.content",
            'a string or an array of content parts (objects with a "type")',
            content,
        )


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise _wrong("messages", 'a non-empty array of {"role", "content"} objects', messages)
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _wrong(where, 'an object with "role" and "content"', message)
        role = message.get("role", _MISSING)
        if not isinstance(role, str) or role not in ROLES:
            raise _wrong(f"{where}.role", "one of " + ", ".join(ROLES), role)
        _check_content(where, role, message)
        name = message.get("name")
        if name is not None and not isinstance(name, str):
            raise _wrong(f"{where}.name", "a string", name)


def _is_tokens(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(_is_int(t) and 0 <= t <= MAX_TOKENS_LIMIT for t in value)
    )


def _check_prompt(prompt: Any) -> None:
    # OpenAI takes an array of prompts too, each its own choice: populi relays one.
    if isinstance(prompt, str) or _is_tokens(prompt):
        return
    if (
        isinstance(prompt, list)
        and len(prompt) == 1
        and (isinstance(prompt[0], str) or _is_tokens(prompt[0]))
    ):
        return
    raise _wrong(
        "prompt",
        "a string or an array of token ids (one prompt: populi relays one choice per request)",
        prompt,
    )


def check_request(request: Mapping[str, Any], chat: bool) -> None:
    """Check `request` (a decoded JSON object) for ``/v1/chat/completions`` (`chat`) or
    ``/v1/completions``.

    Raises:
        InvalidRequest: the first field that is missing or not what OpenAI documents.
    """
    if chat:
        _check_messages(request.get("messages", _MISSING))
    else:
        _check_prompt(request.get("prompt", _MISSING))
    for rules in (_COMMON, _CHAT if chat else _COMPLETION):
        for field, rule in rules.items():
            value = request.get(field)
            if value is not None and not rule.accepts(value):
                raise _wrong(field, rule.should, value)
    if request.get("stream_options") is not None and request.get("stream") is not True:
        raise InvalidRequest("stream_options", 'stream_options is allowed only with "stream": true')
