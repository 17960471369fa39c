"""The optional mypyc build (`simulations.compiled`): stamped by its sources, and the
same runs as the interpreted sources, digest for digest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import swim._membership
from simulations import compiled, load_scenario, override, run_once
from simulations.cli import SCENARIOS

_ROOT = Path(__file__).resolve().parents[2]
#: Small runs of shipped scenarios that cross the compiled modules' paths: joining, a
#: crash and a slow member (demo), a partition and its heal, a sleeping laptop.
_RUNS = (("demo", 40, 40.0), ("partition-heal", 16, 60.0), ("laptop-sleep", 16, 60.0))


def _digest(name: str, members: int, duration: float) -> str:
    scenario = load_scenario(SCENARIOS / f"{name}.toml")
    return run_once(override(scenario, members=members, duration=duration)).digest


def _tree(root: Path) -> None:
    for package in ("swim", "simulations"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "simulations" / "scenarios").mkdir()
    (root / "simulations" / "scenarios" / "a.toml").write_text("name = 'a'\n")


def test_a_build_is_current_only_for_the_sources_it_was_made_from(tmp_path: Path) -> None:
    root, target = tmp_path / "root", tmp_path / "build"
    _tree(root)
    assert not compiled.is_current(target, root)  # nothing built
    target.mkdir()
    (target / "stamp").write_text(compiled._stamp(root))
    assert compiled.is_current(target, root)
    (root / "swim" / "__init__.py").write_text("# changed\n")
    assert not compiled.is_current(target, root)
    (target / "stamp").write_text(compiled._stamp(root))
    (root / "simulations" / "scenarios" / "a.toml").write_text("name = 'b'\n")
    assert not compiled.is_current(target, root)  # scenarios are part of the build too


@pytest.mark.skipif(
    not os.environ.get("POPULI_MYPYC_BUILD"),
    reason="checks the compiled build: runs under `make test-compiled`",
)
def test_the_compiled_build_gives_the_digests_of_the_sources() -> None:
    assert swim._membership.__file__ is not None
    assert swim._membership.__file__.endswith(".so")  # this process runs compiled
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import swim._membership as m; "
        "assert m.__file__.endswith('.py'), m.__file__; "
        "from tests.simulations.test_compiled import _RUNS, _digest; "
        "print(' '.join(_digest(*run) for run in _RUNS))"
    )
    env = {k: v for k, v in os.environ.items() if k != "POPULI_MYPYC_BUILD"}
    interpreted = subprocess.run(
        [sys.executable, "-c", code, str(_ROOT)],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert [_digest(*run) for run in _RUNS] == interpreted
