"""The non-NVML probes: nvidia-smi CSV, rocm-smi/amd-smi JSON, system_profiler, /proc."""

from __future__ import annotations

import pytest

from populi_p2p.gpu import (
    GIB,
    MIB,
    AppleProbe,
    CpuProbe,
    HealthState,
    LocalProber,
    NvidiaSmiProbe,
    NvmlProbe,
    RocmProbe,
    Source,
    Vendor,
    build_report,
    parse_amd_smi_json,
    parse_cpuinfo,
    parse_nvidia_smi_csv,
    parse_rocm_smi_json,
    parse_system_profiler_json,
)
from populi_p2p.gpu._smi import FIELDS_OLD

from .gpu_helpers import fixture_path, real_nvml_present

FAKE_SMI = str(fixture_path("fake_nvidia_smi.sh"))

########################################################################################
# nvidia-smi
########################################################################################


def test_parse_nvidia_smi_full():
    devices, driver = parse_nvidia_smi_csv(fixture_path("nvidia_smi_full.csv").read_text())
    assert driver == "550.54.14"
    rtx, a100 = devices
    assert rtx.source is Source.NVIDIA_SMI and rtx.vendor is Vendor.NVIDIA
    assert rtx.uuid == "GPU-0c1a5b2e-7f3d-4e1a-9b8c-1d2e3f4a5b6c"
    assert rtx.compute_capability == (8, 9)
    assert rtx.memory_total == 24564 * MIB and rtx.memory_free == 23108 * MIB
    assert rtx.power_draw_w == pytest.approx(35.12)
    assert rtx.throttle_thermal is False
    assert rtx.ecc_corrected is None and rtx.mig_enabled is None  # [N/A] is unknown
    assert a100.throttle_thermal is True and a100.throttle_power is False
    assert a100.ecc_corrected == 3 and a100.ecc_uncorrected == 0
    assert a100.mig_enabled is False
    assert a100.temperature_c == 91


def test_parse_nvidia_smi_lost_line():
    devices, _ = parse_nvidia_smi_csv(fixture_path("nvidia_smi_lost.csv").read_text())
    good, lost = devices
    assert good.lost is False and good.memory_total == 46068 * MIB
    assert lost.lost is True and "GPU is lost" in (lost.error or "")


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "garbage", "0, only, three", ",,,,,,,,,,,,,,,,,,,", "x" * 10000],
)
def test_parse_nvidia_smi_malformed_is_skipped(text):
    devices, _ = parse_nvidia_smi_csv(text)
    assert devices == ()


def test_nvidia_smi_probe_via_fake_tool(monkeypatch):
    monkeypatch.setenv("FAKE_SMI_CSV", str(fixture_path("nvidia_smi_full.csv")))
    result = NvidiaSmiProbe(FAKE_SMI).probe()
    assert result.error is None
    assert [d.name for d in result.devices] == ["NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB"]


def test_nvidia_smi_old_driver_retries_with_old_field_names(monkeypatch):
    monkeypatch.setenv("FAKE_SMI_CSV", str(fixture_path("nvidia_smi_old.csv")))
    monkeypatch.setenv("FAKE_SMI_OLD", "1")
    result = NvidiaSmiProbe(FAKE_SMI).probe()
    assert result.error is None, result.error
    (v100,) = result.devices
    assert v100.name == "Tesla V100-PCIE-16GB"
    assert v100.compute_capability is None  # not askable on this driver
    assert v100.memory_total == 16160 * MIB
    assert result.driver_version == "470.182.03"
    assert len(FIELDS_OLD) == 19


def test_nvidia_smi_no_devices_is_not_an_error(monkeypatch):
    monkeypatch.setenv("FAKE_SMI_MODE", "nodevices")
    result = NvidiaSmiProbe(FAKE_SMI).probe()
    assert result.error is None and result.devices == ()


def test_nvidia_smi_lost_gpu_keeps_the_good_one(monkeypatch):
    monkeypatch.setenv("FAKE_SMI_CSV", str(fixture_path("nvidia_smi_lost.csv")))
    monkeypatch.setenv("FAKE_SMI_MODE", "lost")
    result = NvidiaSmiProbe(FAKE_SMI).probe()
    assert [d.lost for d in result.devices] == [False, True]


def test_nvidia_smi_hang_is_killed(monkeypatch):
    monkeypatch.setenv("FAKE_SMI_MODE", "hang")
    result = NvidiaSmiProbe(FAKE_SMI, timeout=0.3).probe()
    assert result.devices == ()
    assert result.error is not None and "timed out after 0.3s" in result.error


def test_nvidia_smi_missing():
    result = NvidiaSmiProbe("/nonexistent/nvidia-smi").probe()
    assert result.error is not None and result.devices == ()


async def test_local_prober_falls_back_to_nvidia_smi_when_nvml_cannot_load(monkeypatch):
    """The real NvmlProbe in this process (no libnvidia-ml here), then the fake tool."""
    if real_nvml_present():
        pytest.skip("a real libnvidia-ml is installed here; NVML would load")
    monkeypatch.setenv("FAKE_SMI_CSV", str(fixture_path("nvidia_smi_full.csv")))
    prober = LocalProber(
        nvml=NvmlProbe(), nvidia_smi=NvidiaSmiProbe(FAKE_SMI), rocm=None, apple=None
    )
    facts = await prober.probe()
    assert [p.source for p in facts.probes] == [Source.NVML, Source.NVIDIA_SMI]
    assert facts.probes[0].error == "nvmlInit: NVML Shared Library Not Found"
    assert facts.probes[1].error is None and facts.probes[1].devices == 2
    assert {d.source for d in facts.devices} == {Source.NVIDIA_SMI}
    report = build_report(facts)
    assert [h.state for h in report.health] == [HealthState.HEALTHY, HealthState.DEGRADED]
    assert facts.cpu.cores_logical is not None


########################################################################################
# AMD
########################################################################################


def test_parse_rocm_smi():
    devices, driver = parse_rocm_smi_json(fixture_path("rocm_smi_two.json").read_text())
    assert driver == "6.7.0"
    xtx, mi210 = devices
    assert xtx.vendor is Vendor.AMD and xtx.source is Source.ROCM_SMI
    assert xtx.name == "Radeon RX 7900 XTX"
    assert xtx.uuid == "AMD-0x5c8e4f1a2b3c4d5e"
    assert xtx.memory_total == 25753026560
    assert xtx.memory_free == 25753026560 - 3087007744
    assert xtx.temperature_c == 52  # junction preferred over edge
    assert xtx.power_draw_w == 41.0 and xtx.power_limit_w == 327.0
    assert xtx.utilization_gpu == 7 and xtx.utilization_memory == 12
    assert xtx.compute_capability is None  # not CUDA: the FP16 rule does not apply
    assert mi210.uuid == "rocm-0000:c1:00.0"  # no unique id: fall back to the bus
    assert mi210.name == "AMD Instinct MI210"
    assert mi210.power_draw_w == 42.0


def test_parse_amd_smi():
    (mi300,) = parse_amd_smi_json(
        fixture_path("amd_smi_static.json").read_text(),
        fixture_path("amd_smi_metric.json").read_text(),
    )
    assert mi300.source is Source.AMD_SMI
    assert mi300.name == "AMD Instinct MI300X"
    assert mi300.uuid == "AMD-0x1F2E3D4C5B6A7988"
    assert mi300.memory_total == 196592 * MIB
    assert mi300.memory_free == 196307 * MIB
    assert mi300.temperature_c == 44
    assert mi300.power_draw_w == 140.0


@pytest.mark.parametrize("text", ["{}", '{"card0": "nope"}', '{"system": {}}', '{"cardX": {}}'])
def test_parse_rocm_smi_empty_or_odd(text):
    devices, _ = parse_rocm_smi_json(text)
    assert devices == ()


@pytest.mark.parametrize("text", ["", "not json", "[1, 2", "[]", "3"])
def test_parse_rocm_smi_invalid_raises_value_error(text):
    with pytest.raises(ValueError):
        parse_rocm_smi_json(text)


def test_rocm_probe_bad_output_is_reported(tmp_path):
    tool = tmp_path / "rocm-smi"
    tool.write_text("#!/bin/sh\necho 'this is not json'\n")
    tool.chmod(0o755)
    result = RocmProbe(rocm_smi=str(tool), amd_smi="/nonexistent/amd-smi").probe()
    assert result.devices == ()
    assert result.error is not None and "unparseable" in result.error


def test_rocm_probe_via_fake_tool(tmp_path):
    tool = tmp_path / "rocm-smi"
    tool.write_text(f"#!/bin/sh\ncat '{fixture_path('rocm_smi_two.json')}'\n")
    tool.chmod(0o755)
    result = RocmProbe(rocm_smi=str(tool)).probe()
    assert result.error is None and len(result.devices) == 2


########################################################################################
# Apple
########################################################################################


def test_parse_system_profiler_apple_silicon_unified():
    (gpu,) = parse_system_profiler_json(fixture_path("system_profiler_m2max.json").read_text())
    assert gpu.vendor is Vendor.APPLE and gpu.source is Source.SYSTEM_PROFILER
    assert gpu.name == "Apple M2 Max"
    assert gpu.unified_memory is True
    assert gpu.memory_total == 64 * GIB  # the machine's RAM, shared
    assert gpu.uuid == "apple-8F1A2B3C-4D5E-6F70-8192-A3B4C5D6E7F8-0"


def test_parse_system_profiler_intel_mac_discrete_amd():
    igpu, dgpu = parse_system_profiler_json(
        fixture_path("system_profiler_intel_amd.json").read_text()
    )
    assert dgpu.vendor is Vendor.AMD and dgpu.unified_memory is False
    assert dgpu.memory_total == 8 * GIB
    assert igpu.unified_memory is False


def test_apple_unified_memory_offers_a_fraction():
    from populi_p2p.gpu import HardwareFacts

    devices = parse_system_profiler_json(fixture_path("system_profiler_m2max.json").read_text())
    report = build_report(HardwareFacts(devices=devices))
    assert report.capacity.devices[0].vram == int(64 * GIB * 0.75)


def test_apple_probe_not_available_off_macos():
    import sys

    if sys.platform == "darwin":
        pytest.skip("on macOS the probe is available")
    assert AppleProbe().available() is False


########################################################################################
# CPU
########################################################################################


def test_parse_cpuinfo_xeon():
    cpu = parse_cpuinfo(
        fixture_path("cpuinfo_xeon.txt").read_text(),
        fixture_path("meminfo.txt").read_text(),
        "x86_64",
    )
    assert cpu.model == "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"
    assert cpu.cores_logical == 4 and cpu.cores_physical == 2
    assert (cpu.avx, cpu.avx2, cpu.avx512) == (True, True, True)
    assert cpu.ram_total == 131899356 * 1024


def test_parse_cpuinfo_arm_has_no_avx_and_unknown_physical_cores():
    cpu = parse_cpuinfo(fixture_path("cpuinfo_arm.txt").read_text(), None, "aarch64")
    assert cpu.cores_logical == 2 and cpu.cores_physical is None
    assert (cpu.avx, cpu.avx2, cpu.avx512) == (False, False, False)
    assert cpu.ram_total is None


def test_cpu_probe_this_machine():
    cpu = CpuProbe().probe()
    assert cpu.error is None
    assert cpu.cores_logical is not None and cpu.cores_logical >= 1
    assert cpu.ram_total is not None and cpu.ram_total > 0


def test_cpu_probe_unreadable_file_reports_error(tmp_path):
    cpu = CpuProbe(cpuinfo_path=str(tmp_path / "missing")).probe()
    if cpu.source is Source.SYSCTL:  # pragma: no cover - macOS
        return
    assert cpu.error is not None and "unreadable" in cpu.error
