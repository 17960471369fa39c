"""The GPU truth probe against a real NVIDIA GPU, checked against ``nvidia-smi``.

Everything else in ``tests/gpu`` runs against the fake NVML and recorded tool output.
These run only where a real driver and GPU are present (CI has none, so they skip
there); they were run on an H200 machine lent for this purpose (docs/gpu.md). What
NVML tells the probe must agree with what the driver's own tool prints, the report
must offer a healthy idle GPU, and memory that a process takes must show up as used.
"""

from __future__ import annotations

import ctypes.util
import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from populi_p2p.gpu import NvidiaSmiProbe, NvmlProbe, Source

from .gpu_helpers import child_env

MIB = 1 << 20


def _smi_rows() -> list[dict[str, str]]:
    fields = (
        "uuid", "name", "memory.total", "memory.used", "compute_cap", "driver_version",
        "pci.bus_id",
    )  # fmt: skip
    proc = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        return []
    rows = []
    for line in proc.stdout.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(fields):
            rows.append(dict(zip(fields, values, strict=True)))
    return rows


def _real_gpus() -> list[dict[str, str]]:
    if ctypes.util.find_library("nvidia-ml") is None or shutil.which("nvidia-smi") is None:
        return []
    return _smi_rows()


SMI = _real_gpus()

pytestmark = pytest.mark.skipif(
    not SMI, reason="needs a real NVIDIA GPU, its driver's libnvidia-ml and nvidia-smi"
)


def test_nvml_sees_every_gpu_the_driver_lists_with_the_same_facts() -> None:
    probe = NvmlProbe(watch_xids=False)
    try:
        result = probe.probe()
    finally:
        probe.close()
    assert result.error is None, result.error
    assert result.source is Source.NVML
    assert result.driver_version == SMI[0]["driver_version"]
    assert result.cuda_driver_version is not None
    by_uuid = {d.uuid: d for d in result.devices}
    assert sorted(by_uuid) == sorted(row["uuid"] for row in SMI)
    for row in SMI:
        device = by_uuid[row["uuid"]]
        assert device.source is Source.NVML and device.error is None and not device.lost
        assert device.name == row["name"]
        assert device.memory_total is not None
        assert device.memory_total // MIB == int(row["memory.total"])
        major, minor = (int(x) for x in row["compute_cap"].split("."))
        assert device.compute_capability == (major, minor)
        assert device.pci_bus_id is not None
        assert device.pci_bus_id.lower().endswith(row["pci.bus_id"].lower()[-12:])
        assert device.memory_used is not None and device.memory_free is not None
        assert device.memory_used + device.memory_free <= device.memory_total
        # Used as the driver's own tool counts it: without its reservation (NVML v2).
        assert abs(device.memory_used // MIB - int(row["memory.used"])) <= 64
        assert device.memory_reserved is not None and device.memory_reserved > 0
        assert device.temperature_c is not None and 0 < device.temperature_c < 120
        assert device.power_limit_w is not None and device.power_limit_w > 0


def test_the_nvidia_smi_fallback_agrees_with_nvml() -> None:
    probe = NvmlProbe(watch_xids=False)
    try:
        nvml = probe.probe()
    finally:
        probe.close()
    smi = NvidiaSmiProbe().probe()
    assert smi.error is None, smi.error
    assert smi.driver_version == nvml.driver_version
    assert [d.uuid for d in smi.devices] == [d.uuid for d in nvml.devices]
    for a, b in zip(smi.devices, nvml.devices, strict=True):
        assert (a.name, a.compute_capability, a.mig_enabled) == (
            b.name,
            b.compute_capability,
            b.mig_enabled,
        )
        assert a.memory_total is not None and b.memory_total is not None
        assert a.memory_total // MIB == b.memory_total // MIB


def test_the_report_offers_an_idle_real_gpu_as_verified_and_healthy() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "populi_p2p.gpu", "--json"],
        capture_output=True, text=True, timeout=60, check=False, env=child_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [g["uuid"] for g in report["gpus"]] == [row["uuid"] for row in SMI]
    for gpu in report["gpus"]:
        assert gpu["provenance"] == {"layer": "A", "source": "nvml"}
        assert gpu["health"]["state"] == "healthy", gpu["health"]
        assert gpu["health"]["eligible"] is True
        assert 0 < gpu["capacity"]["vram"] <= gpu["memory_total"] - gpu["memory_reserved"]
    idle = [g for g, row in zip(report["gpus"], SMI, strict=True) if row["memory.used"] == "0"]
    for gpu in idle:  # the driver's reservation alone must not read as "in use"
        assert "in_use" not in gpu["capacity"]["reasons"], gpu["capacity"]
    assert report["capacity"]["allocatable_gpus"] == len(SMI)
    assert report["probes"][0] == {"source": "nvml", "error": None, "devices": len(SMI)}


_HOLD = textwrap.dedent(
    """
    import sys, torch
    x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda:0")
    x.fill_(1)
    torch.cuda.synchronize()
    print("held", flush=True)
    sys.stdin.read()
    """
)


def test_memory_a_process_takes_shows_as_used() -> None:
    """Layer A is what the GPU says now: 4 GiB taken by another process must appear."""
    pytest.importorskip("torch")
    take = 4 << 30
    uuid = SMI[0]["uuid"]

    def used() -> int:
        probe = NvmlProbe(watch_xids=False)
        try:
            device = next(d for d in probe.probe().devices if d.uuid == uuid)
        finally:
            probe.close()
        assert device.memory_used is not None
        return device.memory_used

    before = used()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(take)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=child_env(CUDA_VISIBLE_DEVICES=uuid),
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        during = used()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    assert during - before >= take, (before, during)
