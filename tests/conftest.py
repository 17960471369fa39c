"""Fixtures shared by more than one test package, and the Hypothesis profiles.

Hypothesis profiles (see docs/testing.md):

* ``ci`` (the default): ``derandomize=True`` (the examples are a function of the test
  alone, so a run that passed passes again), no example database, no deadline (a shared
  CI machine is slow at random; likewise the ``too_slow`` health check), and
  ``print_blob=True`` so a failure prints the line
  that reproduces it.
* ``fuzz`` (``HYPOTHESIS_PROFILE=fuzz``, or ``make fuzz``): random examples, ten times
  as many per test (``HYPOTHESIS_FUZZ_SCALE``), and an example database under
  ``.hypothesis/`` so a counterexample is replayed until it is fixed. A counterexample
  found there becomes an ``@example(...)`` on the test, which the ``ci`` profile then
  runs every time.

``POPULI_MYPYC_BUILD=build/mypyc`` (``make test-compiled``): the tests import swim/ and
simulations/ from that compiled build (``simulations.compiled``) instead of the sources,
so the same tests cover both; a build that is missing or older than the sources stops
the run with one line.

``fake_nvml_dir``: the fake ``libnvidia-ml.so.1`` built from ``tests/gpu/fake_nvml.c``
with gcc, once per session. The GPU unit tests (``tests/gpu``) load it in a child
process; the process-level tests (``tests/node``) start daemons with ``LD_LIBRARY_PATH``
pointing at it. Values come from the fixture named by ``$FAKE_NVML_FIXTURE`` (files in
``tests/gpu/fixtures``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

_MYPYC_BUILD = os.environ.get("POPULI_MYPYC_BUILD")
if _MYPYC_BUILD:
    # Before anything imports swim: the compiled copy goes ahead of the sources.
    sys.path.insert(0, str(Path(_MYPYC_BUILD).resolve()))
    import simulations.compiled
    import swim._membership

    if not swim._membership.__file__ or not swim._membership.__file__.endswith(".so"):
        raise pytest.UsageError(f"POPULI_MYPYC_BUILD={_MYPYC_BUILD}: no compiled swim there")
    if not simulations.compiled.is_current(Path(_MYPYC_BUILD), Path(__file__).parents[1]):
        raise pytest.UsageError(
            f"POPULI_MYPYC_BUILD={_MYPYC_BUILD} is older than the sources: run `make compiled`"
        )

# `too_slow` measures wall time, which a loaded CI machine makes random: off in CI.
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
settings.register_profile(
    "fuzz",
    derandomize=False,
    database=DirectoryBasedExampleDatabase(".hypothesis/examples"),
    deadline=None,
    print_blob=True,
    max_examples=1000,
)
_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if _PROFILE not in ("ci", "fuzz"):
    raise pytest.UsageError(f"HYPOTHESIS_PROFILE={_PROFILE!r}: expected 'ci' or 'fuzz'")
settings.load_profile(_PROFILE)
#: Under ``fuzz``, tests with their own ``max_examples`` run this many times more.
_FUZZ_SCALE = int(os.environ.get("HYPOTHESIS_FUZZ_SCALE", "10"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``fuzz``, scale the examples of tests that set their own ``max_examples``.

    A test's ``@settings(max_examples=N)`` overrides the profile's value, so without
    this the fuzz run would try no more examples than CI, only different ones. Uses the
    attribute Hypothesis stores the test's settings in; if a future Hypothesis renames
    it, the fuzz run still randomizes, it just does not scale.
    """
    if _PROFILE != "fuzz":
        return
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if isinstance(own, settings):
            scaled = max(own.max_examples * _FUZZ_SCALE, settings.default.max_examples)
            test._hypothesis_internal_use_settings = settings(
                own, max_examples=scaled, derandomize=False,
                database=settings.default.database,
            )  # fmt: skip


FAKE_NVML_SOURCE = Path(__file__).parent / "gpu" / "fake_nvml.c"
GPU_FIXTURES = Path(__file__).parent / "gpu" / "fixtures"


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the compiled fake ``libnvidia-ml.so.1``."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler (gcc/cc) on PATH: cannot build the fake libnvidia-ml.so.1")
    if not sys.platform.startswith("linux"):
        pytest.skip("the fake NVML is loaded through LD_LIBRARY_PATH, which is Linux-only")
    out = tmp_path_factory.mktemp("fake-nvml")
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror",
         "-o", str(out / "libnvidia-ml.so.1"), str(FAKE_NVML_SOURCE)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return out
