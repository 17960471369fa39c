"""OpenAI's error shape, which every error of the public API uses (clients parse it)."""

from __future__ import annotations

from typing import Any

__all__ = ["openai_error"]


def openai_error(
    message: str, kind: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """``{"error": {...}}`` as OpenAI answers; `message` says what to do, `param` names
    the request field at fault (``messages[0].role``), if one is."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
