"""The one error a service may raise out of the node's start-up."""

from __future__ import annotations

__all__ = ["NodeStartError"]


class NodeStartError(Exception):
    """The daemon cannot start; the message is one line with the cause and the fix."""
