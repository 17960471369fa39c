"""Layer A for the CPU, on every node: model, cores, AVX family, RAM.

Theory of operation
-------------------
A CPU-only node still serves small models and overflow (phase-1 architecture 1.1, "CPU
fallback"), and what decides whether it can is the vector extensions and the RAM. On
Linux those come from ``/proc/cpuinfo`` (the kernel's view of CPUID: the ``flags`` line
holds ``avx``, ``avx2``, ``avx512f``) and ``/proc/meminfo``; on macOS from ``sysctl``.
Physical cores are counted as distinct (physical id, core id) pairs; where the kernel
does not say (some VMs, ARM), they stay ``None`` rather than guessed.
"""

from __future__ import annotations

import os
import platform
import sys

from ._facts import CpuInfo, Source
from ._proc import find_tool, run_tool


def parse_cpuinfo(cpuinfo: str, meminfo: str | None = None, arch: str | None = None) -> CpuInfo:
    """Parse ``/proc/cpuinfo`` and ``/proc/meminfo`` text into a :class:`CpuInfo`."""
    model: str | None = None
    flags: set[str] = set()
    logical = 0
    cores: set[tuple[str, str]] = set()
    physical_id = core_id = None
    for line in [*cpuinfo.splitlines(), ""]:
        key, sep, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if not line.strip():
            if physical_id is not None and core_id is not None:
                cores.add((physical_id, core_id))
            physical_id = core_id = None
            continue
        if not sep:
            continue
        if key == "processor":
            logical += 1
        elif key in ("model name", "hardware", "cpu model") and model is None and value:
            model = value
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key == "physical id":
            physical_id = value
        elif key == "core id":
            core_id = value
    ram = None
    for line in (meminfo or "").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                ram = int(parts[1]) * 1024  # the kernel's "kB" is KiB
    return CpuInfo(
        model=model,
        arch=arch,
        cores_logical=logical or None,
        cores_physical=len(cores) or None,
        avx="avx" in flags,
        avx2="avx2" in flags,
        avx512="avx512f" in flags,
        ram_total=ram,
        source=Source.PROCFS,
    )


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(4 * 1024 * 1024)
    except OSError:
        return None


class CpuProbe:
    """Describes the CPU and RAM. Runs on every node; never raises."""

    source = Source.PROCFS

    def __init__(
        self, cpuinfo_path: str = "/proc/cpuinfo", meminfo_path: str = "/proc/meminfo"
    ) -> None:
        self.cpuinfo_path = cpuinfo_path
        self.meminfo_path = meminfo_path

    def probe(self) -> CpuInfo:
        arch = platform.machine() or None
        try:
            cpuinfo = _read(self.cpuinfo_path)
            if cpuinfo is not None:
                info = parse_cpuinfo(cpuinfo, _read(self.meminfo_path), arch)
                if info.cores_logical is None:
                    info = _evolve_cores(info)
                return info
            if sys.platform == "darwin":
                return self._darwin(arch)
            return CpuInfo(
                model=platform.processor() or None,
                arch=arch,
                cores_logical=os.cpu_count(),
                source=Source.RUNNER,
                error=f"{self.cpuinfo_path}: unreadable",
            )
        except Exception as exc:  # a probe never raises past itself
            return CpuInfo(arch=arch, source=Source.RUNNER, error=f"cpu probe: {exc!r}")

    def _darwin(self, arch: str | None) -> CpuInfo:
        tool = find_tool("sysctl")
        if tool is None:
            return CpuInfo(
                arch=arch, cores_logical=os.cpu_count(), source=Source.RUNNER,
                error="sysctl: not found",
            )  # fmt: skip
        keys = ["machdep.cpu.brand_string", "hw.physicalcpu", "hw.logicalcpu", "hw.memsize",
                "hw.optional.avx1_0", "hw.optional.avx2_0", "hw.optional.avx512f"]  # fmt: skip
        values: dict[str, str] = {}
        for key in keys:
            result = run_tool([tool, "-n", key], 5.0)
            if result.error is None:
                values[key] = result.stdout.strip()

        def number(key: str) -> int | None:
            text = values.get(key, "")
            return int(text) if text.isdigit() else None

        return CpuInfo(
            model=values.get("machdep.cpu.brand_string") or None,
            arch=arch,
            cores_logical=number("hw.logicalcpu"),
            cores_physical=number("hw.physicalcpu"),
            avx=values.get("hw.optional.avx1_0") == "1",
            avx2=values.get("hw.optional.avx2_0") == "1",
            avx512=values.get("hw.optional.avx512f") == "1",
            ram_total=number("hw.memsize"),
            source=Source.SYSCTL,
        )


def _evolve_cores(info: CpuInfo) -> CpuInfo:
    import attrs

    return attrs.evolve(info, cores_logical=os.cpu_count())
