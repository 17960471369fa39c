"""The executor's argument checks: every hostile argument is one line, never an exception."""

from __future__ import annotations

import os
import pwd

import pytest
from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.executor._checks import EPOCH_MAX, check_arguments, resolve_task_user

GOOD = ("a1b2-c3_d4", 7, ["GPU-5f1c2a3b-0000-1111-2222-333344445555", "MIG-1:2:3"])


def test_good_arguments_pass() -> None:
    assert check_arguments(*GOOD) is None
    assert check_arguments("x", 0, []) is None
    assert check_arguments("x" * 128, EPOCH_MAX - 1, []) is None


@pytest.mark.parametrize(
    ("task_id", "epoch", "gpus", "says"),
    [
        ("", 1, [], "task id"),
        ("x" * 129, 1, [], "task id"),
        ("../etc", 1, [], "task id"),
        ("a b", 1, [], "task id"),
        (b"abc", 1, [], "task id"),
        ("abc", -1, [], "epoch"),
        ("abc", EPOCH_MAX, [], "epoch"),
        ("abc", True, [], "epoch"),  # a bool is an int to isinstance, not to the check
        ("abc", 1.0, [], "epoch"),
        ("abc", 1, "GPU-1", "gpu uuids"),
        ("abc", 1, ["GPU-1,GPU-2"], "gpu uuids"),  # would split CUDA_VISIBLE_DEVICES
        ("abc", 1, ["GPU 1"], "gpu uuids"),
        ("abc", 1, [""], "gpu uuids"),
        ("abc", 1, [7], "gpu uuids"),
    ],
)
def test_each_bad_argument_is_named(
    task_id: object, epoch: object, gpus: object, says: str
) -> None:
    line = check_arguments(task_id, epoch, gpus)
    assert line is not None and line.startswith(says)
    assert "\n" not in line


@given(st.from_type(object), st.from_type(object), st.from_type(object))
def test_any_value_gives_none_or_one_line(task_id: object, epoch: object, gpus: object) -> None:
    line = check_arguments(task_id, epoch, gpus)
    assert line is None or (isinstance(line, str) and "\n" not in line)


def test_the_task_user_of_a_daemon_that_is_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not root: no switch, and naming another user is refused in one line."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    monkeypatch.setattr(os, "geteuid", lambda: 12345)
    monkeypatch.setattr(
        pwd, "getpwuid", lambda uid: pwd.struct_passwd((me, "x", uid, uid, "", "/", "/bin/sh"))
    )
    assert resolve_task_user(None) == (None, None, me)
    assert resolve_task_user(me) == (None, None, me)
    with pytest.raises(ValueError, match="only a daemon running as root can switch users"):
        resolve_task_user("someone-else")


def test_the_task_user_of_a_root_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    """Root: nobody by default, root stays root, an unknown name is one line."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    nobody = pwd.getpwnam("nobody")
    assert resolve_task_user(None) == (nobody.pw_uid, nobody.pw_gid, "nobody")
    assert resolve_task_user("root") == (None, None, "root")
    with pytest.raises(ValueError, match="no such user on this machine"):
        resolve_task_user("no-such-user-populi")
