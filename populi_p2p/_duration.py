"""Durations as people type them on the command line (``90d``, ``12h``, ``1d12h``)."""

from __future__ import annotations

import re

__all__ = ["parse_duration"]

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdwy]?)")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def parse_duration(text: str) -> float:
    """Parse ``90``, ``45s``, ``30m``, ``12h``, ``30d``, ``2w``, ``1y`` or ``1d12h``, in seconds.

    Raises:
        ValueError: one line naming the input.
    """
    text = text.strip().lower()
    pos, total = 0, 0.0
    while pos < len(text):
        match = _DURATION_RE.match(text, pos)
        if match is None or match.end() == pos:
            break
        total += float(match[1]) * _DURATION_UNITS[match[2]]
        pos = match.end()
    if not text or pos != len(text) or total <= 0:
        raise ValueError(
            f"invalid duration {text!r}: expected a positive number with a unit,"
            " like 90d, 12h or 1y"
        )
    return total
