"""GPU truth for populi: verified facts (A), allocatable capacity (B), operator labels (C).

See ``docs/gpu.md`` and ADR 018. The daemon wires this in three places:

* ``GpuMonitor(on_change=...)`` in its nursery: re-probes every 30 s and on demand, and
  calls back with a :class:`GpuReport` when health or capacity changed;
* ``report.to_record()`` into the signed NodeRecord (``GpuReport.from_record`` on the way
  out of a peer's record);
* ``format_gpu_table`` / ``report_to_json`` for ``populi-node gpus`` and
  ``member_gpu_summary`` for ``populi-node members``.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._apple import AppleProbe as AppleProbe
    from ._apple import parse_system_profiler_json as parse_system_profiler_json
    from ._capacity import Allocation as Allocation
    from ._capacity import Capacity as Capacity
    from ._capacity import CapacityPolicy as CapacityPolicy
    from ._capacity import CapacityReason as CapacityReason
    from ._capacity import DeviceCapacity as DeviceCapacity
    from ._capacity import PartitionCapacity as PartitionCapacity
    from ._capacity import compute_capacity as compute_capacity
    from ._cpu import CpuProbe as CpuProbe
    from ._cpu import parse_cpuinfo as parse_cpuinfo
    from ._facts import GIB as GIB
    from ._facts import MIB as MIB
    from ._facts import CpuInfo as CpuInfo
    from ._facts import GpuDevice as GpuDevice
    from ._facts import HardwareFacts as HardwareFacts
    from ._facts import MigDevice as MigDevice
    from ._facts import ProbeResult as ProbeResult
    from ._facts import ProbeStatus as ProbeStatus
    from ._facts import Source as Source
    from ._facts import Vendor as Vendor
    from ._health import DeviceHealth as DeviceHealth
    from ._health import HealthConfig as HealthConfig
    from ._health import HealthState as HealthState
    from ._health import Reason as Reason
    from ._health import ThrottleHistory as ThrottleHistory
    from ._health import WorkloadNeed as WorkloadNeed
    from ._health import assess_health as assess_health
    from ._health import check_workload as check_workload
    from ._labels import DeclaredGpu as DeclaredGpu
    from ._labels import format_size as format_size
    from ._labels import parse_advertise_gpu as parse_advertise_gpu
    from ._labels import parse_declared as parse_declared
    from ._labels import parse_label as parse_label
    from ._labels import parse_labels as parse_labels
    from ._labels import parse_size as parse_size
    from ._monitor import GpuMonitor as GpuMonitor
    from ._monitor import MonitorStatistics as MonitorStatistics
    from ._monitor import report_changed as report_changed
    from ._nvml import NvmlProbe as NvmlProbe
    from ._present import format_gpu_table as format_gpu_table
    from ._present import member_gpu_summary as member_gpu_summary
    from ._present import report_to_dict as report_to_dict
    from ._present import report_to_json as report_to_json
    from ._report import RECORD_VERSION as RECORD_VERSION
    from ._report import GpuReport as GpuReport
    from ._report import build_report as build_report
    from ._report import field_provenance as field_provenance
    from ._rocm import RocmProbe as RocmProbe
    from ._rocm import parse_amd_smi_json as parse_amd_smi_json
    from ._rocm import parse_rocm_smi_json as parse_rocm_smi_json
    from ._runner import GpuProbe as GpuProbe
    from ._runner import LocalProber as LocalProber
    from ._runner import run_probe as run_probe
    from ._smi import NvidiaSmiProbe as NvidiaSmiProbe
    from ._smi import parse_nvidia_smi_csv as parse_nvidia_smi_csv

#: Where each public name lives. The submodules load on first use (PEP 562), so that
#: importing one of them (the CLI's label parsing) does not load the probes, and a
#: daemon answers its API before any of them is imported (start-up CPU).
_WHERE: dict[str, str] = {
    "AppleProbe": "._apple",
    "parse_system_profiler_json": "._apple",
    "Allocation": "._capacity",
    "Capacity": "._capacity",
    "CapacityPolicy": "._capacity",
    "CapacityReason": "._capacity",
    "DeviceCapacity": "._capacity",
    "PartitionCapacity": "._capacity",
    "compute_capacity": "._capacity",
    "CpuProbe": "._cpu",
    "parse_cpuinfo": "._cpu",
    "GIB": "._facts",
    "MIB": "._facts",
    "CpuInfo": "._facts",
    "GpuDevice": "._facts",
    "HardwareFacts": "._facts",
    "MigDevice": "._facts",
    "ProbeResult": "._facts",
    "ProbeStatus": "._facts",
    "Source": "._facts",
    "Vendor": "._facts",
    "DeviceHealth": "._health",
    "HealthConfig": "._health",
    "HealthState": "._health",
    "Reason": "._health",
    "ThrottleHistory": "._health",
    "WorkloadNeed": "._health",
    "assess_health": "._health",
    "check_workload": "._health",
    "DeclaredGpu": "._labels",
    "format_size": "._labels",
    "parse_advertise_gpu": "._labels",
    "parse_declared": "._labels",
    "parse_label": "._labels",
    "parse_labels": "._labels",
    "parse_size": "._labels",
    "GpuMonitor": "._monitor",
    "MonitorStatistics": "._monitor",
    "report_changed": "._monitor",
    "NvmlProbe": "._nvml",
    "format_gpu_table": "._present",
    "member_gpu_summary": "._present",
    "report_to_dict": "._present",
    "report_to_json": "._present",
    "RECORD_VERSION": "._report",
    "GpuReport": "._report",
    "build_report": "._report",
    "field_provenance": "._report",
    "RocmProbe": "._rocm",
    "parse_amd_smi_json": "._rocm",
    "parse_rocm_smi_json": "._rocm",
    "GpuProbe": "._runner",
    "LocalProber": "._runner",
    "run_probe": "._runner",
    "NvidiaSmiProbe": "._smi",
    "parse_nvidia_smi_csv": "._smi",
}


__all__ = [
    "GIB",
    "MIB",
    "RECORD_VERSION",
    "Allocation",
    "AppleProbe",
    "Capacity",
    "CapacityPolicy",
    "CapacityReason",
    "CpuInfo",
    "CpuProbe",
    "DeclaredGpu",
    "DeviceCapacity",
    "DeviceHealth",
    "GpuDevice",
    "GpuMonitor",
    "GpuProbe",
    "GpuReport",
    "HardwareFacts",
    "HealthConfig",
    "HealthState",
    "LocalProber",
    "MigDevice",
    "MonitorStatistics",
    "NvidiaSmiProbe",
    "NvmlProbe",
    "PartitionCapacity",
    "ProbeResult",
    "ProbeStatus",
    "Reason",
    "RocmProbe",
    "Source",
    "ThrottleHistory",
    "Vendor",
    "WorkloadNeed",
    "assess_health",
    "build_report",
    "check_workload",
    "compute_capacity",
    "field_provenance",
    "format_gpu_table",
    "format_size",
    "member_gpu_summary",
    "parse_advertise_gpu",
    "parse_amd_smi_json",
    "parse_cpuinfo",
    "parse_declared",
    "parse_label",
    "parse_labels",
    "parse_nvidia_smi_csv",
    "parse_rocm_smi_json",
    "parse_size",
    "parse_system_profiler_json",
    "report_changed",
    "report_to_dict",
    "report_to_json",
    "run_probe",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
