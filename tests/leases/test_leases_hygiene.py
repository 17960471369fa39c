"""The lease package's shape: no I/O, clock or global randomness, and its exports.

Copied from tests/swim/test_swim_hygiene.py; `store.py` alone may use `sqlite3` (and
nothing else on the forbidden list): it is the durability adapter, outside the pure core.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import populi_p2p.leases as leases

LEASES_DIR = pathlib.Path(leases.__file__).parent
FORBIDDEN_MODULES = {
    "trio",
    "socket",
    "time",
    "asyncio",
    "datetime",
    "uuid",
    "os",
    "select",
    "sqlite3",
}
ALLOWED = {"store.py": {"sqlite3"}}
SOURCES = sorted(LEASES_DIR.glob("*.py"))


def test_there_are_sources_to_scan() -> None:
    assert {p.name for p in SOURCES} >= {"_entry.py", "wire.py", "_table.py", "store.py"}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_io_clock_or_global_randomness(path: pathlib.Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    forbidden = FORBIDDEN_MODULES - ALLOWED.get(path.name, set())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] not in forbidden, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            root = node.module.split(".")[0]
            assert root not in forbidden, node.module
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
    assert sorted(leases.__all__) == sorted(set(leases.__all__))
    for name in leases.__all__:
        assert hasattr(leases, name), name
    public = {
        name
        for name in vars(leases)
        if not name.startswith("_")
        and not isinstance(getattr(leases, name), type(leases))  # submodules
    }
    assert public == set(leases.__all__)
    assert {
        "TaskSpec",
        "TaskEntry",
        "merge",
        "LeaseTable",
        "LeaseConfig",
        "DecodeError",
        "TaskChanged",
        "StaleResultRejected",
        "LeaseExpired",
    } <= set(leases.__all__)


def test_reexports_come_from_private_modules() -> None:
    assert leases.LeaseTable.__module__ == "populi_p2p.leases._table"
    assert leases.merge.__module__ == "populi_p2p.leases._entry"
    assert leases.DecodeError.__module__ == "populi_p2p.leases.wire"
