"""`populi_p2p._log`: one ``event key=value`` line per event, splittable by machines
and readable by eye."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import pytest

from populi_p2p._log import configure_logging, event, format_fields, get_logger

LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (\w+) +(.*)")


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = get_logger()
    handlers, level, propagate = list(root.handlers), root.level, root.propagate
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    root.propagate = propagate


def test_fields_are_quoted_only_when_they_must_be() -> None:
    assert format_fields({"a": 1, "b": "x y", "c": None, "d": "", "e": 'q"=\\'}) == (
        'a=1 b="x y" d="" e="q\\"=\\\\"'
    )
    assert format_fields({"m": "two\nlines"}) == 'm="two\\nlines"'


def test_loggers_are_children_of_populi() -> None:
    assert get_logger().name == "populi"
    assert get_logger("node").name == "populi.node"


@pytest.mark.usefixtures("restore_root")
def test_a_configured_event_is_one_line_with_its_fields() -> None:
    stream = io.StringIO()
    configure_logging("info", stream)
    event(get_logger("t"), logging.INFO, "member.joined", name="a b", id=7, gone=None)
    event(get_logger("t"), logging.DEBUG, "member.debug", x=1)  # below the level
    [line] = stream.getvalue().splitlines()
    match = LINE.fullmatch(line)
    assert match is not None, line
    assert match.groups() == ("INFO", 'member.joined name="a b" id=7')


@pytest.mark.usefixtures("restore_root")
def test_configuring_again_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", first)
    configure_logging("WARNING", second)
    event(get_logger(), logging.WARNING, "w")
    event(get_logger(), logging.INFO, "i")
    assert first.getvalue() == ""
    assert [LINE.fullmatch(x).group(2) for x in second.getvalue().splitlines()] == ["w"]  # type: ignore[union-attr]
    assert get_logger().propagate is False


@pytest.mark.usefixtures("restore_root")
def test_an_exception_follows_its_line() -> None:
    stream = io.StringIO()
    configure_logging("debug", stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger().exception("task.crashed")
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("ERROR task.crashed")
    assert lines[-1] == "RuntimeError: boom"


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level 'loud': use one of debug"):
        configure_logging("loud")


def test_a_disabled_level_formats_nothing() -> None:
    class Exploding:
        def __str__(self) -> str:
            raise AssertionError("formatted")

    logger = get_logger("quiet")
    logger.setLevel(logging.ERROR)
    try:
        event(logger, logging.DEBUG, "x", value=Exploding())
    finally:
        logger.setLevel(logging.NOTSET)
