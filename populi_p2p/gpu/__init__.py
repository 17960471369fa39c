"""GPU truth for populi: verified facts (A), allocatable capacity (B), operator labels (C).

See ``docs/gpu.md`` and ADR 018. The daemon wires this in three places:

* ``GpuMonitor(on_change=...)`` in its nursery: re-probes every 30 s and on demand, and
  calls back with a :class:`GpuReport` when health or capacity changed;
* ``report.to_record()`` into the signed NodeRecord (``GpuReport.from_record`` on the way
  out of a peer's record);
* ``format_gpu_table`` / ``report_to_json`` for ``populi-node gpus`` and
  ``member_gpu_summary`` for ``populi-node members``.
"""

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
