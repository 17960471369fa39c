"""GPU tasks on real daemons: node A has two (fake-NVML) RTX 4090s, node C none.

A GPU task lands on A, runs with ``CUDA_VISIBLE_DEVICES`` set to the UUID it was given,
and while it runs A's signed record offers that much less VRAM on that GPU (Layer B), as
C sees it; the capacity comes back when the task ends. A task asking for a compute
capability no GPU has stays pending and says why.
"""

from __future__ import annotations

import ctypes.util
from pathlib import Path
from typing import Any

import pytest

from tests.node.harness import Mesh, wait_until

from .test_gpus import GIB, NO_NVML, gpu_of, nvml_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        ctypes.util.find_library("nvidia-ml") is not None,
        reason="a real NVML is installed: the no-NVML node would see real GPUs",
    ),
]


def test_gpu_task_holds_capacity_while_it_runs(tmp_path: Path, fake_nvml_dir: Path) -> None:
    mesh = Mesh(tmp_path, preset="local")
    try:
        a = mesh.start("a", env=nvml_env(fake_nvml_dir, "nvml_two_healthy.txt"))
        c = mesh.start("c", "--bootstrap", a.address, env=NO_NVML)
        wait_until(
            lambda: mesh.converged([a, c], {a.node_id: "alive", c.node_id: "alive"}), 30, "join"
        )

        totals: dict[str, int] = {}

        def capacity() -> dict[str, int] | None:
            g = gpu_of(c, a)
            if g is None or len(g["gpus"]) != 2:
                return None
            totals.update({d["uuid"]: d["memory_total"] for d in g["gpus"]})
            return {d["uuid"]: d["capacity"]["vram"] for d in g["gpus"]}

        before: dict[str, int] = wait_until(capacity, 20, "A's GPUs to reach C")
        spec: dict[str, Any] = {
            "command": ["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"; sleep 3'],
            "gpus": 1, "vram": 8 * GIB, "min_cc": "8.0", "kind": "training",
        }  # fmt: skip
        tid = c.client.post("/v1/tasks", spec)["id"]
        running = wait_until(
            lambda: (t := c.client.get(f"/v1/tasks/{tid}"))["phase"] == "running" and t,
            15, "the GPU task to run",
        )  # fmt: skip
        assert running["owner"] == a.node_id

        def shrunk() -> dict[str, int] | None:
            now = capacity()
            return now if now is not None and now != before else None

        during = wait_until(shrunk, 10, "A's record to offer less VRAM")
        (held,) = [u for u in before if during[u] != before[u]]
        # Layer B counts the allocation against the device: at most total - 8 GiB is
        # offered (before, free memory was the tighter bound).
        assert during[held] <= totals[held] - 8 * GIB < before[held]

        done = wait_until(
            lambda: (t := c.client.get(f"/v1/tasks/{tid}"))["finished"] and t, 20, "the end"
        )
        assert done["phase"] == "succeeded"
        assert done["result"]["output_tail"].strip() == held
        wait_until(lambda: capacity() == before, 10, "the VRAM to be offered again")

        # No GPU here has compute capability 9.0: accepted, pending, and it says why
        # (A's GPUs are too old; C has none, which is named as such).
        never = c.client.post("/v1/tasks", {**spec, "min_cc": "9.0"})["id"]
        why = wait_until(lambda: c.client.get(f"/v1/tasks/{never}")["why"], 10, "a why")
        assert "compute_capability=1" in why and "no_gpu=1" in why and "capacity" not in why
    finally:
        mesh.stop_all()
