"""Layer A for AMD, best effort: ``rocm-smi --json``, else ``amd-smi ... --json``.

Theory of operation
-------------------
ROCm's tools change their JSON keys between releases ("Card series" / "Card Series",
"Average" / "Current Socket" Graphics Package Power, bare numbers / strings with units /
``{"value", "unit"}`` objects), and officially support a short list of cards. So the
parsers look keys up case-insensitively by what they contain rather than by exact name,
accept every value shape seen, and leave a field ``None`` rather than guess. AMD has no
CUDA compute capability; it stays ``None`` and the FP16 rule does not apply.

The fixtures in ``tests/gpu/fixtures`` are written from ROCm 5/6 documentation and issue
reports, not captured on AMD hardware: treat this probe as best effort until someone
commits a capture from a real card.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ._facts import GpuDevice, ProbeResult, Source, Vendor
from ._proc import find_tool, run_tool

ROCM_SMI_ARGS = (
    "--showid", "--showproductname", "--showuniqueid", "--showbus", "--showmeminfo", "vram",
    "--showuse", "--showtemp", "--showpower", "--showmaxpower", "--showdriverversion", "--json",
)  # fmt: skip

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_UNIT_BYTES = {
    "b": 1,
    "kb": 1024,
    "mb": 1024**2,
    "gb": 1024**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}


def _find(entry: Mapping[str, Any], *needles: str) -> Any:
    """The value of the first key containing every needle (case-insensitive)."""
    for key, value in entry.items():
        lowered = key.lower()
        if all(n in lowered for n in needles):
            return value
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, Mapping):
        value = value.get("value")
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = _NUMBER.search(value)
        return float(match.group()) if match else None
    return None


def _bytes(value: Any, default_unit: str = "b") -> int | None:
    unit = default_unit
    if isinstance(value, Mapping):
        unit = str(value.get("unit", unit))
    elif isinstance(value, str) and (m := re.search(r"([KMG]i?B|B)\s*$", value.strip(), re.I)):
        unit = m.group(1)
    number = _number(value)
    factor = _UNIT_BYTES.get(unit.lower())
    if number is None or factor is None:
        return None
    return int(number * factor)


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value.strip() and value.strip().upper() != "N/A":
        return value.strip()
    return None


def _section(entry: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = entry.get(key)
    return value if isinstance(value, Mapping) else {}


def parse_rocm_smi_json(text: str) -> tuple[tuple[GpuDevice, ...], str | None]:
    """Parse ``rocm-smi ... --json``: ``{"card0": {...}, "system": {...}}``.

    Raises:
        ValueError: the text is not a JSON object.
    """
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("rocm-smi: expected a JSON object")
    driver = None
    system = data.get("system")
    if isinstance(system, Mapping):
        driver = _text(_find(system, "driver", "version"))
    cards = sorted(
        (int(m.group(1)), v)
        for k, v in data.items()
        if (m := re.fullmatch(r"card(\d+)", k)) and isinstance(v, Mapping)
    )
    devices = []
    for index, entry in cards:
        driver = driver or _text(_find(entry, "driver version"))
        unique = _text(_find(entry, "unique id"))
        pci = _text(_find(entry, "pci bus"))
        name = (
            _text(_find(entry, "card series"))
            or _text(_find(entry, "card model"))
            or _text(_find(entry, "device name"))
            or "unknown AMD GPU"
        )
        total = _bytes(_find(entry, "vram total memory"))
        used = _bytes(_find(entry, "vram total used"))
        power = _number(_find(entry, "graphics package power")) or _number(
            _find(entry, "socket", "power")
        )
        limit = _number(_find(entry, "max graphics package power"))
        temp = _number(_find(entry, "temperature", "junction")) or _number(
            _find(entry, "temperature", "edge")
        )
        devices.append(
            GpuDevice(
                index=index,
                uuid=f"AMD-{unique}" if unique else f"rocm-{pci or f'card{index}'}",
                name=name,
                vendor=Vendor.AMD,
                source=Source.ROCM_SMI,
                pci_bus_id=pci,
                memory_total=total,
                memory_used=used,
                memory_free=total - used if total is not None and used is not None else None,
                utilization_gpu=_int(_find(entry, "gpu use")),
                utilization_memory=_int(_find(entry, "memory allocated")),
                temperature_c=int(temp) if temp is not None else None,
                power_draw_w=power,
                power_limit_w=limit,
            )
        )
    return tuple(devices), driver


def parse_amd_smi_json(static_text: str, metric_text: str | None = None) -> tuple[GpuDevice, ...]:
    """Parse ``amd-smi static --json`` (and optionally ``amd-smi metric --json``).

    Raises:
        ValueError: the static text is not a JSON list of GPU objects.
    """
    static = json.loads(static_text)
    if isinstance(static, Mapping):
        static = [static]
    if not isinstance(static, list):
        raise ValueError("amd-smi: expected a JSON list")
    metrics: dict[int, Mapping[str, Any]] = {}
    if metric_text:
        try:
            parsed = json.loads(metric_text)
        except ValueError:
            parsed = []
        for entry in parsed if isinstance(parsed, list) else [parsed]:
            if isinstance(entry, Mapping) and isinstance(entry.get("gpu"), int):
                metrics[entry["gpu"]] = entry
    devices = []
    for position, entry in enumerate(static):
        if not isinstance(entry, Mapping):
            continue
        gpu = entry.get("gpu")
        index = gpu if isinstance(gpu, int) else position
        asic, bus, vram = _section(entry, "asic"), _section(entry, "bus"), _section(entry, "vram")
        metric = metrics.get(index, {})
        usage, temps = _section(metric, "mem_usage"), _section(metric, "temperature")
        power, use = _section(metric, "power"), _section(metric, "usage")
        serial = _text(asic.get("asic_serial"))
        pci = _text(bus.get("bdf"))
        total = _bytes(vram.get("size"), "mb") or _bytes(usage.get("total_vram"), "mb")
        used = _bytes(usage.get("used_vram"), "mb")
        free = _bytes(usage.get("free_vram"), "mb")
        temp = _number(temps.get("hotspot")) or _number(temps.get("edge"))
        devices.append(
            GpuDevice(
                index=index,
                uuid=f"AMD-{serial}" if serial else f"amd-smi-{pci or index}",
                name=_text(asic.get("market_name")) or "unknown AMD GPU",
                vendor=Vendor.AMD,
                source=Source.AMD_SMI,
                pci_bus_id=pci,
                memory_total=total,
                memory_used=used,
                memory_free=free
                if free is not None
                else (total - used if total is not None and used is not None else None),
                utilization_gpu=_int(use.get("gfx_activity")),
                temperature_c=int(temp) if temp is not None else None,
                power_draw_w=_number(power.get("socket_power")),
            )
        )
    return tuple(devices)


class RocmProbe:
    """Probes AMD GPUs with ``rocm-smi``, falling back to ``amd-smi``. Best effort.

    Args:
        rocm_smi: path to ``rocm-smi``; default: found on ``PATH`` at probe time.
        amd_smi: path to ``amd-smi``; default: found on ``PATH`` at probe time.
        timeout: kill a tool after this many seconds.
    """

    source = Source.ROCM_SMI

    def __init__(
        self, rocm_smi: str | None = None, amd_smi: str | None = None, *, timeout: float = 10.0
    ) -> None:
        self.rocm_smi = rocm_smi
        self.amd_smi = amd_smi
        self.timeout = timeout

    def available(self) -> bool:
        return (
            find_tool("rocm-smi", self.rocm_smi) is not None
            or find_tool("amd-smi", self.amd_smi) is not None
        )

    def probe(self) -> ProbeResult:
        """Run whichever tool exists and parse it. Never raises."""
        error = "rocm-smi/amd-smi: not found on PATH"
        tool = find_tool("rocm-smi", self.rocm_smi)
        if tool is not None:
            result = run_tool([tool, *ROCM_SMI_ARGS], self.timeout)
            if result.error is None:
                try:
                    devices, driver = parse_rocm_smi_json(result.stdout)
                    return ProbeResult(Source.ROCM_SMI, devices, driver_version=driver)
                except ValueError as exc:
                    error = f"rocm-smi: unparseable output: {exc}"
            else:
                error = result.error
        amd = find_tool("amd-smi", self.amd_smi)
        if amd is None:
            return ProbeResult(Source.ROCM_SMI, error=error)
        static = run_tool([amd, "static", "--asic", "--bus", "--vram", "--json"], self.timeout)
        if static.error is not None:
            if tool is not None:  # say why both failed, rocm-smi first
                return ProbeResult(Source.ROCM_SMI, error=f"{error}; {static.error}")
            return ProbeResult(Source.AMD_SMI, error=static.error)
        metric = run_tool(
            [amd, "metric", "--usage", "--temperature", "--power", "--mem-usage", "--json"],
            self.timeout,
        )
        try:
            devices_amd = parse_amd_smi_json(
                static.stdout, metric.stdout if metric.error is None else None
            )
        except ValueError as exc:
            return ProbeResult(Source.AMD_SMI, error=f"amd-smi: unparseable output: {exc}")
        return ProbeResult(Source.AMD_SMI, devices_amd)
