"""The code's shape: pure cores without I/O, their exports, and no import cycles.

`swim/` and `populi_p2p/leases/` are sans-IO: time and an RNG are passed in, so the same
code runs under the daemon and the simulator and one seed reproduces a run. One scan
covers both; in `leases/`, `store.py` alone may use `sqlite3` (nothing else on the
forbidden list): it is the durability adapter, outside the pure core. The subpackage
`leases/driver/` is the agent's trio driver (the lease service): the scan leaves it
out by name, and the pure modules may not import it.

The import graph of `populi_p2p/` (every import, at module level or in a function) has
no cycle between modules nor between packages, and docs/architecture.md draws it as it
is (`python scripts/import_graph.py`).
"""

from __future__ import annotations

import ast
import importlib.util
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
#: package -> its subpackages that are drivers (I/O allowed), left out of the scan.
DRIVERS: dict[str, set[str]] = {"leases": {"driver"}}
PACKAGES: dict[str, types.ModuleType] = {"swim": swim, "leases": leases}
#: Files each scan must find (an empty glob would pass vacuously).
EXPECTED_SOURCES = {
    "swim": {"_membership.py", "wire.py", "_state.py"},
    "leases": {"_entry.py", "wire.py", "_table.py", "store.py"},
}


def _pure_sources(name: str, package: types.ModuleType) -> list[pathlib.Path]:
    """Every module of `package`, in subpackages too, but its drivers."""
    root = pathlib.Path(package.__file__ or "").parent
    return [
        path
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).parts[0] not in DRIVERS.get(name, set())
    ]


SOURCES = [
    (name, path) for name, package in PACKAGES.items() for path in _pure_sources(name, package)
]


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_there_are_sources_to_scan(name: str) -> None:
    assert {p.name for n, p in SOURCES if n == name} >= EXPECTED_SOURCES[name]


def test_the_lease_driver_is_left_out_by_name_only() -> None:
    """The scan skips `leases/driver/` (it uses trio, time and sqlite) and nothing else."""
    root = pathlib.Path(leases.__file__ or "").parent
    skipped = set(root.rglob("*.py")) - {p for n, p in SOURCES if n == "leases"}
    assert skipped, "leases/driver/ is gone: drop it from DRIVERS"
    assert {p.relative_to(root).parts[0] for p in skipped} == DRIVERS["leases"]


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


####################################################################################
# The import graph (scripts/import_graph.py computes it)


def _import_graph_script() -> types.ModuleType:
    path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "import_graph.py"
    spec = importlib.util.spec_from_file_location("import_graph", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


import_graph = _import_graph_script()
GRAPH = import_graph.module_graph()


def test_the_graph_sees_every_kind_of_import() -> None:
    """Module level, relative, inside a function and under TYPE_CHECKING all count."""
    assert "populi_p2p.trust.identity" in GRAPH["populi_p2p.trust.certificate"]  # relative
    assert "populi_p2p.leases" in GRAPH["populi_p2p.leases.driver.view"]  # `from .. import`
    assert "populi_p2p.executor.service" in GRAPH["populi_p2p.config"]  # in a function
    assert "populi_p2p.inference.peer_api" in GRAPH["populi_p2p.node"]  # TYPE_CHECKING
    assert "swim" in GRAPH["populi_p2p.driver"]


def test_no_import_cycle_between_modules() -> None:
    assert import_graph.cycles(GRAPH) == []


def test_no_import_cycle_between_packages() -> None:
    assert import_graph.cycles(import_graph.package_graph(GRAPH)) == []


def test_the_cycle_check_finds_a_cycle(tmp_path: pathlib.Path) -> None:
    """A cycle through a function-level import is found (the check is not vacuous)."""
    package = tmp_path / "populi_p2p"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    graph = import_graph.module_graph(tmp_path)
    assert import_graph.cycles(graph) == [["populi_p2p.a", "populi_p2p.sub.b"]]
    assert import_graph.cycles(import_graph.package_graph(graph)) == [
        ["populi_p2p.a", "populi_p2p.sub"]
    ]


def test_the_pure_lease_modules_do_not_import_their_driver() -> None:
    pure = [m for m in GRAPH if m.startswith("populi_p2p.leases") and "driver" not in m]
    assert pure
    for module in pure:
        outside = {t for t in GRAPH[module] if not t.startswith("populi_p2p.leases")}
        assert outside == set(), (module, outside)
        assert not any(t.startswith("populi_p2p.leases.driver") for t in GRAPH[module])


def test_services_hold_only_node_plumbing() -> None:
    """The domains have their own packages: no executor or lease-driver module, nor a
    trust module, is back in `services/`."""
    services = {m.rpartition(".")[2] for m in GRAPH if m.startswith("populi_p2p.services.")}
    assert not {n for n in services if n.startswith(("_task", "task_", "lease", "executor"))}
    trust = {m.rpartition(".")[2] for m in GRAPH if m.startswith("populi_p2p.trust.")}
    assert not trust & services


def test_the_docs_draw_the_import_graph_as_it_is() -> None:
    docs = pathlib.Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
    text = docs.read_text()
    assert import_graph.docs_with_drawing(text, import_graph.drawing(GRAPH)) == text, (
        "docs/architecture.md's import graph is stale: run python scripts/import_graph.py"
    )
