"""`populi_p2p._terminal`: text from others cannot drive the terminal, nor forge a
row or shift a column of a table."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from populi_p2p._terminal import format_table, terminal_safe


def test_printable_text_is_unchanged() -> None:
    assert terminal_safe("gpu-box-1 ü 漢") == "gpu-box-1 ü 漢"
    assert terminal_safe(42) == "42"


def test_controls_format_and_separators_are_escaped() -> None:
    assert terminal_safe("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert terminal_safe("x\ny\r") == "x\\ny\\r"
    assert terminal_safe("\u202eevil") == "\\u202eevil"  # bidi override
    assert terminal_safe("a\u2028b") == "a\\u2028b"  # line separator


def test_newlines_may_be_kept_but_nothing_else() -> None:
    assert terminal_safe("a\nb\r\x1b", keep_newlines=True) == "a\nb\\r\\x1b"


@given(st.text())
def test_the_result_is_always_printable(text: str) -> None:
    assert terminal_safe(text).isprintable()
    assert terminal_safe(text, keep_newlines=True).replace("\n", "").isprintable()


def test_a_table_pads_columns_to_the_widest_cell() -> None:
    table = format_table([("a", 1), ("long-name", 22)], ("NAME", "N"))
    assert table.splitlines() == ["NAME       N", "a          1", "long-name  22"]


def test_a_hostile_cell_stays_on_its_row() -> None:
    table = format_table([("evil\nforged 0", "x")], ("NAME", "V"))
    lines = table.splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("evil\\nforged 0")
