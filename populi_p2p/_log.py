"""Structured, readable logs: one line per event, ``event key=value ...``.

Why not JSON: the daemon runs in a terminal or under systemd, and an operator reads its
log with their eyes first. Each line is still machine-splittable: a fixed timestamp and
level, an event name with no spaces (``member.dead``), then ``key=value`` pairs whose
values are quoted only when they contain spaces, quotes or ``=``. So
``grep 'member\\.' daemon.log`` shows every membership change, one line each, and
``awk`` or a log shipper can split the fields.

Everything logs through the standard `logging` module under the ``populi`` logger, so
tests can capture it with ``caplog`` and embedders can route it elsewhere.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Final, TextIO

__all__ = ["LOG_LEVELS", "configure_logging", "event", "format_fields", "get_logger"]

#: The names `--log-level` accepts, quietest last.
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
#: Root of every populi logger.
ROOT_LOGGER: Final = "populi"
#: Attribute on a LogRecord holding the structured fields.
_FIELDS_ATTR: Final = "populi_fields"


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\\\n\t'):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    return text


def format_fields(fields: dict[str, object]) -> str:
    """Render ``key=value`` pairs in the given order, skipping None values."""
    return " ".join(f"{k}={_quote(v)}" for k, v in fields.items() if v is not None)


class _Formatter(logging.Formatter):
    """``2025-01-31T12:00:00.123Z INFO  member.joined name=a id=... addr=...``."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        millis = int(record.msecs)
        fields = getattr(record, _FIELDS_ATTR, None)
        message = record.getMessage()
        if fields:
            message = f"{message} {format_fields(fields)}"
        line = f"{stamp}.{millis:03d}Z {record.levelname:<5} {message}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def get_logger(name: str = "") -> logging.Logger:
    """The ``populi`` logger or one of its children (``populi.node``, ...)."""
    return logging.getLogger(f"{ROOT_LOGGER}.{name}" if name else ROOT_LOGGER)


def event(logger: logging.Logger, level: int, what: str, /, **fields: object) -> None:
    """Log one structured event: `what` is dotted with no spaces, `fields` become key=value.

    Cheap when the level is disabled: nothing is formatted.
    """
    if logger.isEnabledFor(level):
        logger.log(level, what, extra={_FIELDS_ATTR: fields})


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Send populi's logs to `stream` (stderr by default) at `level`.

    Idempotent: calling it again replaces the handler instead of adding a second one.

    Raises:
        ValueError: `level` is not one of `LOG_LEVELS`.
    """
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}: use one of {', '.join(LOG_LEVELS)}")
    root = get_logger()
    for handler in list(root.handlers):
        if getattr(handler, "_populi", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(_Formatter())
    handler._populi = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
