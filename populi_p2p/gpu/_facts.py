"""Layer A: verified hardware facts, as plain frozen values.

Theory of operation
-------------------
ADR 018 splits what the mesh knows about a machine's accelerators into three layers:

* **A, verified facts**: what a probe (NVML, ``nvidia-smi``, ``rocm-smi``,
  ``system_profiler``, ``/proc``) actually saw. This module holds those values.
* **B, allocatable capacity**: what this node offers after reservations, MIG, health
  and running work (``_capacity.py``), a pure function of A.
* **C, operator labels**: declared, never trusted as capacity (``_labels.py``).

Every value here is a frozen attrs class so a probe result can be compared with the
previous one (the monitor only gossips on change) and hashed. Memory is in bytes,
power in watts, temperature in degrees Celsius. A field the platform cannot report is
``None``, never a made-up zero: the scheduler must be able to tell "0 MiB free" from
"the probe could not say".

Nothing here performs I/O; the probes live in ``_nvml.py``, ``_smi.py``, ``_rocm.py``,
``_apple.py`` and ``_cpu.py``.
"""

from __future__ import annotations

import enum

import attrs

MIB = 1024 * 1024
GIB = 1024 * MIB


class Source(enum.StrEnum):
    """Which probe filled a Layer A value. The string is what goes on the wire."""

    NVML = "nvml"
    NVIDIA_SMI = "nvidia-smi"
    ROCM_SMI = "rocm-smi"
    AMD_SMI = "amd-smi"
    SYSTEM_PROFILER = "system_profiler"
    PROCFS = "procfs"
    SYSCTL = "sysctl"
    #: A probe whose result was synthesised by the runner (timeout, crash).
    RUNNER = "runner"


class Vendor(enum.StrEnum):
    NVIDIA = "nvidia"
    AMD = "amd"
    APPLE = "apple"


@attrs.frozen
class MigDevice:
    """One MIG instance of a GPU in MIG mode: the unit work is actually placed on."""

    index: int
    uuid: str
    memory_total: int | None
    memory_free: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@attrs.frozen
class GpuDevice:
    """Everything one probe saw about one accelerator.

    ``error`` is set when the device was enumerated but could not be read (for NVIDIA,
    typically ``NVML_ERROR_GPU_IS_LOST``); ``lost`` says that error means the device is
    gone from the driver, which health treats as fatal.
    """

    index: int
    uuid: str
    name: str
    vendor: Vendor
    source: Source
    pci_bus_id: str | None = None
    compute_capability: tuple[int, int] | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    memory_free: int | None = None
    #: Memory the driver keeps for itself (NVML's v2 memory info): never allocatable, and
    #: not counted in ``memory_used``, as ``nvidia-smi`` shows it. None where unknown.
    memory_reserved: int | None = None
    #: True on Apple Silicon: "VRAM" is the machine's RAM, shared with everything else.
    unified_memory: bool = False
    utilization_gpu: int | None = None
    utilization_memory: int | None = None
    temperature_c: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    throttle_thermal: bool | None = None
    throttle_power: bool | None = None
    #: Volatile (since driver load) ECC counts; None where ECC is off or unsupported.
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    mig_enabled: bool | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    #: XID codes the driver reported since the previous probe (NVML event set).
    xids: tuple[int, ...] = ()
    error: str | None = None
    lost: bool = False


@attrs.frozen
class ProbeStatus:
    """The outcome of one probe attempt, kept so "found nothing" is distinguishable
    from "could not look" in the record."""

    source: Source
    error: str | None = None
    devices: int = 0


@attrs.frozen
class ProbeResult:
    """What one probe returns. Probes never raise: failures land in ``error``."""

    source: Source
    devices: tuple[GpuDevice, ...] = ()
    driver_version: str | None = None
    #: CUDA driver API version as "major.minor" (NVIDIA only).
    cuda_driver_version: str | None = None
    error: str | None = None

    @property
    def status(self) -> ProbeStatus:
        return ProbeStatus(self.source, self.error, len(self.devices))


@attrs.frozen
class CpuInfo:
    """A CPU description for every node: the fallback compute when there is no GPU."""

    model: str | None = None
    arch: str | None = None
    cores_logical: int | None = None
    cores_physical: int | None = None
    avx: bool = False
    avx2: bool = False
    avx512: bool = False
    ram_total: int | None = None
    source: Source = Source.PROCFS
    error: str | None = None


@attrs.frozen
class HardwareFacts:
    """All Layer A facts of one node at one probe: GPUs from every source that found
    some, the CPU, and the status of every probe tried (including failed ones)."""

    devices: tuple[GpuDevice, ...] = ()
    cpu: CpuInfo = attrs.field(factory=CpuInfo)
    probes: tuple[ProbeStatus, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None

    @classmethod
    def from_results(cls, results: tuple[ProbeResult, ...], cpu: CpuInfo) -> HardwareFacts:
        """Merge probe results: devices concatenate, the first driver version wins."""
        devices: list[GpuDevice] = []
        driver: str | None = None
        cuda: str | None = None
        for result in results:
            devices.extend(result.devices)
            if driver is None and result.driver_version:
                driver = result.driver_version
            if cuda is None and result.cuda_driver_version:
                cuda = result.cuda_driver_version
        return cls(
            devices=tuple(devices),
            cpu=cpu,
            probes=tuple(r.status for r in results),
            driver_version=driver,
            cuda_driver_version=cuda,
        )
