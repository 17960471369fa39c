"""`services.errors`: a failed start-up becomes one line with its cause and fix."""

from __future__ import annotations

import errno
import os

import pytest

from populi_p2p.services.errors import (
    NodeStartError,
    describe_os_error,
    first_os_error,
    start_error,
)


@pytest.mark.parametrize(
    ("code", "line"),
    [
        (errno.EROFS, "state dir /s is on a read-only file system (FIX)"),
        (errno.ENOSPC, "no space left for state dir /s: the disk is full (free some space, FIX)"),
        (errno.EDQUOT, "no space left for state dir /s: the disk is full (free some space, FIX)"),
        (errno.EACCES, "no permission to write state dir /s (FIX)"),
        (errno.EPERM, "no permission to write state dir /s (FIX)"),
        (errno.ENAMETOOLONG, "cannot use state dir /s: File name too long (FIX)"),
    ],
)
def test_describe_os_error_names_the_cause(code: int, line: str) -> None:
    exc = OSError(code, os.strerror(code))
    assert describe_os_error(exc, "state dir /s", "FIX") == line


def test_an_os_error_without_strerror_is_named_by_its_type() -> None:
    assert describe_os_error(FileExistsError(), "x", "FIX") == "cannot use x: FileExistsError (FIX)"


def test_first_os_error_finds_a_leaf_breadth_first() -> None:
    inner = PermissionError(errno.EACCES, "denied")
    outer = ConnectionRefusedError(errno.ECONNREFUSED, "refused")
    group = BaseExceptionGroup("start", [ValueError("x"), ExceptionGroup("inner", [inner]), outer])
    assert first_os_error(group) is outer
    assert first_os_error(inner) is inner
    assert first_os_error(ValueError("x")) is None


def test_start_error_prefers_a_services_own_line() -> None:
    mine = NodeStartError("cannot listen on 0.0.0.0 port 7946: in use (pick one with --port)")
    group = BaseExceptionGroup(
        "start", [OSError(errno.EADDRINUSE, "in use"), ExceptionGroup("x", [mine])]
    )
    assert start_error(group) is mine


def test_start_error_turns_a_librarys_os_error_into_one_line() -> None:
    group = BaseExceptionGroup("start", [ExceptionGroup("x", [OSError(errno.EACCES, "denied")])])
    error = start_error(group)
    assert isinstance(error, NodeStartError)
    assert str(error) == "no permission to write start-up (check --state-dir, --bind and --port)"


def test_start_error_leaves_a_bug_to_propagate() -> None:
    assert start_error(BaseExceptionGroup("start", [KeyError("bug")])) is None
