"""The code's shape: pure cores without I/O, their exports, no import cycles, sizes.

`swim/` and `populi_p2p/leases/` are sans-IO: time and an RNG are passed in, so the same
code runs under the daemon and the simulator and one seed reproduces a run. One scan
covers both; in `leases/`, `store.py` alone may use `sqlite3` (nothing else on the
forbidden list): it is the durability adapter, outside the pure core. The subpackage
`leases/driver/` is the agent's trio driver (the lease service): the scan leaves it
out by name, and the pure modules may not import it.

The import graph of `populi_p2p/` (every import, at module level or in a function) has
no cycle between modules nor between packages, and docs/architecture.md draws it as it
is (`python scripts/import_graph.py`).

No file of `swim/`, `overlay/`, `populi_p2p/` or `simulations/` is over 1,000 lines, and
no function over 80 but those in `LONG_FUNCTIONS` (each with its reason, also in
docs/architecture.md).
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import sys
import textwrap
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


####################################################################################
# Tests laid out like the source (docs/testing.md, "Layout")
####################################################################################

REPO = pathlib.Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
#: Test folder -> the source package it mirrors: `tests/<folder>/test_<module>.py`, or
#: `test_<module>_<aspect>.py` for one side of a module, tests a module of that package.
MIRRORS = {
    "swim": "swim",
    "overlay": "overlay",
    "simulations": "simulations",
    "node": "populi_p2p",
    "services": "populi_p2p/services",
    "trust": "populi_p2p/trust",
    "leases": "populi_p2p/leases",
    "leases/driver": "populi_p2p/leases/driver",
    "executor": "populi_p2p/executor",
    "blobs": "populi_p2p/blobs",
    "deploy": "populi_p2p/deploy",
    "artifacts": "populi_p2p/artifacts",
    "gpu": "populi_p2p/gpu",
    "inference": "populi_p2p/inference",
    "observe": "populi_p2p/observe",
}
#: Folders of tests by what they need, not by module.
KINDS = {
    "mesh": "real `populi-node up` processes on loopback",
    "netns": "root and network namespaces (skipped with the reason elsewhere)",
    "attacks": "one test per attack, named in docs/security.md's coverage table",
    "history": "the history checker (tests/history/checker.py) and its lab",
}
#: Test files in a mirror folder that are about the package, not one module.
ABOUT_THE_PACKAGE = {
    "gpu/test_exports.py": "populi_p2p.gpu's re-exports",
    "node/test_exports.py": "populi_p2p's public names and entry points",
    "node/test_lazy_imports.py": "what the daemon imports before it answers",
    "overlay/test_imports.py": "overlay/ never imports populi_p2p/",
}
#: Modules with logic (a function or method) that have no test file named after them
#: yet: they are tested, if at all, through others. This list only shrinks: a new
#: module comes with `tests/<folder>/test_<module>.py`.
NO_TEST_FILE_YET: dict[str, str] = {}


def _modules(folder: str) -> dict[str, pathlib.Path]:
    """A mirrored package's modules by the name a test file uses (no leading `_`)."""
    root = REPO / MIRRORS[folder]
    return {
        p.stem.lstrip("_"): p for p in root.glob("*.py") if p.stem not in ("__init__", "__main__")
    }


def _tested_module(stem: str, modules: dict[str, pathlib.Path]) -> str | None:
    """The module `test_<stem>.py` is about (the longest name that fits), or None."""
    fits = [m for m in modules if stem == m or stem.startswith(m + "_")]
    return max(fits, key=len) if fits else None


TEST_FILES = sorted(TESTS.rglob("test_*.py"))


def test_every_test_folder_mirrors_a_package_or_is_a_kind() -> None:
    folders = {p.parent.relative_to(TESTS).as_posix() for p in TEST_FILES} - {"."}
    unknown = folders - set(MIRRORS) - set(KINDS)
    assert not unknown, (
        f"tests/{sorted(unknown)[0]}/ mirrors no package: put its tests in"
        " tests/<package>/ (MIRRORS in tests/test_hygiene.py) or declare it in KINDS"
    )
    for folder, package in MIRRORS.items():
        assert (REPO / package / "__init__.py").exists(), (folder, package)


@pytest.mark.parametrize(
    "path",
    [p for p in TEST_FILES if p.parent.relative_to(TESTS).as_posix() in MIRRORS],
    ids=lambda p: p.relative_to(TESTS).as_posix(),
)
def test_every_test_file_names_a_module_of_its_package(path: pathlib.Path) -> None:
    folder = path.parent.relative_to(TESTS).as_posix()
    name = f"{folder}/{path.name}"
    if name in ABOUT_THE_PACKAGE:
        return
    stem = path.stem.removeprefix("test_")
    assert _tested_module(stem, _modules(folder)) is not None, (
        f"tests/{name} names no module of {MIRRORS[folder]}/: call it"
        f" test_<module>[_<aspect>].py, or list it in ABOUT_THE_PACKAGE with why"
    )


def _has_logic(path: pathlib.Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(tree))


@pytest.mark.parametrize("folder", sorted(MIRRORS))
def test_modules_without_a_test_file_are_the_listed_ones(folder: str) -> None:
    modules = _modules(folder)
    tested = {
        _tested_module(p.stem.removeprefix("test_"), modules)
        for p in (TESTS / folder).glob("test_*.py")
    }
    missing = {
        path.stem for name, path in modules.items() if name not in tested and _has_logic(path)
    }
    listed = set(NO_TEST_FILE_YET.get(folder, "").split())
    for module in sorted(missing - listed):
        pytest.fail(
            f"{MIRRORS[folder]}/{module}.py has no tests/{folder}/test_{module.lstrip('_')}.py"
        )
    for module in sorted(listed - missing):
        pytest.fail(
            f"{MIRRORS[folder]}/{module}.py has its test file now (or is gone):"
            f" drop it from NO_TEST_FILE_YET[{folder!r}] in tests/test_hygiene.py"
        )


#: Names a test could import by its bare file name (a helper, a test folder) and that
#: are not the project's packages: each must be imported as `tests.<...>` or relatively.
_TEST_NAMES = {p.stem for p in TESTS.rglob("*.py") if p.stem not in ("__init__", "conftest")} | {
    p.name for p in TESTS.iterdir() if p.is_dir()
}
_BARE = (
    _TEST_NAMES - {"swim", "overlay", "simulations", "populi_p2p"} - set(sys.stdlib_module_names)
)


@pytest.mark.parametrize(
    "path",
    sorted(p for p in TESTS.rglob("*.py") if "no_fence" not in p.parts),
    ids=lambda p: p.relative_to(TESTS).as_posix(),
)
def test_test_helpers_are_imported_by_their_package_name(path: pathlib.Path) -> None:
    """`from tests.node.harness import Mesh`, not `from node.harness import Mesh`: every
    test folder is a package of `tests`, nothing puts a test folder on sys.path."""
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            last = name.split(".")[-1]
            assert name.split(".")[0] not in _BARE, (
                f"tests/{path.relative_to(TESTS)}:{node.lineno}: import {name} as"
                f" tests.<folder>.{last} or relatively (from .{last} import ...)"
            )


####################################################################################
# Size limits (docs/architecture.md, "Size limits")
####################################################################################

#: The packages whose files and functions the size limits hold for.
SIZED = ("swim", "overlay", "populi_p2p", "simulations")
MAX_FILE_LINES = 1000
MAX_FUNCTION_LINES = 80
#: "path:Qualified.name" -> why it is kept over `MAX_FUNCTION_LINES`. Each one is also
#: listed, with its reason, in docs/architecture.md. Empty: split a long function
#: into named pieces rather than add it here.
LONG_FUNCTIONS: dict[str, str] = {}


def _long_functions(path: pathlib.Path, limit: int) -> dict[str, int]:
    """Each def in `path` (nested ones and methods too) over `limit` lines, as
    "path:Qualified.name" -> its lines (decorators left out, docstring counted)."""
    found: dict[str, int] = {}
    name = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                qualified = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > limit:
                        found[f"{name}:{qualified}"] = lines
                walk(child, qualified + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text(), filename=str(path)), "")
    return found


SIZED_SOURCES = sorted(p for package in SIZED for p in (REPO / package).rglob("*.py"))


def test_the_size_scans_find_the_sources() -> None:
    names = {p.relative_to(REPO).as_posix() for p in SIZED_SOURCES}
    assert {"swim/_membership.py", "populi_p2p/node.py", "simulations/_runner.py"} <= names
    assert "overlay/detect.py" in names


def test_no_source_file_over_the_limit() -> None:
    over = {
        p.relative_to(REPO).as_posix(): n
        for p in SIZED_SOURCES
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not over, f"files over {MAX_FILE_LINES} lines (split them by mechanism): {over}"


def test_no_function_over_the_limit_but_the_listed_ones() -> None:
    found: dict[str, int] = {}
    for path in SIZED_SOURCES:
        found.update(_long_functions(path, MAX_FUNCTION_LINES))
    unlisted = {k: v for k, v in found.items() if k not in LONG_FUNCTIONS}
    assert not unlisted, (
        f"functions over {MAX_FUNCTION_LINES} lines: {unlisted}; split each into named"
        " pieces (or, with a reason, add it to LONG_FUNCTIONS in tests/test_hygiene.py"
        " and to docs/architecture.md's list)"
    )
    stale = sorted(set(LONG_FUNCTIONS) - set(found))
    assert not stale, f"no longer over {MAX_FUNCTION_LINES} lines (or gone): drop {stale}"


def test_every_kept_long_function_is_documented() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    for key in LONG_FUNCTIONS:
        path, qualified = key.split(":")
        assert f"`{path}` `{qualified}`" in text, f"{key} is not in docs/architecture.md"


def test_the_function_scan_catches_a_long_one(tmp_path: pathlib.Path) -> None:
    """Nested functions and methods count on their own, each by its whole span."""
    body = "".join(f"x{i} = {i}\n" for i in range(80))  # with its def: 81 lines
    source = tmp_path / "long.py"
    source.write_text(
        "def short():\n    pass\n\n"
        "class C:\n    async def m(self):\n" + textwrap.indent(body, " " * 8)
        + "\ndef outer():\n    def inner():\n" + textwrap.indent(body, " " * 8)
    )  # fmt: skip
    found = _long_functions(source, MAX_FUNCTION_LINES)
    assert found == {"long.py:C.m": 81, "long.py:outer": 82, "long.py:outer.inner": 81}
