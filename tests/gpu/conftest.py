"""Fixtures for the GPU tests. ``fake_nvml_dir`` (the fake NVML library, compiled once
per session) lives in ``tests/conftest.py``, shared with the daemon tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from populi_p2p.gpu import ProbeResult

from .gpu_helpers import run_nvml_child


@pytest.fixture
def nvml_child(fake_nvml_dir: Path) -> Any:
    def run(fixture: str | None, probes: int = 1) -> list[ProbeResult]:
        return run_nvml_child(fake_nvml_dir, fixture, probes)

    return run
