"""The CPU facts from /proc/cpuinfo and /proc/meminfo."""

from __future__ import annotations

from populi_p2p.gpu import (
    CpuProbe,
    Source,
    parse_cpuinfo,
)

from .gpu_helpers import fixture_path

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
