"""`gpu._present`: the ``populi-node gpus`` table and JSON, and the ``members`` summary."""

from __future__ import annotations

import json

import attrs
import pytest

from populi_p2p.gpu import (
    GIB,
    MIB,
    CpuInfo,
    DeclaredGpu,
    GpuDevice,
    HardwareFacts,
    MigDevice,
    ProbeStatus,
    Source,
    Vendor,
    build_report,
    format_gpu_table,
    member_gpu_summary,
    report_to_dict,
    report_to_json,
)
from populi_p2p.gpu._health import DeviceHealth, Reason
from populi_p2p.gpu._present import REASON_TEXT, describe_health, short_name

from .gpu_helpers import CPU, eight_gpu_report, h100


def test_table_shows_health_reasons_sources_and_layer_c():
    facts = HardwareFacts(
        devices=(
            h100(0),
            h100(1, temperature_c=92, throttle_thermal=True),
            h100(2, lost=True, error="nvmlDeviceGetUUID: GPU is lost", memory_total=None),
        ),
        cpu=CPU,
        probes=(
            ProbeStatus(Source.NVML, None, 3),
            ProbeStatus(Source.ROCM_SMI, "rocm-smi: timed out after 20s"),
        ),
        driver_version="550.54.14",
        cuda_driver_version="12.4",
    )
    report = build_report(facts, labels={"region": "eu"}, declared=[DeclaredGpu("A100", 2)])
    table = format_gpu_table(report)
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["GPU", "NAME"]
    assert "healthy" in lines[1]
    assert "degraded: thermal throttling, high temperature (92C)" in lines[2]
    assert "unhealthy: lost from driver (nvmlDeviceGetUUID: GPU is lost)" in lines[3]
    assert "0MiB (unhealthy)" in lines[3]
    assert "probe rocm-smi: error: rocm-smi: timed out after 20s" in table
    assert "driver 550.54.14, CUDA 12.4" in table
    assert "avx512" in table
    assert "Labels [C, operator]: region=eu" in table
    assert "Declared GPU [C, declared, not verified, never offered]: 2\u00d7A100" in table


def test_table_without_gpus():
    table = format_gpu_table(build_report(HardwareFacts(cpu=CPU)))
    assert table.startswith("No GPUs found.")
    assert "Offered [B, derived]: 0MiB on 0 of 0 GPU(s)" in table


def test_json_form_has_provenance_everywhere():
    report = eight_gpu_report(declared=[DeclaredGpu("A100")], labels={"a": "b"})
    data = json.loads(report_to_json(report))
    assert data == json.loads(json.dumps(report_to_dict(report)))
    gpu = data["gpus"][0]
    assert gpu["provenance"] == {"layer": "A", "source": "nvml"}
    assert gpu["capacity"]["provenance"] == {"layer": "B", "source": "derived"}
    assert gpu["health"] == {
        "state": "healthy",
        "reasons": [],
        "eligible": True,
        "summary": "healthy",
    }
    assert data["cpu"]["provenance"]["layer"] == "A"
    assert data["labels"]["provenance"] == {"layer": "C", "source": "operator"}
    assert data["declared_gpus"][0]["provenance"] == {"layer": "C", "source": "declared"}


def test_member_summary_marks_verified_and_declared():
    def rtx(i, **kw):
        return attrs.evolve(h100(i), name="NVIDIA GeForce RTX 4090", memory_total=24564 * MIB, **kw)

    verified = build_report(HardwareFacts(devices=(rtx(0), rtx(1)))).to_record()
    assert member_gpu_summary(verified) == "2\u00d7RTX 4090 24GiB (verified)"
    declared = build_report(HardwareFacts(), declared=[DeclaredGpu("A100")]).to_record()
    assert member_gpu_summary(declared) == "1\u00d7A100 (declared)"
    both = build_report(
        HardwareFacts(devices=(rtx(0), rtx(1, lost=True, error="GPU is lost"))),
        declared=[DeclaredGpu("H100", 4, 80 * GIB)],
    ).to_record()
    assert member_gpu_summary(both) == (
        "2\u00d7RTX 4090 24GiB (verified, 1 unhealthy); 4\u00d7H100 80GiB (declared)"
    )
    assert member_gpu_summary(build_report(HardwareFacts()).to_record()) == "no GPU"
    assert member_gpu_summary(None) == "no GPU record"


@pytest.mark.parametrize(
    ("changes", "reasons", "expected"),
    [
        ({}, (), "healthy"),
        ({"temperature_c": 91}, (Reason.THERMAL_THROTTLE, Reason.HIGH_TEMPERATURE),
         "degraded: thermal throttling, high temperature (91C)"),
        ({"temperature_c": None}, (Reason.HIGH_TEMPERATURE,), "degraded: high temperature"),
        ({"xids": (79, 48)}, (Reason.XID_FATAL,), "unhealthy: fatal XID error (79, 48)"),
        ({"xids": (13,)}, (Reason.XID,), "degraded: XID error (13)"),
        ({"ecc_uncorrected": 4}, (Reason.ECC_UNCORRECTED,),
         "unhealthy: uncorrected ECC errors (4)"),
        ({"ecc_corrected": 0}, (Reason.ECC_CORRECTED,), "degraded: corrected ECC errors"),
        ({"ecc_corrected": 12}, (Reason.ECC_CORRECTED,), "degraded: corrected ECC errors (12)"),
        ({"error": "nvml: boom"}, (Reason.PROBE_ERROR,), "unhealthy: probe error (nvml: boom)"),
        ({}, (Reason.DRIVER_BLOCKLISTED,), "degraded: driver on blocklist (disqualified)"),
    ],
)  # fmt: skip
def test_describe_health_puts_each_reason_in_words_with_its_figure(
    changes, reasons, expected
) -> None:
    device = h100(0, **changes)
    assert describe_health(device, DeviceHealth.from_reasons(reasons)) == expected


def test_every_reason_has_words() -> None:
    for reason in Reason:
        text = describe_health(h100(0), DeviceHealth.from_reasons((reason,)))
        words = REASON_TEXT[reason]
        assert words != str(reason) and text.split(": ", 1)[1].startswith(words), reason


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("AMD Radeon Pro W7900", "Pro W7900"),
        ("Apple M2 Max", "M2 Max"),
        ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3"),
        ("NVIDIA ", "NVIDIA "),  # never down to nothing
        ("Tesla T4", "Tesla T4"),
    ],
)
def test_short_name_drops_vendor_prefixes(name: str, short: str) -> None:
    assert short_name(name) == short


def test_table_shows_mig_partitions_unified_memory_and_an_unknown_cpu() -> None:
    mig = h100(
        0,
        mig_enabled=True,
        mig_devices=(MigDevice(0, "MIG-aaaa", 9728 * MIB, 9700 * MIB, 1, 0),),
    )
    apple = GpuDevice(1, "apple-1", "Apple M2 Max", Vendor.APPLE, Source.SYSTEM_PROFILER,
                      memory_total=32 * GIB, unified_memory=True)  # fmt: skip
    cpu = CpuInfo(error="no /proc/cpuinfo")
    lines = format_gpu_table(build_report(HardwareFacts(devices=(mig, apple), cpu=cpu)))
    rows = lines.splitlines()
    assert rows[2].split()[:3] == ["0/0", "MIG", "MIG-aaaa"]
    assert "32GiB unified" in rows[3]
    assert "CPU: unknown (no /proc/cpuinfo)" in lines


def test_a_hostile_device_name_cannot_drive_the_terminal() -> None:
    evil = h100(0, name="H100\x1b[2J\nforged row")
    table = format_gpu_table(build_report(HardwareFacts(devices=(evil,), cpu=CPU)))
    assert "\x1b" not in table and "\\x1b[2J\\nforged row" in table


def test_an_unreadable_record_is_said_so() -> None:
    assert member_gpu_summary({"v": "not a version"}) == "GPU record unreadable"
    record = build_report(
        HardwareFacts(devices=(attrs.evolve(h100(0), memory_total=None),))
    ).to_record()
    assert member_gpu_summary(record) == "1\u00d7H100 80GB HBM3 (verified)"
