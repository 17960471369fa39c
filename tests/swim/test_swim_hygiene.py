"""The package's shape: no I/O, clock or global randomness in swim/, and its exports."""

from __future__ import annotations

import ast
import pathlib

import pytest

import swim

SWIM_DIR = pathlib.Path(swim.__file__).parent
FORBIDDEN_MODULES = {"trio", "socket", "time", "asyncio", "datetime", "uuid", "os", "select"}
SOURCES = sorted(SWIM_DIR.glob("*.py"))


def test_there_are_sources_to_scan() -> None:
    assert {p.name for p in SOURCES} >= {"_membership.py", "wire.py", "_state.py"}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_io_clock_or_global_randomness(path: pathlib.Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] not in FORBIDDEN_MODULES, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            root = node.module.split(".")[0]
            assert root not in FORBIDDEN_MODULES, node.module
            if root == "random":
                # `from random import Random` (the type) is fine; the module-level
                # functions (random(), shuffle(), ...) share hidden global state.
                assert {a.name for a in node.names} <= {"Random"}, node.module
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "random"
        ):
            # `random.Random` as a type is fine; `random.random()` and friends are not.
            assert node.attr == "Random", f"{path.name}:{node.lineno}: random.{node.attr}"


def test_all_is_exactly_the_public_api() -> None:
    assert sorted(swim.__all__) == sorted(set(swim.__all__))
    for name in swim.__all__:
        assert hasattr(swim, name), name
    public = {
        name
        for name in vars(swim)
        if not name.startswith("_")
        and not isinstance(getattr(swim, name), type(swim))  # submodules
    }
    assert public == set(swim.__all__)
    assert {
        "Membership",
        "SwimConfig",
        "Send",
        "Member",
        "MemberState",
        "Address",
        "Output",
        "MemberJoined",
        "MemberUpdated",
        "MemberSuspected",
        "MemberFailed",
        "MemberLeft",
        "MemberRecovered",
        "SelfRefuted",
        "MembershipStatistics",
        "DecodeError",
    } <= set(swim.__all__)


def test_reexports_come_from_private_modules() -> None:
    assert swim.Membership.__module__ == "swim._membership"
    assert swim.Send.__module__ == "swim._events"
    assert swim.DecodeError.__module__ == "swim.wire"
