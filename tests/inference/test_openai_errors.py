"""`openai_error`: OpenAI's error shape, which clients parse."""

from __future__ import annotations

from populi_p2p.inference.openai_errors import openai_error


def test_the_shape_clients_parse() -> None:
    assert openai_error("say what to do", "invalid_request_error") == {
        "error": {
            "message": "say what to do",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    body = openai_error("bad role", "invalid_request_error", "bad_role", "messages[0].role")
    assert body["error"]["code"] == "bad_role" and body["error"]["param"] == "messages[0].role"
