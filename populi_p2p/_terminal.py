"""Terminal-safe text: what the CLI prints cannot drive the terminal it is printed on.

Most of what the CLI shows was written by someone else: a member's signed name and
labels, a task's command and output, a log event's message. Records are validated on
decode (`record._check_text`), but the CLI does not rely on that: every table cell and
every line that carries such text goes through `terminal_safe`, which writes a control,
format or separator character (an escape, a newline, a bidi override, U+2028) as its
Python escape (``\\x1b``, ``\\n``, ``\\u202e``). A hostile name then shows as text, on
its own row, and cannot move the cursor or forge another row.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_table", "terminal_safe"]


def terminal_safe(value: object, *, keep_newlines: bool = False) -> str:
    """`value` as text with every non-printable character escaped.

    Args:
        value: anything; shown as ``str(value)``.
        keep_newlines: keep ``\\n`` (for multi-line text such as a task's output);
            everything else that is not printable is still escaped, ``\\r`` included.
    """
    text = str(value)
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or (keep_newlines and c == "\n") else _escape(c) for c in text
    )


def _escape(char: str) -> str:
    escaped = repr(char)[1:-1]
    # repr leaves some non-printable characters as they are (none today); never pass one.
    return escaped if escaped.isprintable() else f"\\u{ord(char):04x}"


def format_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Columns padded to their widest cell, every cell made terminal-safe first, so a
    cell can neither start a row of its own nor shift the columns after it."""
    cells = [[terminal_safe(c) for c in row] for row in [header, *rows]]
    widths = [max(len(c) for c in column) for column in zip(*cells, strict=False)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()
             for row in cells]  # fmt: skip
    return "\n".join(lines)
