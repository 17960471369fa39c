"""A stand-in for `ApiClient`: answers from a table of paths and records every call.

An answer may be a value, a list of values (one per call, the last one repeated), an
exception to raise, or a function of the request body.
"""

from __future__ import annotations

from typing import Any

import pytest

from populi_p2p.api import ApiError


class FakeApi:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, Any]] = []
        self.timeouts: list[float | None] = []
        self._served: dict[str, int] = {}

    def get(self, path: str) -> Any:
        return self._answer("GET", path, None)

    def post(self, path: str, body: Any = None) -> Any:
        return self._answer("POST", path, body)

    def paths(self, method: str | None = None) -> list[str]:
        return [p for m, p, _ in self.calls if method in (None, m)]

    def _answer(self, method: str, path: str, body: Any) -> Any:
        self.calls.append((method, path, body))
        if path not in self.answers:
            raise ApiError(f"no answer for {method} {path}")
        answer = self.answers[path]
        if isinstance(answer, list) and answer and getattr(answer, "sequence", False):
            n = self._served.get(path, 0)
            self._served[path] = n + 1
            answer = answer[min(n, len(answer) - 1)]
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return answer(body)
        return answer


class InTurn(list[Any]):
    """Answers given one per call, in order; the last one repeats."""

    sequence = True


def serve(monkeypatch: pytest.MonkeyPatch, module: Any, answers: dict[str, Any]) -> FakeApi:
    """Make `module._client(args, timeout)` return a `FakeApi` on `answers`."""
    api = FakeApi(answers)

    def client(_args: Any, timeout: float | None = None) -> FakeApi:
        api.timeouts.append(timeout)
        return api

    monkeypatch.setattr(module, "_client", client)
    return api
