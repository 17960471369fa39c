"""Fixtures for the GPU tests: the fake NVML library, compiled once per session."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gpu_helpers import HERE, run_nvml_child

from populi_p2p.gpu import ProbeResult


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
         "-o", str(out / "libnvidia-ml.so.1"), str(HERE / "fake_nvml.c")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return out


@pytest.fixture
def nvml_child(fake_nvml_dir: Path) -> Any:
    def run(fixture: str | None, probes: int = 1) -> list[ProbeResult]:
        return run_nvml_child(fake_nvml_dir, fixture, probes)

    return run
