"""The check of an OpenAI request before routing (`request_check`), a pure function: the
issue's bad requests each name their field; well-formed requests (OpenAI's documented
forms) pass; any JSON value in any checked field is accepted or refused with that field
named, and never raises anything else."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.inference.request_check import (
    MAX_TOKENS_LIMIT,
    InvalidRequest,
    check_request,
    describe,
)

CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION: dict[str, Any] = {"model": "m", "prompt": "once upon"}

#: Every top-level field the check knows, for the property below.
FIELDS = (
    "stream", "stream_options", "max_tokens", "n", "temperature", "top_p",
    "presence_penalty", "frequency_penalty", "stop", "seed", "user", "logit_bias",
    "top_k", "min_p", "max_completion_tokens", "logprobs", "top_logprobs",
    "response_format", "tools", "tool_choice", "parallel_tool_calls", "echo", "suffix",
    "best_of",
)  # fmt: skip

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


def refused(request: dict[str, Any], chat: bool = True) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        check_request(request, chat)
    return caught.value


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"stream": "false"}, "stream", 'true or false (a JSON boolean), not the string "false"'),
        ({"max_tokens": "abc"}, "max_tokens", 'integer up to 2147483647, not the string "abc"'),
        ({"temperature": "hot"}, "temperature", 'a number from 0 to 2, not the string "hot"'),
        ({"max_tokens": 0}, "max_tokens", "not 0"),
        ({"max_tokens": True}, "max_tokens", "not true"),
        ({"max_tokens": 1.5}, "max_tokens", "not 1.5"),
        ({"max_tokens": MAX_TOKENS_LIMIT + 1}, "max_tokens", f"not {MAX_TOKENS_LIMIT + 1}"),
        ({"n": 2}, "n", "must be 1 (populi relays one choice per request"),
        ({"temperature": 2.5}, "temperature", "not 2.5"),
        ({"temperature": math.nan}, "temperature", "not nan"),
        ({"top_p": -0.1}, "top_p", "must be a number from 0 to 1"),
        ({"stop": ["a", 1]}, "stop", "or an array of strings, not an array of 2 items"),
        ({"stream_options": {}}, "stream_options", 'allowed only with "stream": true'),
        ({"messages": []}, "messages", "not an empty array"),
        ({"messages": "hi"}, "messages", 'not the string "hi"'),
        ({"messages": [{"role": "usr"}]}, "messages[0].role", 'not the string "usr"'),
        ({"messages": [{"content": "x"}]}, "messages[0].role", "is required: one of system"),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "is required"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "not 5"),
        ({"logprobs": 3}, "logprobs", "must be true or false"),
    ],
)  # fmt: skip
def test_the_issues_requests_and_their_kin_name_the_field(
    extra: dict[str, Any], param: str, says: str
) -> None:
    error = refused({**CHAT, **extra})
    assert error.param == param
    assert str(error).startswith(param) and says in str(error), str(error)
    assert error.body() == {"error": {
        "message": str(error), "type": "invalid_request_error", "param": param, "code": None,
    }}  # fmt: skip


def test_a_missing_messages_or_prompt_is_named() -> None:
    assert refused({"model": "m"}).message.startswith("messages is required: a non-empty array")
    error = refused({"model": "m"}, chat=False)
    assert error.param == "prompt" and error.message.startswith("prompt is required")
    for many in (["a", "b"], [[1], [2]]):
        assert refused({"model": "m", "prompt": many}, chat=False).param == "prompt"
    # Completions' own fields are checked there, chat's there.
    assert refused({**COMPLETION, "logprobs": True}, chat=False).param == "logprobs"
    assert refused({**COMPLETION, "echo": "yes"}, chat=False).param == "echo"


def test_openais_documented_forms_pass() -> None:
    check_request({
        **CHAT,
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "system", "content": "you count"},
            {"role": "user", "name": "ann", "content": [{"type": "text", "text": "count"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            {"role": "tool", "content": "3", "tool_call_id": "1"},
        ],
        "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 16,
        "max_completion_tokens": 16, "n": 1, "temperature": 0, "top_p": 1.0,
        "presence_penalty": -2, "frequency_penalty": 2.0, "stop": ["\n", "END"], "seed": -1,
        "user": "u1", "logit_bias": {"50256": -100}, "logprobs": True, "top_logprobs": 20,
        "response_format": {"type": "json_object"}, "tools": [{"type": "function"}],
        "tool_choice": "auto", "parallel_tool_calls": False, "top_k": 40, "min_p": 0.05,
        "continue_final_message": True, "repeat_penalty": 1.1,  # extensions pass
    }, chat=True)  # fmt: skip
    for prompt in ("", "x", ["x"], [1, 2, 3], [[1, 2]]):
        check_request({**COMPLETION, "prompt": prompt, "echo": False, "suffix": "!",
                       "logprobs": 5, "best_of": 1, "stop": "\n"}, chat=False)  # fmt: skip
    # null is the engine's default wherever OpenAI takes it.
    check_request({**CHAT, **dict.fromkeys(FIELDS)}, chat=True)


@given(field=st.sampled_from(FIELDS), value=json_values, chat=st.booleans())
def test_any_value_in_a_field_is_taken_or_refused_naming_that_field(
    field: str, value: Any, chat: bool
) -> None:
    request = {**(CHAT if chat else COMPLETION), field: value}
    if field == "stream_options":
        request["stream"] = True
    try:
        check_request(request, chat)
    except InvalidRequest as exc:
        assert exc.param == field
        assert exc.message.startswith(field + " must be ")
        assert len(exc.message) < 300  # one line, with the value cut short


@given(messages=json_values)
def test_any_messages_value_is_taken_or_refused_naming_where(messages: Any) -> None:
    try:
        check_request({"model": "m", "messages": messages}, chat=True)
    except InvalidRequest as exc:
        assert exc.param.startswith("messages")
    else:
        assert isinstance(messages, list) and messages
        assert all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)


@given(value=json_values | st.integers(min_value=-(2**70), max_value=2**70))
def test_stream_and_max_tokens_take_exactly_their_type(value: Any) -> None:
    def accepts(field: str) -> bool:
        try:
            check_request({**CHAT, field: value}, chat=True)
        except InvalidRequest:
            return False
        return True

    assert accepts("stream") == (value is None or isinstance(value, bool))
    is_count = isinstance(value, int) and not isinstance(value, bool)
    assert accepts("max_tokens") == (value is None or (is_count and 1 <= value <= MAX_TOKENS_LIMIT))
    is_number = is_count or (isinstance(value, float) and math.isfinite(value))
    assert accepts("temperature") == (value is None or (is_number and 0 <= value <= 2))


@given(
    stream=st.booleans(),
    max_tokens=st.integers(1, MAX_TOKENS_LIMIT),
    temperature=st.floats(0, 2),
    top_p=st.floats(0, 1),
    stop=st.text() | st.lists(st.text(), max_size=4),
    content=st.text() | st.lists(st.fixed_dictionaries({"type": st.just("text"),
                                                        "text": st.text()}), min_size=1),
)  # fmt: skip
def test_well_formed_requests_pass(
    stream: bool, max_tokens: int, temperature: float, top_p: float, stop: Any, content: Any
) -> None:
    check_request({"model": "m", "messages": [{"role": "user", "content": content}],
                   "stream": stream, "max_tokens": max_tokens, "temperature": temperature,
                   "top_p": top_p, "stop": stop, "n": 1}, chat=True)  # fmt: skip


def test_the_value_shown_is_short_and_safe() -> None:
    assert describe("x" * 100) == 'the string "' + "x" * 40 + '"...'
    assert describe("\x1b[2J") == 'the string "\\u001b[2J"'  # no terminal escape
    assert describe(10**5000) == "a 16610-bit integer"  # never str() of a huge int
    assert describe([]) == "an empty array" and describe({"a": 1}) == "an object"
