"""Layer A for NVIDIA through NVML (nvidia-ml-py), the preferred source of GPU truth.

Theory of operation
-------------------
:class:`NvmlProbe` is a plain synchronous object: every NVML call blocks (some for
hundreds of milliseconds on a busy or failing GPU), so the async side runs
:meth:`NvmlProbe.probe` in a worker thread (``_runner.py``), and tests run it in a
subprocess against a fake ``libnvidia-ml.so.1``.

The probe keeps NVML initialised between calls, for two reasons: a critical-XID event set
only sees events raised after it was registered, and remembering what each index was lets
a GPU that vanishes mid-run (``NVML_ERROR_GPU_IS_LOST``, or the device count dropping) be
reported as *that* GPU, lost, rather than silently missing. If anything at the library
level fails, the probe shuts NVML down and initialises afresh next time.

Per field: "not supported" / "no permission" / "function not found" become ``None``
(consumer GPUs have no ECC counters, old drivers lack newer calls). Losing the GPU on any
call ends that device's probe with ``lost=True``. Any other error on an essential call
(handle, UUID, memory) is a per-device ``error``; on an optional one it becomes ``None``.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any, Final, TypeVar

from ._facts import GpuDevice, MigDevice, ProbeResult, Source, Vendor

T = TypeVar("T")

_THERMAL_MASK = 0x20 | 0x40  # SwThermalSlowdown | HwThermalSlowdown
_POWER_MASK = 0x04 | 0x80  # SwPowerCap | HwPowerBrakeSlowdown
#: Errors that mean "this field does not exist here", not "something is wrong".
_ABSENT = {
    3,  # NVML_ERROR_NOT_SUPPORTED
    4,  # NVML_ERROR_NO_PERMISSION
    13,  # NVML_ERROR_FUNCTION_NOT_FOUND
    6,  # NVML_ERROR_NOT_FOUND
}
_GPU_IS_LOST = 15
#: The library nvidia-ml-py opens outside Windows, and its words when it cannot.
_LIBRARY: Final = "libnvidia-ml.so.1"
_LIBRARY_NOT_FOUND: Final = "NVML Shared Library Not Found"
_GPU_GONE = {_GPU_IS_LOST, 18}  # ... and NVML_ERROR_RESET_REQUIRED
_TIMEOUT = 10


class _DeviceLost(Exception):
    """Internal: the device stopped answering; unwinds one device's probe."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class NvmlProbe:
    """Probes every NVIDIA GPU through NVML. Not thread-safe: one probe at a time (the
    runner's per-probe limiter guarantees it).

    Args:
        watch_xids: register for critical-XID events and report those seen since the
            previous probe. Needs NVML event support (Linux, not WSL).
    """

    source = Source.NVML

    def __init__(self, *, watch_xids: bool = True) -> None:
        self.watch_xids = watch_xids
        self._nvml: Any = None
        self._initialised = False
        self._event_set: Any = None
        self._known: dict[int, tuple[str, str]] = {}

    # ---------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Release NVML. Safe to call more than once."""
        if not self._initialised:
            return
        nvml = self._nvml
        try:
            if self._event_set is not None:
                nvml.nvmlEventSetFree(self._event_set)
        except Exception:
            pass
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
        self._event_set = None
        self._initialised = False

    def _init(self) -> Any:
        if self._nvml is None:
            if not sys.platform.startswith("win"):
                # A machine without NVIDIA's driver does not pay for nvidia-ml-py's
                # module (about 2 MiB resident): nvmlInit would fail the same way.
                try:
                    ctypes.CDLL(_LIBRARY)
                except OSError:
                    raise _LibraryNotFound(_LIBRARY_NOT_FOUND) from None
            import pynvml  # deferred: only where the library is (see above)

            self._nvml = pynvml
        if not self._initialised:
            self._nvml.nvmlInit()
            self._initialised = True
        return self._nvml

    # -------------------------------------------------------------------- probe
    def probe(self) -> ProbeResult:
        """Read every device. Never raises: library failures land in ``error``."""
        try:
            nvml = self._init()
        except Exception as exc:
            self._initialised = False
            return ProbeResult(Source.NVML, error=_describe(exc, "nvmlInit"))
        try:
            return self._probe(nvml)
        except Exception as exc:  # a library-level failure: start afresh next time
            self.close()
            return ProbeResult(Source.NVML, error=_describe(exc, "nvml"))

    def _probe(self, nvml: Any) -> ProbeResult:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = self._optional(nvml.nvmlSystemGetCudaDriverVersion)
        cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) else None
        count = nvml.nvmlDeviceGetCount()
        handles: dict[int, Any] = {}
        devices: list[GpuDevice] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception as exc:
                devices.append(self._broken(index, exc))
                continue
            handles[index] = handle
            devices.append(self._device(nvml, index, handle))
        # A GPU that fell off the bus can vanish from the count: report what it was.
        for index in sorted(self._known):
            if index >= count:
                uuid, name = self._known[index]
                devices.append(
                    GpuDevice(
                        index=index, uuid=uuid, name=name, vendor=Vendor.NVIDIA,
                        source=Source.NVML, error="device disappeared from NVML", lost=True,
                    )
                )  # fmt: skip
        xids = self._poll_xids(nvml, handles)
        if xids:
            devices = [
                _with_xids(d, xids.get(d.index, ())) if d.index in xids else d for d in devices
            ]
        return ProbeResult(
            Source.NVML, tuple(devices), driver_version=driver, cuda_driver_version=cuda_text
        )

    def _broken(self, index: int, exc: Exception) -> GpuDevice:
        uuid, name = self._known.get(index, (f"nvml-index-{index}", "unknown NVIDIA GPU"))
        value = getattr(exc, "value", None)
        return GpuDevice(
            index=index, uuid=uuid, name=name, vendor=Vendor.NVIDIA, source=Source.NVML,
            error=_describe(exc, "nvmlDeviceGetHandleByIndex"), lost=value in _GPU_GONE,
        )  # fmt: skip

    def _device(self, nvml: Any, index: int, handle: Any) -> GpuDevice:
        uuid, name = self._known.get(index, (f"nvml-index-{index}", "unknown NVIDIA GPU"))
        try:
            uuid = _text(self._essential(nvml.nvmlDeviceGetUUID, handle, what="uuid"))
            name = _text(self._essential(nvml.nvmlDeviceGetName, handle, what="name"))
            self._known[index] = (uuid, name)
            memory = self._memory(nvml, handle)
            pci = self._optional(nvml.nvmlDeviceGetPciInfo, handle)
            cc = self._optional(nvml.nvmlDeviceGetCudaComputeCapability, handle)
            util = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
            temp = self._optional(nvml.nvmlDeviceGetTemperature, handle, 0)
            power = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
            limit = self._optional(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            reasons = self._throttle_reasons(nvml, handle)
            corrected = self._optional(nvml.nvmlDeviceGetTotalEccErrors, handle, 0, 0)
            uncorrected = self._optional(nvml.nvmlDeviceGetTotalEccErrors, handle, 1, 0)
            mig_mode = self._optional(nvml.nvmlDeviceGetMigMode, handle)
            mig_enabled = None if mig_mode is None else bool(mig_mode[0])
            migs = self._mig_devices(nvml, handle) if mig_enabled else ()
        except _DeviceLost as lost:
            return GpuDevice(
                index=index, uuid=uuid, name=name, vendor=Vendor.NVIDIA, source=Source.NVML,
                error=lost.message, lost=True,
            )  # fmt: skip
        except _EssentialFailed as failed:
            return GpuDevice(
                index=index, uuid=uuid, name=name, vendor=Vendor.NVIDIA, source=Source.NVML,
                error=failed.message,
            )  # fmt: skip
        return GpuDevice(
            index=index,
            uuid=uuid,
            name=name,
            vendor=Vendor.NVIDIA,
            source=Source.NVML,
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
            memory_total=int(memory.total),
            memory_used=int(memory.used),
            memory_free=int(memory.free),
            memory_reserved=int(memory.reserved) if hasattr(memory, "reserved") else None,
            utilization_gpu=int(util.gpu) if util is not None else None,
            utilization_memory=int(util.memory) if util is not None else None,
            temperature_c=int(temp) if temp is not None else None,
            power_draw_w=power / 1000.0 if power is not None else None,
            power_limit_w=limit / 1000.0 if limit is not None else None,
            throttle_thermal=bool(reasons & _THERMAL_MASK) if reasons is not None else None,
            throttle_power=bool(reasons & _POWER_MASK) if reasons is not None else None,
            ecc_corrected=int(corrected) if corrected is not None else None,
            ecc_uncorrected=int(uncorrected) if uncorrected is not None else None,
            mig_enabled=mig_enabled,
            mig_devices=migs,
        )

    def _memory(self, nvml: Any, handle: Any) -> Any:
        """The v2 memory info where the driver has it: v1 counts the driver's own
        reservation (about 600 MiB on an idle H200) as used, so an idle GPU looked busy."""
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None:
            memory = self._optional(nvml.nvmlDeviceGetMemoryInfo, handle, version)
            if memory is not None:
                return memory
        return self._essential(nvml.nvmlDeviceGetMemoryInfo, handle, what="memory")

    def _throttle_reasons(self, nvml: Any, handle: Any) -> int | None:
        # Renamed "clocks event reasons" in driver 535; older drivers only have the old name.
        reasons: int | None = self._optional(nvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
        if reasons is None:
            reasons = self._optional(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        return reasons

    def _mig_devices(self, nvml: Any, handle: Any) -> tuple[MigDevice, ...]:
        maximum = self._optional(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        out: list[MigDevice] = []
        for slot in range(int(maximum)):
            mig = self._optional(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
            if mig is None:  # an empty slot: NVML_ERROR_NOT_FOUND
                continue
            uuid = self._optional(nvml.nvmlDeviceGetUUID, mig)
            if uuid is None:
                continue
            memory = self._optional(nvml.nvmlDeviceGetMemoryInfo, mig)
            out.append(
                MigDevice(
                    index=slot,
                    uuid=_text(uuid),
                    memory_total=int(memory.total) if memory is not None else None,
                    memory_free=int(memory.free) if memory is not None else None,
                    gpu_instance_id=self._optional(nvml.nvmlDeviceGetGpuInstanceId, mig),
                    compute_instance_id=self._optional(nvml.nvmlDeviceGetComputeInstanceId, mig),
                )
            )
        return tuple(out)

    def _poll_xids(self, nvml: Any, handles: dict[int, Any]) -> dict[int, tuple[int, ...]]:
        """Drain critical-XID events raised since the previous probe (non-blocking)."""
        if not self.watch_xids or not handles:
            return {}
        try:
            if self._event_set is None:
                self._event_set = nvml.nvmlEventSetCreate()
                for handle in handles.values():
                    try:
                        nvml.nvmlDeviceRegisterEvents(handle, 0x8, self._event_set)
                    except Exception:
                        continue  # this device has no XID events; the others may
        except Exception:
            self.watch_xids = False  # no event support on this platform: stop trying
            return {}
        by_address = {_address(h): i for i, h in handles.items()}
        seen: dict[int, list[int]] = {}
        for _ in range(64):  # bounded: never spin on a flood of events
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, 0)
            except Exception:
                break  # NVML_ERROR_TIMEOUT: no more events
            index = by_address.get(_address(data.device))
            if index is not None:
                seen.setdefault(index, []).append(int(data.eventData))
        return {i: tuple(x) for i, x in seen.items()}

    # ------------------------------------------------------------------ helpers
    def _essential(self, call: Callable[..., T], *args: Any, what: str) -> T:
        try:
            return call(*args)
        except Exception as exc:
            if getattr(exc, "value", None) in _GPU_GONE:
                raise _DeviceLost(_describe(exc, what)) from None
            raise _EssentialFailed(_describe(exc, what)) from None

    def _optional(self, call: Callable[..., T], *args: Any) -> T | None:
        try:
            return call(*args)
        except Exception as exc:
            if getattr(exc, "value", None) in _GPU_GONE:
                raise _DeviceLost(_describe(exc, "nvml")) from None
            return None


class _EssentialFailed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _address(handle: Any) -> int | None:
    """The pointer value of an ``nvmlDevice_t``, to match event data to devices."""
    import ctypes

    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except Exception:
        return None


def _with_xids(device: GpuDevice, xids: tuple[int, ...]) -> GpuDevice:
    import attrs

    return attrs.evolve(device, xids=device.xids + xids)


class _LibraryNotFound(Exception):
    """No NVML library to open: what nvidia-ml-py's nvmlInit raises then, without it."""


def _describe(exc: BaseException, where: str) -> str:
    """One line for the record: the NVML error name where there is one."""
    name = type(exc).__name__
    text = str(exc) or name
    if name.startswith("NVMLError") or isinstance(exc, _LibraryNotFound):
        return f"{where}: {text}"
    return f"{where}: {name}: {text}"
