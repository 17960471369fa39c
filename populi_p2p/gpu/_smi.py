"""Layer A fallback for NVIDIA: ``nvidia-smi --query-gpu`` CSV, when NVML will not load.

Theory of operation
-------------------
NVML is the truth; ``nvidia-smi`` is a client of the same library, so it only helps when
*our* load of NVML fails and the tool still works (a container where the library sits
outside the loader path, a distro that ships only the tool). It is parsed from
``--format=csv,noheader,nounits``: one line per GPU, fields in the order asked, ``[N/A]``
or ``[Not Supported]`` for missing values, memory in MiB and power in watts.

Older drivers reject newer field names ("compute_cap" arrived in 510, the
``clocks_event_reasons`` names in 535); on "not a valid field" the probe retries with
older names and then a minimal set, so it degrades to fewer fields, never to nothing.
"""

from __future__ import annotations

import csv
import io

from ._facts import MIB, GpuDevice, ProbeResult, Source, Vendor
from ._proc import find_tool, run_tool

#: The fields asked for, in order. The first list is tried first.
FIELDS_FULL = (
    "index", "uuid", "name", "pci.bus_id", "compute_cap",
    "memory.total", "memory.used", "memory.free",
    "utilization.gpu", "utilization.memory", "temperature.gpu",
    "power.draw", "power.limit",
    "clocks_event_reasons.sw_thermal_slowdown", "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.sw_power_cap",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "mig.mode.current", "driver_version",
)  # fmt: skip
FIELDS_OLD = tuple(
    f.replace("clocks_event_reasons", "clocks_throttle_reasons")
    for f in FIELDS_FULL
    if f != "compute_cap"
)
FIELDS_MINIMAL = (
    "index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "memory.free",
    "utilization.gpu", "temperature.gpu", "power.draw", "power.limit", "driver_version",
)  # fmt: skip

_MISSING = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"}


def _value(raw: str) -> str | None:
    text = raw.strip()
    return None if text.lower() in _MISSING or text.startswith("[") else text


def _int(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(float(raw))
    except ValueError:
        return None


def _mib(raw: str | None) -> int | None:
    value = _int(raw)
    return value * MIB if value is not None else None


def _float(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def _active(*raws: str | None) -> bool | None:
    known = [r for r in raws if r is not None]
    if not known:
        return None
    return any(r.lower() == "active" for r in known)


def parse_nvidia_smi_csv(
    text: str, fields: tuple[str, ...] = FIELDS_FULL
) -> tuple[tuple[GpuDevice, ...], str | None]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` output.

    Args:
        text: the tool's stdout.
        fields: the fields that were asked for, in order.

    Returns:
        The devices and the driver version (None if not reported). A line that does
        not have one value per field but mentions a lost GPU becomes a lost device; any
        other malformed line is skipped.
    """
    devices: list[GpuDevice] = []
    driver: str | None = None
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not row or not "".join(row).strip():
            continue
        if len(row) != len(fields):
            line = ",".join(row)
            if "lost" in line.lower():
                devices.append(
                    GpuDevice(
                        index=len(devices), uuid=f"nvidia-smi-index-{len(devices)}",
                        name="unknown NVIDIA GPU", vendor=Vendor.NVIDIA,
                        source=Source.NVIDIA_SMI, error=line.strip()[:200], lost=True,
                    )
                )  # fmt: skip
            continue
        v = {name: _value(raw) for name, raw in zip(fields, row, strict=True)}
        index = _int(v.get("index"))
        uuid = v.get("uuid")
        if index is None or uuid is None:
            continue
        driver = driver or v.get("driver_version")
        cc_text = v.get("compute_cap")
        cc: tuple[int, int] | None = None
        if cc_text and "." in cc_text:
            major, _, minor = cc_text.partition(".")
            if major.isdigit() and minor.isdigit():
                cc = (int(major), int(minor))
        mig = v.get("mig.mode.current")
        reasons = (
            "clocks_event_reasons"
            if "clocks_event_reasons.sw_power_cap" in v
            else "clocks_throttle_reasons"
        )

        devices.append(
            GpuDevice(
                index=index,
                uuid=uuid,
                name=v.get("name") or "unknown NVIDIA GPU",
                vendor=Vendor.NVIDIA,
                source=Source.NVIDIA_SMI,
                pci_bus_id=v.get("pci.bus_id"),
                compute_capability=cc,
                memory_total=_mib(v.get("memory.total")),
                memory_used=_mib(v.get("memory.used")),
                memory_free=_mib(v.get("memory.free")),
                utilization_gpu=_int(v.get("utilization.gpu")),
                utilization_memory=_int(v.get("utilization.memory")),
                temperature_c=_int(v.get("temperature.gpu")),
                power_draw_w=_float(v.get("power.draw")),
                power_limit_w=_float(v.get("power.limit")),
                throttle_thermal=_active(
                    v.get(f"{reasons}.sw_thermal_slowdown"),
                    v.get(f"{reasons}.hw_thermal_slowdown"),
                ),
                throttle_power=_active(v.get(f"{reasons}.sw_power_cap")),
                ecc_corrected=_int(v.get("ecc.errors.corrected.volatile.total")),
                ecc_uncorrected=_int(v.get("ecc.errors.uncorrected.volatile.total")),
                mig_enabled=None if mig is None else mig.lower() == "enabled",
            )
        )
    return tuple(devices), driver


class NvidiaSmiProbe:
    """Probes NVIDIA GPUs through ``nvidia-smi`` (the NVML fallback).

    Args:
        executable: the tool's path; default: ``nvidia-smi`` found on ``PATH`` at probe time.
        timeout: kill the tool after this many seconds.
    """

    source = Source.NVIDIA_SMI

    def __init__(self, executable: str | None = None, *, timeout: float = 10.0) -> None:
        self.executable = executable
        self.timeout = timeout

    def available(self) -> bool:
        return find_tool("nvidia-smi", self.executable) is not None

    def probe(self) -> ProbeResult:
        """Run the tool and parse it. Never raises."""
        tool = find_tool("nvidia-smi", self.executable)
        if tool is None:
            return ProbeResult(Source.NVIDIA_SMI, error="nvidia-smi: not found on PATH")
        error: str | None = None
        for fields in (FIELDS_FULL, FIELDS_OLD, FIELDS_MINIMAL):
            result = run_tool(
                [tool, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                self.timeout,
            )
            if result.error is None or "lost" in result.stdout.lower():
                devices, driver = parse_nvidia_smi_csv(result.stdout, fields)
                if not devices and result.error is not None:
                    return ProbeResult(Source.NVIDIA_SMI, error=result.error)
                return ProbeResult(Source.NVIDIA_SMI, devices, driver_version=driver)
            error = result.error
            if "no devices were found" in error.lower():
                return ProbeResult(Source.NVIDIA_SMI)
            if "valid field" not in error.lower():
                break
        return ProbeResult(Source.NVIDIA_SMI, error=error)
