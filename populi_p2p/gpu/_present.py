"""Presentation: the ``populi-node gpus`` table and JSON, and the ``members`` summary.

Theory of operation
-------------------
People read these to answer "what does this machine really have, what does it offer, and
why not more". So the table puts the health reasons in words next to each device, says
which probe filled each row, shows probe failures instead of hiding them, and prints
Layer C (labels, declared GPUs) under its own heading, marked as declared. The JSON form
uses long key names and a ``provenance`` object (``{"layer", "source"}``) on every
section, for scripts. The member summary is one short string built from a peer's record,
with "verified" and "declared" spelled out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._terminal import format_table
from ._capacity import CapacityReason, DeviceCapacity
from ._facts import CpuInfo, GpuDevice
from ._health import DeviceHealth, HealthState, Reason
from ._labels import format_size
from ._report import SOURCE_DECLARED, SOURCE_DERIVED, SOURCE_OPERATOR, GpuReport

REASON_TEXT = {
    Reason.THERMAL_THROTTLE: "thermal throttling",
    Reason.HIGH_TEMPERATURE: "high temperature",
    Reason.ECC_CORRECTED: "corrected ECC errors",
    Reason.XID: "XID error",
    Reason.REPEATED_THROTTLE: "repeated thermal throttling (disqualified)",
    Reason.DRIVER_BLOCKLISTED: "driver on blocklist (disqualified)",
    Reason.ERROR_RATE: "inference error rate too high (disqualified)",
    Reason.LOST: "lost from driver",
    Reason.PROBE_ERROR: "probe error",
    Reason.ECC_UNCORRECTED: "uncorrected ECC errors",
    Reason.XID_FATAL: "fatal XID error",
    Reason.VRAM_SHORT: "not enough VRAM",
    Reason.COMPUTE_CAPABILITY: "compute capability too low",
}
CAPACITY_TEXT = {
    CapacityReason.UNHEALTHY: "unhealthy",
    CapacityReason.DISQUALIFIED: "disqualified",
    CapacityReason.WITHHELD: "withheld by owner",
    CapacityReason.MIG_NO_INSTANCES: "MIG on, no instances",
    CapacityReason.MEMORY_UNKNOWN: "memory unknown",
    CapacityReason.RESERVED: "reserve",
    CapacityReason.LEASED: "leased",
    CapacityReason.IN_USE: "in use",
}
#: U+00D7, the multiplication sign: "2\u00d7RTX 4090" reads better than "2xRTX 4090".
TIMES = "\u00d7"
_PREFIXES = ("NVIDIA ", "GeForce ", "AMD ", "Radeon ", "Apple ")


def describe_health(device: GpuDevice, health: DeviceHealth) -> str:
    """``"degraded: thermal throttling, high temperature (91C)"``."""
    if health.state is HealthState.HEALTHY:
        return "healthy"
    parts = []
    for reason in health.reasons:
        text = REASON_TEXT.get(reason, str(reason))
        if reason is Reason.HIGH_TEMPERATURE and device.temperature_c is not None:
            text += f" ({device.temperature_c}C)"
        elif reason in (Reason.XID, Reason.XID_FATAL) and device.xids:
            text += f" ({', '.join(map(str, device.xids))})"
        elif reason is Reason.ECC_UNCORRECTED and device.ecc_uncorrected:
            text += f" ({device.ecc_uncorrected})"
        elif reason is Reason.ECC_CORRECTED and device.ecc_corrected:
            text += f" ({device.ecc_corrected})"
        elif reason in (Reason.LOST, Reason.PROBE_ERROR) and device.error:
            text += f" ({device.error})"
        parts.append(text)
    return f"{health.state}: {', '.join(parts)}"


def short_name(name: str) -> str:
    """``"NVIDIA GeForce RTX 4090"`` -> ``"RTX 4090"``."""
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if name.startswith(prefix) and len(name) > len(prefix):
                name = name[len(prefix) :]
                changed = True
    return name


def _offered(cap: DeviceCapacity) -> str:
    text = format_size(cap.vram)
    if cap.reasons:
        text += f" ({', '.join(CAPACITY_TEXT.get(r, str(r)) for r in cap.reasons)})"
    return text


def _cpu_line(cpu: CpuInfo) -> str:
    if cpu.error and cpu.model is None:
        return f"CPU: unknown ({cpu.error})"
    flags = " ".join(
        n for n, on in (("avx", cpu.avx), ("avx2", cpu.avx2), ("avx512", cpu.avx512)) if on
    )
    cores = f"{cpu.cores_physical or '?'} cores / {cpu.cores_logical or '?'} threads"
    return (
        f"CPU: {cpu.model or 'unknown'} ({cpu.arch or '?'}), {cores}, "
        f"{flags or 'no AVX'}, {format_size(cpu.ram_total)} RAM  [A, {cpu.source}]"
    )


def _table(rows: list[list[str]]) -> list[str]:
    """The rows (header first) as aligned lines, every cell terminal-safe."""
    return format_table(rows[1:], rows[0]).split("\n")


_HEADER = (
    "GPU",
    "NAME",
    "MEMORY used/total",
    "OFFERED [B]",
    "TEMP",
    "POWER",
    "UTIL",
    "CC",
    "SOURCE [A]",
    "HEALTH",
)


def format_gpu_table(report: GpuReport) -> str:
    """The human form of ``populi-node gpus``: one row per device with its health
    reasons, MIG partitions under their GPU, then probes, CPU and Layer C."""
    facts = report.facts
    lines: list[str] = []
    if facts.devices:
        rows = [list(_HEADER)]
        for d, h, c in zip(facts.devices, report.health, report.capacity.devices, strict=True):
            rows.extend(_device_rows(d, h, c))
        lines.extend(_table(rows))
    else:
        lines.append("No GPUs found.")
    lines.extend(_footer_lines(report))
    return "\n".join(lines)


def _device_rows(d: GpuDevice, h: DeviceHealth, c: DeviceCapacity) -> list[list[str]]:
    """A device's row in the table, then one row per MIG partition."""
    memory = f"{format_size(d.memory_used)}/{format_size(d.memory_total)}"
    if d.unified_memory:
        memory = f"{format_size(d.memory_total)} unified"
    power = "-"
    if d.power_draw_w is not None:
        power = f"{d.power_draw_w:.0f}W"
        if d.power_limit_w is not None:
            power += f"/{d.power_limit_w:.0f}W"
    rows = [
        [
            str(d.index),
            d.name,
            memory,
            _offered(c),
            f"{d.temperature_c}C" if d.temperature_c is not None else "-",
            power,
            f"{d.utilization_gpu}%" if d.utilization_gpu is not None else "-",
            f"{d.compute_capability[0]}.{d.compute_capability[1]}" if d.compute_capability else "-",
            str(d.source),
            describe_health(d, h),
        ]
    ]
    for m, p in zip(d.mig_devices, c.partitions or [None] * len(d.mig_devices), strict=True):
        rows.append(
            [
                f" {d.index}/{m.index}",
                f"MIG {m.uuid}",
                f"{format_size(m.memory_total)}",
                format_size(p.vram) if p is not None else "0MiB",
                "", "", "", "", str(d.source), "",
            ]
        )  # fmt: skip
    return rows


def _footer_lines(report: GpuReport) -> list[str]:
    """The lines under the table: versions, probes, CPU, what is offered, Layer C."""
    facts = report.facts
    lines: list[str] = []
    versions = []
    if facts.driver_version:
        versions.append(f"driver {facts.driver_version}")
    if facts.cuda_driver_version:
        versions.append(f"CUDA {facts.cuda_driver_version}")
    if versions:
        lines.append(", ".join(versions))
    for status in facts.probes:
        outcome = f"error: {status.error}" if status.error else f"ok, {status.devices} device(s)"
        lines.append(f"probe {status.source}: {outcome}")
    lines.append(_cpu_line(facts.cpu))
    lines.append(
        f"Offered [B, {SOURCE_DERIVED}]: {format_size(report.capacity.vram_total)} on "
        f"{report.capacity.allocatable_devices} of {len(facts.devices)} GPU(s)"
    )
    if report.labels:
        text = ", ".join(f"{k}={v}" for k, v in report.labels)
        lines.append(f"Labels [C, {SOURCE_OPERATOR}]: {text}")
    for g in report.declared:
        vram = f" {format_size(g.vram)}" if g.vram is not None else ""
        lines.append(
            f"Declared GPU [C, {SOURCE_DECLARED}, not verified, never offered]: "
            f"{g.count}{TIMES}{g.model}{vram}"
        )
    return lines


def report_to_dict(report: GpuReport) -> dict[str, Any]:
    """The JSON form of ``populi-node gpus --json``: long keys, bytes as integers, and a
    ``provenance`` object on every section."""
    devices = zip(report.facts.devices, report.health, report.capacity.devices, strict=True)
    return {
        "gpus": [_device_to_dict(d, h, c) for d, h, c in devices],
        "driver_version": report.facts.driver_version,
        "cuda_driver_version": report.facts.cuda_driver_version,
        "probes": [
            {"source": str(p.source), "error": p.error, "devices": p.devices}
            for p in report.facts.probes
        ],
        "cpu": _cpu_to_dict(report.facts.cpu),
        "capacity": {
            "vram_total": report.capacity.vram_total,
            "allocatable_gpus": report.capacity.allocatable_devices,
            "provenance": {"layer": "B", "source": SOURCE_DERIVED},
        },
        "labels": {
            "values": dict(report.labels),
            "provenance": {"layer": "C", "source": SOURCE_OPERATOR},
        },
        "declared_gpus": [
            {
                "model": g.model,
                "count": g.count,
                "vram": g.vram,
                "provenance": {"layer": "C", "source": SOURCE_DECLARED},
            }
            for g in report.declared
        ],
    }


def _device_to_dict(d: GpuDevice, h: DeviceHealth, c: DeviceCapacity) -> dict[str, Any]:
    """One entry of the JSON's ``gpus``: Layer A's facts, its health, Layer B's offer."""
    return {
        "index": d.index,
        "uuid": d.uuid,
        "name": d.name,
        "vendor": str(d.vendor),
        "pci_bus_id": d.pci_bus_id,
        "compute_capability": list(d.compute_capability) if d.compute_capability else None,
        "memory_total": d.memory_total,
        "memory_used": d.memory_used,
        "memory_free": d.memory_free,
        "memory_reserved": d.memory_reserved,
        "unified_memory": d.unified_memory,
        "utilization_gpu": d.utilization_gpu,
        "utilization_memory": d.utilization_memory,
        "temperature_c": d.temperature_c,
        "power_draw_w": d.power_draw_w,
        "power_limit_w": d.power_limit_w,
        "throttle_thermal": d.throttle_thermal,
        "throttle_power": d.throttle_power,
        "ecc_corrected": d.ecc_corrected,
        "ecc_uncorrected": d.ecc_uncorrected,
        "mig_enabled": d.mig_enabled,
        "mig_devices": [
            {
                "index": m.index,
                "uuid": m.uuid,
                "memory_total": m.memory_total,
                "memory_free": m.memory_free,
                "gpu_instance_id": m.gpu_instance_id,
                "compute_instance_id": m.compute_instance_id,
            }
            for m in d.mig_devices
        ],
        "xids": list(d.xids),
        "error": d.error,
        "lost": d.lost,
        "health": {
            "state": str(h.state),
            "reasons": [str(r) for r in h.reasons],
            "eligible": h.eligible,
            "summary": describe_health(d, h),
        },
        "provenance": {"layer": "A", "source": str(d.source)},
        "capacity": {
            "vram": c.vram,
            "largest_unit": c.largest_unit,
            "partitions": [{"uuid": p.uuid, "vram": p.vram} for p in c.partitions],
            "reasons": [str(r) for r in c.reasons],
            "provenance": {"layer": "B", "source": SOURCE_DERIVED},
        },
    }


def _cpu_to_dict(cpu: CpuInfo) -> dict[str, Any]:
    """The JSON's ``cpu`` section (Layer A)."""
    return {
        "model": cpu.model,
        "arch": cpu.arch,
        "cores_logical": cpu.cores_logical,
        "cores_physical": cpu.cores_physical,
        "avx": cpu.avx,
        "avx2": cpu.avx2,
        "avx512": cpu.avx512,
        "ram_total": cpu.ram_total,
        "error": cpu.error,
        "provenance": {"layer": "A", "source": str(cpu.source)},
    }


def report_to_json(report: GpuReport) -> str:
    """:func:`report_to_dict` as indented JSON text."""
    return json.dumps(report_to_dict(report), indent=2, sort_keys=False)


def member_gpu_summary(record: Mapping[str, Any] | None) -> str:
    """One short string for ``populi-node members`` from a member's GPU record, e.g.
    ``"2xRTX 4090 24GiB (verified)"``, ``"1xA100 (declared)"`` (with the multiplication sign
    U+00D7 for the x), or both joined by
    ``"; "``. Unhealthy verified GPUs are counted; a malformed record never raises."""
    if record is None:
        return "no GPU record"
    try:
        report = GpuReport.from_record(record)
    except ValueError:
        return "GPU record unreadable"
    groups: dict[tuple[str, str], list[int]] = {}
    for d, h in zip(report.facts.devices, report.health, strict=True):
        size = format_size(d.memory_total) if d.memory_total is not None else ""
        if d.unified_memory:
            size += " unified"
        counts = groups.setdefault((short_name(d.name), size), [0, 0])
        counts[0] += 1
        if h.state is HealthState.UNHEALTHY:
            counts[1] += 1
    parts = []
    for (name, size), (count, unhealthy) in groups.items():
        label = f"{count}{TIMES}{name}{' ' + size if size else ''}"
        note = "verified" if not unhealthy else f"verified, {unhealthy} unhealthy"
        parts.append(f"{label} ({note})")
    for g in report.declared:
        size = f" {format_size(g.vram)}" if g.vram is not None else ""
        parts.append(f"{g.count}{TIMES}{short_name(g.model)}{size} (declared)")
    return "; ".join(parts) if parts else "no GPU"
