"""GPU truth across real daemons on loopback.

Node A runs with the fake ``libnvidia-ml.so.1`` (built by the ``fake_nvml_dir`` fixture
in ``tests/conftest.py``, loaded through the real nvidia-ml-py binding via
``LD_LIBRARY_PATH``); node B only declares a GPU (``--advertise-gpu``) and has no NVML;
node C is plain. What C shows about A and B comes from their signed NodeRecords, gossiped
to it, and is read through the real CLI (``populi-node members --json``).
"""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.node.harness import REPO, Daemon, Mesh, wait_until

FIXTURES = REPO / "tests" / "gpu" / "fixtures"
GIB = 1 << 30

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        ctypes.util.find_library("nvidia-ml") is not None,
        reason="a real NVML is installed: the no-NVML nodes would see real GPUs",
    ),
]


def nvml_env(lib_dir: Path, fixture: str) -> dict[str, str]:
    return {"LD_LIBRARY_PATH": str(lib_dir), "FAKE_NVML_FIXTURE": str(FIXTURES / fixture)}


#: For the nodes without NVML: nothing the test runner had leaks in.
NO_NVML = {"LD_LIBRARY_PATH": "", "FAKE_NVML_FIXTURE": ""}


def cli(daemon: Daemon, *args: str) -> Any:
    """Run ``populi-node ARGS --state-dir ...`` and decode its JSON output."""
    proc = subprocess.run(
        [sys.executable, "-m", "populi_p2p.cli", *args, "--state-dir", str(daemon.state_dir)],
        capture_output=True, text=True, timeout=30, check=False,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def gpu_of(viewer: Daemon, node: Daemon) -> dict[str, Any] | None:
    """``node``'s GPU record as ``viewer``'s ``members --json`` shows it (None until then)."""
    for row in cli(viewer, "members", "--json"):
        if row["node_id"] == node.node_id and row["verified"]:
            gpu: dict[str, Any] | None = row["gpu"]
            return gpu
    return None


def test_members_tell_verified_gpus_from_declared(tmp_path: Path, fake_nvml_dir: Path) -> None:
    mesh = Mesh(tmp_path)
    try:
        a = mesh.start("a", env=nvml_env(fake_nvml_dir, "nvml_two_healthy.txt"))
        b = mesh.spawn("b", "--bootstrap", a.address, "--advertise-gpu", "A100:80GiB", env=NO_NVML)
        c = mesh.spawn("c", "--bootstrap", a.address, env=NO_NVML)
        for d in (b, c):
            mesh.ready(d)
        daemons = [a, b, c]
        everyone = {d.node_id: "alive" for d in daemons}
        wait_until(lambda: mesh.converged(daemons, everyone), 30, "3 daemons to converge")

        # A: two GPUs verified by NVML (layer A), with allocatable capacity (layer B).
        a_gpu = wait_until(
            lambda: (g := gpu_of(c, a)) is not None and len(g["gpus"]) == 2 and g,
            20, "A's two GPUs to reach C",
        )  # fmt: skip
        assert a_gpu["driver_version"] == "550.54.14"
        for dev in a_gpu["gpus"]:
            assert dev["provenance"] == {"layer": "A", "source": "nvml"}
            assert dev["name"] == "NVIDIA GeForce RTX 4090"
            assert dev["health"]["state"] == "healthy"
            assert dev["capacity"]["provenance"]["layer"] == "B"
            assert dev["capacity"]["vram"] > 20 * GIB
        assert a_gpu["capacity"]["allocatable_gpus"] == 2
        assert a_gpu["capacity"]["vram_total"] > 40 * GIB
        assert a_gpu["declared_gpus"] == []

        # B: a declared GPU is a layer C claim, and never capacity.
        b_gpu = wait_until(lambda: gpu_of(c, b), 20, "B's GPU record to reach C")
        assert b_gpu["gpus"] == []
        (declared,) = b_gpu["declared_gpus"]
        assert declared["provenance"] == {"layer": "C", "source": "declared"}
        assert declared["vram"] == 80 * GIB
        assert b_gpu["capacity"]["vram_total"] == 0
        assert b_gpu["capacity"]["allocatable_gpus"] == 0

        # The table's one-line summary says the same.
        rows = {r["node_id"]: r["capabilities"] for r in cli(c, "members", "--json")}
        assert "(verified)" in rows[a.node_id] and "(declared)" not in rows[a.node_id]
        assert "(declared)" in rows[b.node_id] and "(verified)" not in rows[b.node_id]
        assert rows[c.node_id].endswith("no GPU")
    finally:
        mesh.stop_all()


def test_gpus_probe_gossips_a_lost_gpu(tmp_path: Path, fake_nvml_dir: Path) -> None:
    mesh = Mesh(tmp_path)
    try:
        # The interval is long: only `gpus --probe` can make the second probe happen.
        a = mesh.start(
            "a", "--gpu-probe-interval", "600", env=nvml_env(fake_nvml_dir, "nvml_lost_midrun.txt")
        )
        c = mesh.start("c", "--bootstrap", a.address, env=NO_NVML)
        lost_uuid = "GPU-66666666-7777-4888-9999-aaaaaaaaaaaa"

        def a_seen_by_c() -> dict[str, Any] | None:
            g = gpu_of(c, a)
            return g if g is not None and len(g["gpus"]) == 2 else None

        before = wait_until(a_seen_by_c, 30, "A's GPUs to reach C")
        assert [d["health"]["state"] for d in before["gpus"]] == ["healthy", "healthy"]
        assert all(d["capacity"]["vram"] > 40 * GIB for d in before["gpus"])
        assert cli(a, "gpus", "--json")["report"]["gpus"][1]["lost"] is False

        # Re-probe on demand: the answer is the new report, built from that probe.
        probed = cli(a, "gpus", "--probe", "--json")["report"]
        good, lost = probed["gpus"]
        assert lost["uuid"] == lost_uuid and lost["lost"] is True
        assert lost["health"]["state"] == "unhealthy"
        assert lost["capacity"]["vram"] == 0
        assert good["health"]["state"] == "healthy" and good["capacity"]["vram"] > 40 * GIB

        # ... and a new signed record carried it to C.
        def lost_at_c() -> dict[str, Any] | None:
            g = a_seen_by_c()
            return g if g is not None and g["gpus"][1]["health"]["state"] == "unhealthy" else None

        after = wait_until(lost_at_c, 20, "C to see A's lost GPU")
        gone = after["gpus"][1]
        assert gone["uuid"] == lost_uuid
        assert "lost" in gone["health"]["reasons"]
        assert gone["capacity"]["vram"] == 0
        assert after["gpus"][0]["capacity"]["vram"] == before["gpus"][0]["capacity"]["vram"]
        assert after["capacity"]["allocatable_gpus"] == 1
    finally:
        mesh.stop_all()


def test_withheld_gpu_and_reserved_vram_are_not_offered(
    tmp_path: Path, fake_nvml_dir: Path
) -> None:
    mesh = Mesh(tmp_path)
    try:
        a = mesh.start(
            "a", "--withhold-gpu", "1", "--reserve-vram", "4GiB",
            env=nvml_env(fake_nvml_dir, "nvml_two_healthy.txt"),
        )  # fmt: skip
        c = mesh.start("c", "--bootstrap", a.address, env=NO_NVML)
        a_gpu = wait_until(
            lambda: (g := gpu_of(c, a)) is not None and len(g["gpus"]) == 2 and g,
            30, "A's two GPUs to reach C",
        )  # fmt: skip
        by_index = {dev["index"]: dev for dev in a_gpu["gpus"]}
        kept, offered = by_index[1], by_index[0]
        assert kept["health"]["state"] == "healthy"  # still a verified fact ...
        assert kept["capacity"]["vram"] == 0  # ... but never offered
        assert 0 < offered["capacity"]["vram"] <= offered["memory_total"] - 4 * GIB
        assert a_gpu["capacity"]["allocatable_gpus"] == 1
    finally:
        mesh.stop_all()
