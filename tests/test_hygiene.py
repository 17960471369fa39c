"""The pure cores' shape: no I/O, clock or global randomness, and their exports.

`swim/` and `populi_p2p/leases/` are sans-IO: time and an RNG are passed in, so the same
code runs under the daemon and the simulator and one seed reproduces a run. One scan
covers both; in `leases/`, `store.py` alone may use `sqlite3` (nothing else on the
forbidden list): it is the durability adapter, outside the pure core.
"""

from __future__ import annotations

import ast
import pathlib
import types

import pytest

import populi_p2p.leases as leases
import swim

FORBIDDEN_MODULES = frozenset(
    {"trio", "socket", "time", "asyncio", "datetime", "uuid", "os", "select", "sqlite3"}
)
#: package -> file name -> the forbidden modules that file may import anyway.
ALLOWED: dict[str, dict[str, set[str]]] = {"leases": {"store.py": {"sqlite3"}}}
PACKAGES: dict[str, types.ModuleType] = {"swim": swim, "leases": leases}
#: Files each scan must find (an empty glob would pass vacuously).
EXPECTED_SOURCES = {
    "swim": {"_membership.py", "wire.py", "_state.py"},
    "leases": {"_entry.py", "wire.py", "_table.py", "store.py"},
}
SOURCES = [
    (name, path)
    for name, package in PACKAGES.items()
    for path in sorted(pathlib.Path(package.__file__ or "").parent.glob("*.py"))
]


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_there_are_sources_to_scan(name: str) -> None:
    assert {p.name for n, p in SOURCES if n == name} >= EXPECTED_SOURCES[name]


@pytest.mark.parametrize(("name", "path"), SOURCES, ids=[f"{n}/{p.name}" for n, p in SOURCES])
def test_no_io_clock_or_global_randomness(name: str, path: pathlib.Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    forbidden = FORBIDDEN_MODULES - ALLOWED.get(name, {}).get(path.name, set())
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


def test_the_scan_catches_a_forbidden_import(tmp_path: pathlib.Path) -> None:
    """The scan itself works: a file importing time, or calling random.random, fails."""
    for text in ("import time\n", "from random import shuffle\n", "x = random.random()\n"):
        bad = tmp_path / "bad.py"
        bad.write_text(text)
        with pytest.raises(AssertionError):
            test_no_io_clock_or_global_randomness("swim", bad)


REQUIRED_EXPORTS = {
    "swim": {
        "Membership", "SwimConfig", "Send", "Member", "MemberState", "Address", "Output",
        "MemberJoined", "MemberUpdated", "MemberSuspected", "MemberFailed", "MemberLeft",
        "MemberRecovered", "SelfRefuted", "MembershipStatistics", "DecodeError",
    },
    "leases": {
        "TaskSpec", "TaskEntry", "merge", "LeaseTable", "LeaseConfig", "DecodeError",
        "TaskChanged", "StaleResultRejected", "LeaseExpired",
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_all_is_exactly_the_public_api(name: str) -> None:
    package = PACKAGES[name]
    exported: list[str] = package.__all__
    assert sorted(exported) == sorted(set(exported))
    for attr in exported:
        assert hasattr(package, attr), attr
    public = {
        attr
        for attr in vars(package)
        if not attr.startswith("_")
        and not isinstance(getattr(package, attr), types.ModuleType)  # submodules
    }
    assert public == set(exported)
    assert REQUIRED_EXPORTS[name] <= set(exported)


@pytest.mark.parametrize(
    ("obj", "module"),
    [
        (swim.Membership, "swim._membership"),
        (swim.Send, "swim._events"),
        (swim.DecodeError, "swim.wire"),
        (leases.LeaseTable, "populi_p2p.leases._table"),
        (leases.merge, "populi_p2p.leases._entry"),
        (leases.DecodeError, "populi_p2p.leases.wire"),
    ],
    ids=lambda v: getattr(v, "__qualname__", v),
)
def test_reexports_come_from_private_modules(obj: object, module: str) -> None:
    assert getattr(obj, "__module__", None) == module
