"""`check_state_dir`: the state dir's refusals as one line each, before anything starts."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from populi_p2p.services import preflight
from populi_p2p.services.errors import NodeStartError
from populi_p2p.services.preflight import UNIX_PATH_MAX, check_state_dir


def test_a_missing_state_dir_is_made_private(tmp_path: Path) -> None:
    state = tmp_path / "a" / "state"
    check_state_dir(state, state / "api.sock")
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert list(state.iterdir()) == []  # the write probe is gone


def test_an_existing_state_dir_keeps_its_mode_and_files(tmp_path: Path) -> None:
    (tmp_path / "leases.sqlite3").write_text("kept")
    tmp_path.chmod(0o750)
    check_state_dir(tmp_path, tmp_path / "api.sock")
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o750
    assert [p.name for p in tmp_path.iterdir()] == ["leases.sqlite3"]


def test_a_socket_path_too_long_for_a_unix_socket(tmp_path: Path) -> None:
    room = UNIX_PATH_MAX - len(f"{tmp_path}//api.sock")  # the name that fills the path
    state = tmp_path / ("d" * (room + 1))
    with pytest.raises(NodeStartError, match=r"is 108 bytes, over the 107-byte limit"):
        check_state_dir(state, state / "api.sock")
    assert not state.exists()  # checked before anything is made
    fits = tmp_path / ("d" * room)
    check_state_dir(fits, fits / "api.sock")


def test_a_file_where_the_state_dir_should_be(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("")
    with pytest.raises(NodeStartError, match="is not a directory"):
        check_state_dir(state, state / "api.sock")


@pytest.mark.parametrize(
    ("code", "says"),
    [(errno.EROFS, "read-only file system"), (errno.ENOSPC, "the disk is full")],
)
def test_a_refused_write_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, says: str
) -> None:
    def refuse(fd: int, data: bytes) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(preflight.os, "write", refuse)
    with pytest.raises(NodeStartError, match=says) as caught:
        check_state_dir(tmp_path, tmp_path / "api.sock")
    assert f"state dir {tmp_path}" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert list(tmp_path.iterdir()) == []  # the probe is removed even so
