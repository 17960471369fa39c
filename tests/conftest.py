"""Fixtures shared by more than one test package.

``fake_nvml_dir``: the fake ``libnvidia-ml.so.1`` built from ``tests/gpu/fake_nvml.c``
with gcc, once per session. The GPU unit tests (``tests/gpu``) load it in a child
process; the process-level tests (``tests/node``) start daemons with ``LD_LIBRARY_PATH``
pointing at it. Values come from the fixture named by ``$FAKE_NVML_FIXTURE`` (files in
``tests/gpu/fixtures``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
