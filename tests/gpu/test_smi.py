"""The nvidia-smi probe (the fallback when NVML cannot load): CSV fields, old drivers,
lost GPUs, hangs."""

from __future__ import annotations

import pytest

from populi_p2p.gpu import (
    MIB,
    HealthState,
    LocalProber,
    NvidiaSmiProbe,
    NvmlProbe,
    Source,
    Vendor,
    build_report,
    parse_nvidia_smi_csv,
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
