"""A GPU task on a real daemon with a real NVIDIA GPU: it is given the GPU by UUID and
the GPU works inside it.

Skips where there is no real driver and GPU (CI); run on a lent H200 machine
(docs/gpu.md). ``test_tasks_gpu.py`` covers the same path against the fake NVML.
"""

from __future__ import annotations

import ctypes.util
import shutil
import subprocess
import sys
from typing import Any

import pytest

from tests.node.harness import Mesh, wait_until

from .test_gpus import GIB, gpu_of


def _smi(query: str) -> list[str]:
    if ctypes.util.find_library("nvidia-ml") is None or shutil.which("nvidia-smi") is None:
        return []
    proc = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


UUIDS = _smi("uuid")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not UUIDS, reason="needs a real NVIDIA GPU, libnvidia-ml and nvidia-smi"),
]

_PROBE = (
    "import os, torch; "
    "print(os.environ['CUDA_VISIBLE_DEVICES']); "
    "x = torch.ones(1 << 20, device='cuda'); "
    "print(torch.cuda.get_device_name(0), int(x.sum().item()))"
)


def test_a_gpu_task_gets_a_real_gpu_by_uuid_and_uses_it(tmp_path: Any) -> None:
    pytest.importorskip("torch")
    names = _smi("name")
    mesh = Mesh(tmp_path, preset="local")
    try:
        a = mesh.start("a")
        record = wait_until(lambda: (g := gpu_of(a, a)) is not None and g["gpus"] and g, 20, "GPUs")
        assert sorted(d["uuid"] for d in record["gpus"]) == sorted(UUIDS)
        spec: dict[str, Any] = {
            "command": [sys.executable, "-c", _PROBE],
            "gpus": 1, "vram": 8 * GIB, "min_cc": "8.0", "kind": "training", "timeout": 120,
        }  # fmt: skip
        tid = a.client.post("/v1/tasks", spec)["id"]
        done = wait_until(
            lambda: (t := a.client.get(f"/v1/tasks/{tid}"))["finished"] and t, 120, "the task"
        )
        lines = done["result"]["output_tail"].strip().splitlines()
        assert done["phase"] == "succeeded", done
        assert lines[0] in UUIDS
        assert lines[1] == f"{names[UUIDS.index(lines[0])]} {1 << 20}"
    finally:
        mesh.stop_all()
