"""Layer A for macOS, best effort: ``system_profiler SPDisplaysDataType -json``.

Theory of operation
-------------------
Apple Silicon GPUs have no VRAM of their own: the GPU shares the machine's RAM (unified
memory). The probe reports the physical RAM from ``SPHardwareDataType`` as the device's
``memory_total`` with ``unified_memory=True``, and Layer B offers only a fraction of it
(``CapacityPolicy.unified_memory_fraction``). Intel Macs with a discrete GPU report
``spdisplays_vram`` and are treated as ordinary VRAM. ``system_profiler`` reports no
live memory use, temperature or power, so those stay ``None``.

There is no per-GPU UUID on macOS; the hardware UUID of the machine (``platform_UUID``)
plus the index is stable across reboots, which is what reservations need.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from typing import Any

from ._facts import GpuDevice, ProbeResult, Source, Vendor
from ._proc import find_tool, run_tool

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]B)", re.I)
_FACTOR = {"kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4}


def _size(text: Any) -> int | None:
    if not isinstance(text, str):
        return None
    match = _SIZE.search(text)
    if match is None:
        return None
    return int(float(match.group(1)) * _FACTOR[match.group(2).lower()])


def parse_system_profiler_json(text: str) -> tuple[GpuDevice, ...]:
    """Parse ``system_profiler SPDisplaysDataType SPHardwareDataType -json``.

    Raises:
        ValueError: not a JSON object.
    """
    data = json.loads(text)
    if not isinstance(data, Mapping):
        raise ValueError("system_profiler: expected a JSON object")
    hardware = data.get("SPHardwareDataType") or [{}]
    hw: Mapping[str, Any] = (
        hardware[0]
        if isinstance(hardware, list) and hardware and isinstance(hardware[0], Mapping)
        else {}
    )
    ram = _size(hw.get("physical_memory"))
    machine = hw.get("platform_UUID") if isinstance(hw.get("platform_UUID"), str) else None
    displays = data.get("SPDisplaysDataType") or []
    devices = []
    for index, entry in enumerate(displays if isinstance(displays, list) else []):
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("sppci_model") or entry.get("_name") or "unknown GPU"
        vendor_text = str(entry.get("spdisplays_vendor", "")) + " " + str(name)
        vram = _size(
            entry.get("spdisplays_vram")
            or entry.get("spdisplays_vram_shared")
            or entry.get("sppci_vram")
        )
        apple = "apple" in vendor_text.lower()
        unified = apple and entry.get("spdisplays_vram") is None
        if "amd" in vendor_text.lower() or "ati" in vendor_text.lower().split():
            vendor = Vendor.AMD
        elif "nvidia" in vendor_text.lower():
            vendor = Vendor.NVIDIA
        else:
            vendor = Vendor.APPLE
        devices.append(
            GpuDevice(
                index=index,
                uuid=f"apple-{machine}-{index}" if machine else f"apple-gpu-{index}",
                name=str(name),
                vendor=vendor,
                source=Source.SYSTEM_PROFILER,
                pci_bus_id=None,
                memory_total=ram if unified else vram,
                unified_memory=unified,
            )
        )
    return tuple(devices)


class AppleProbe:
    """Probes macOS GPUs through ``system_profiler``. Best effort.

    Args:
        executable: path to ``system_profiler``; default: found on ``PATH`` (macOS only).
        timeout: kill the tool after this many seconds (it can take several).
    """

    source = Source.SYSTEM_PROFILER

    def __init__(self, executable: str | None = None, *, timeout: float = 15.0) -> None:
        self.executable = executable
        self.timeout = timeout

    def available(self) -> bool:
        if self.executable is None and sys.platform != "darwin":
            return False
        return find_tool("system_profiler", self.executable) is not None

    def probe(self) -> ProbeResult:
        """Run the tool and parse it. Never raises."""
        tool = find_tool("system_profiler", self.executable)
        if tool is None:
            return ProbeResult(Source.SYSTEM_PROFILER, error="system_profiler: not found")
        result = run_tool([tool, "SPDisplaysDataType", "SPHardwareDataType", "-json"], self.timeout)
        if result.error is not None:
            return ProbeResult(Source.SYSTEM_PROFILER, error=result.error)
        try:
            return ProbeResult(Source.SYSTEM_PROFILER, parse_system_profiler_json(result.stdout))
        except ValueError as exc:
            return ProbeResult(
                Source.SYSTEM_PROFILER, error=f"system_profiler: unparseable output: {exc}"
            )
