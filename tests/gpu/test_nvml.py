"""NvmlProbe through the real nvidia-ml-py binding against the fake libnvidia-ml.so.1."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from populi_p2p.gpu import (
    MIB,
    CapacityReason,
    HardwareFacts,
    HealthState,
    Reason,
    Source,
    build_report,
)
from populi_p2p.gpu._facts import CpuInfo

from .gpu_helpers import child_env, fixture_path, real_nvml_present, result_from_json


def report_of(result):  # one probe result -> a full report
    return build_report(HardwareFacts.from_results((result,), CpuInfo()))


def test_two_healthy_gpus(nvml_child):
    (result,) = nvml_child("nvml_two_healthy.txt")
    assert result.error is None
    assert result.source is Source.NVML
    assert result.driver_version == "550.54.14"
    assert result.cuda_driver_version == "12.4"
    first, second = result.devices
    assert first.index == 0 and second.index == 1
    assert first.uuid == "GPU-0c1a5b2e-7f3d-4e1a-9b8c-1d2e3f4a5b6c"
    assert first.name == "NVIDIA GeForce RTX 4090"
    assert first.pci_bus_id == "00000000:01:00.0"
    assert first.compute_capability == (8, 9)
    assert first.memory_total == 25757220864
    assert first.memory_used == 1073741824
    assert first.memory_free == 25757220864 - 1073741824
    assert (first.utilization_gpu, first.utilization_memory) == (3, 1)
    assert first.temperature_c == 41
    assert first.power_draw_w == 35.0 and first.power_limit_w == 450.0
    # Only the idle bit: neither thermal nor power throttling.
    assert first.throttle_thermal is False and first.throttle_power is False
    # GeForce: ECC and MIG are NOT_SUPPORTED, which must read as unknown, not zero.
    assert first.ecc_corrected is None and first.ecc_uncorrected is None
    assert first.mig_enabled is None
    report = report_of(result)
    assert [h.state for h in report.health] == [HealthState.HEALTHY, HealthState.HEALTHY]
    assert report.capacity.devices[0].vram == first.memory_free
    assert report.capacity.allocatable_devices == 2


def test_the_drivers_reservation_is_not_taken_for_use(nvml_child):
    """An idle H200 as its real driver reports it (docs/gpu.md): NVML's v1 memory info
    counts the driver's 615 MiB as used, which made an idle GPU read as "in use". The
    probe asks v2, which reports the reservation apart, as ``nvidia-smi`` shows it."""
    (result,) = nvml_child("nvml_idle_reserved.txt")
    (gpu,) = result.devices
    assert gpu.memory_reserved == 644939776
    assert gpu.memory_used == 0
    assert gpu.memory_free == 150754820096 - 644939776
    report = report_of(result)
    (capacity,) = report.capacity.devices
    assert capacity.vram == gpu.memory_free
    assert CapacityReason.IN_USE not in capacity.reasons
    # Without v2 (the other fixtures: drivers before 510), v1 still serves.
    (older,) = nvml_child("nvml_hot_throttling.txt")
    assert all(d.memory_reserved is None and d.memory_used is not None for d in older.devices)


def test_one_gpu_throttling_hot(nvml_child):
    (result,) = nvml_child("nvml_hot_throttling.txt")
    (gpu,) = result.devices
    assert gpu.temperature_c == 91
    assert gpu.throttle_thermal is True  # 0x20 | 0x40
    assert gpu.throttle_power is False
    assert gpu.ecc_corrected == 3 and gpu.ecc_uncorrected == 0
    assert gpu.mig_enabled is False
    report = report_of(result)
    (health,) = report.health
    assert health.state is HealthState.DEGRADED
    assert health.reasons == (
        Reason.THERMAL_THROTTLE,
        Reason.HIGH_TEMPERATURE,
        Reason.ECC_CORRECTED,
    )
    # Degraded is still offered; only unhealthy/disqualified drops to zero.
    assert report.capacity.devices[0].vram == gpu.memory_free


def test_gpu_lost_mid_run(nvml_child):
    first, second = nvml_child("nvml_lost_midrun.txt", probes=2)
    assert [d.lost for d in first.devices] == [False, False]
    assert first.devices[1].memory_total == 48305799168
    good, lost = second.devices
    assert good.lost is False and good.memory_total == 48305799168
    # The lost GPU keeps the identity it had, so the mesh sees *that* GPU go.
    assert lost.lost is True
    assert lost.uuid == "GPU-66666666-7777-4888-9999-aaaaaaaaaaaa"
    assert lost.name == "NVIDIA L40S"
    assert "GPU is lost" in (lost.error or "")
    assert lost.memory_total is None
    before, after = report_of(first), report_of(second)
    assert before.capacity.devices[1].vram > 0
    assert after.health[1].state is HealthState.UNHEALTHY
    assert after.health[1].reasons == (Reason.LOST,)
    assert after.capacity.devices[1].vram == 0
    assert after.capacity.devices[1].reasons == (CapacityReason.UNHEALTHY,)
    assert after.capacity.devices[0].vram == before.capacity.devices[0].vram


def test_mig_enabled(nvml_child):
    (result,) = nvml_child("nvml_mig.txt")
    split, empty = result.devices
    assert split.mig_enabled is True and empty.mig_enabled is True
    assert [m.uuid for m in split.mig_devices] == [
        "MIG-0f0e0d0c-0b0a-4909-8807-060504030201",
        "MIG-1a1b1c1d-1e1f-4a2b-8c2d-2e2f3a3b3c3d",
    ]
    assert [(m.gpu_instance_id, m.compute_instance_id) for m in split.mig_devices] == [
        (1, 0),
        (2, 0),
    ]
    assert split.mig_devices[0].memory_total == 42298834944
    assert split.mig_devices[0].memory_free == 42298834944 - 20 * MIB
    assert empty.mig_devices == ()
    report = report_of(result)
    cap_split, cap_empty = report.capacity.devices
    assert [p.vram for p in cap_split.partitions] == [42298834944 - 20 * MIB] * 2
    assert cap_split.vram == sum(p.vram for p in cap_split.partitions)
    assert cap_split.largest_unit == 42298834944 - 20 * MIB  # work must fit one instance
    assert cap_empty.vram == 0
    assert cap_empty.reasons == (CapacityReason.MIG_NO_INSTANCES,)


def test_no_devices(nvml_child):
    (result,) = nvml_child("nvml_no_devices.txt")
    assert result.error is None
    assert result.devices == ()
    assert result.driver_version == "550.54.14"
    assert result.status.devices == 0


def test_fatal_xid_uncorrected_ecc_and_vanished_gpu(nvml_child):
    first, second = nvml_child("nvml_fatal.txt", probes=2)
    report = report_of(first)
    assert first.devices[0].xids == (79,)
    assert report.health[0].state is HealthState.UNHEALTHY
    assert Reason.XID_FATAL in report.health[0].reasons
    assert Reason.ECC_UNCORRECTED in report.health[0].reasons
    assert report.capacity.devices[0].vram == 0
    assert report.health[1].state is HealthState.HEALTHY
    # Second probe: the count dropped to 1; GPU 1 is reported lost, not silently missing.
    assert [d.index for d in second.devices] == [0, 1]
    assert second.devices[1].lost is True
    assert second.devices[1].uuid == "GPU-deadbeef-0000-4000-8000-000000000002"
    assert second.devices[0].xids == ()  # XIDs are reported once, when they happen


def test_driver_not_loaded(nvml_child):
    (result,) = nvml_child("nvml_driver_not_loaded.txt")
    assert result.devices == ()
    assert result.error is not None and result.error.startswith("nvmlInit")
    assert "Driver Not Loaded" in result.error


def test_library_missing(tmp_path):
    if real_nvml_present():
        pytest.skip("a real libnvidia-ml is installed here; cannot simulate its absence")
    from .gpu_helpers import run_nvml_child

    (result,) = run_nvml_child(tmp_path, None)  # empty dir on LD_LIBRARY_PATH
    assert result.devices == ()
    assert result.error == "nvmlInit: NVML Shared Library Not Found"


def test_library_missing_leaves_the_binding_unloaded(tmp_path):
    """Without the library the probe answers as nvidia-ml-py would, and its 2 MiB module
    stays out of memory (idle RSS, issue 23), probe after probe."""
    if real_nvml_present():
        pytest.skip("a real libnvidia-ml is installed here; cannot simulate its absence")
    code = (
        "import sys\n"
        "from populi_p2p.gpu import NvmlProbe\n"
        "probe = NvmlProbe()\n"
        "errors = [probe.probe().error for _ in range(2)]\n"
        "print(errors, 'pynvml' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=child_env(LD_LIBRARY_PATH=str(tmp_path)),
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    error = "nvmlInit: NVML Shared Library Not Found"
    assert proc.stdout.split("\n")[0] == f"{[error, error]} False"


def test_cli_json_end_to_end(fake_nvml_dir: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "populi_p2p.gpu", "--json", "--label", "region=eu-west",
         "--advertise-gpu", "1xH100:80GiB", "--reserve-vram", "1GiB"],
        env=child_env(
            LD_LIBRARY_PATH=str(fake_nvml_dir),
            FAKE_NVML_FIXTURE=str(fixture_path("nvml_two_healthy.txt")),
            PATH="/nonexistent",
        ),
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    data = json.loads(proc.stdout)
    assert [g["name"] for g in data["gpus"]] == ["NVIDIA GeForce RTX 4090"] * 2
    assert data["gpus"][0]["provenance"] == {"layer": "A", "source": "nvml"}
    assert data["gpus"][0]["capacity"]["provenance"] == {"layer": "B", "source": "derived"}
    assert data["gpus"][0]["capacity"]["vram"] == 25757220864 - 1024 * MIB
    assert data["labels"]["values"] == {"region": "eu-west"}
    assert data["declared_gpus"][0]["provenance"] == {"layer": "C", "source": "declared"}
    assert data["capacity"]["vram_total"] == sum(g["capacity"]["vram"] for g in data["gpus"])


def test_cli_table_shows_reasons(fake_nvml_dir: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "populi_p2p.gpu"],
        env=child_env(
            LD_LIBRARY_PATH=str(fake_nvml_dir),
            FAKE_NVML_FIXTURE=str(fixture_path("nvml_hot_throttling.txt")),
            PATH="/nonexistent",
        ),
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert "degraded: thermal throttling, high temperature (91C), corrected ECC errors (3)" in (
        proc.stdout
    )
    assert "probe nvml: ok, 1 device(s)" in proc.stdout


def test_cli_hung_nvml_is_cut_off(fake_nvml_dir: Path):
    """nvmlInit blocks for 30 s; the probe runner gives up after 0.5 s and says so."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "populi_p2p.gpu", "--json", "--timeout", "0.5"],
        env=child_env(
            LD_LIBRARY_PATH=str(fake_nvml_dir),
            FAKE_NVML_FIXTURE=str(fixture_path("nvml_hang.txt")),
            PATH="/nonexistent",
        ),
        capture_output=True, text=True, timeout=25, check=True,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    data = json.loads(proc.stdout)
    assert data["probes"][0]["source"] == "nvml"
    assert data["probes"][0]["error"] == "nvml: timed out after 0.5s"
    assert data["gpus"] == []
    assert elapsed < 20, f"the hung probe held the process for {elapsed:.1f}s"


def test_a_real_h200_probe_makes_a_full_offer_and_survives_the_record():
    """``fixtures/nvml_probe_h200.json`` is what ``NvmlProbe`` returned on a real idle
    H200 (driver 580.159.04; docs/gpu.md): nothing used, 615 MiB kept by the driver."""
    data = json.loads(fixture_path("nvml_probe_h200.json").read_text())
    report = report_of(result_from_json(data))
    (gpu,) = report.facts.devices
    assert gpu.name == "NVIDIA H200" and gpu.compute_capability == (9, 0)
    assert gpu.memory_used == 0 and gpu.memory_reserved == 644939776
    (capacity,) = report.capacity.devices
    assert capacity.vram == gpu.memory_total - gpu.memory_reserved
    assert capacity.reasons == ()
    assert [h.state for h in report.health] == [HealthState.HEALTHY]
    again = type(report).from_record(report.to_record())
    (back,) = again.facts.devices
    assert back.uuid == gpu.uuid
    assert back.memory_reserved == gpu.memory_reserved // MIB * MIB
    assert back.memory_free == back.memory_total - back.memory_reserved
