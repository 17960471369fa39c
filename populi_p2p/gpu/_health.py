"""Device health and the seeds' disqualification rules, all in one place.

Theory of operation
-------------------
Each device gets one of three states from its Layer A facts plus two inputs only the
node has (its throttle-event history and its inference error rate):

* ``healthy``: nothing to report.
* ``degraded``: usable, with reasons (thermal throttling now, high temperature,
  corrected ECC errors, non-fatal XIDs, repeated throttle events, ...).
* ``unhealthy``: the device is lost from the driver (``NVML_ERROR_GPU_IS_LOST``), reported
  a fatal XID or an uncorrected ECC error, or could not be probed. Capacity is zero.

Separately a device can be *disqualified* (ineligible for placement) by the rules of the
phase-1 architecture, section 1.2. Those that depend only on the device (driver on a
blocklist, 3+ thermal throttle events in 24 h, inference error rate above 5%) are applied
here and zero the device's capacity; those that depend on the workload (VRAM below need
plus 512 MiB headroom, compute capability below 7.0 for FP16) are in
:func:`check_workload`, for the scheduler. Every threshold is a field of
:class:`HealthConfig`; ``None`` turns a rule off.

Timestamps are passed in (the monitor uses ``trio.current_time()``); nothing here reads a
clock, so the same rules run under the simulator.
"""

from __future__ import annotations

import enum
import fnmatch
from collections import deque
from typing import Any

import attrs

from ._facts import MIB, GpuDevice


class HealthState(enum.StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"


class Reason(enum.StrEnum):
    """Why a device is not plainly healthy. The string values go on the wire: ONLY
    APPEND, never rename."""

    THERMAL_THROTTLE = "thermal_throttle"
    HIGH_TEMPERATURE = "high_temp"
    ECC_CORRECTED = "ecc_corrected"
    XID = "xid"
    REPEATED_THROTTLE = "throttle_repeated"
    DRIVER_BLOCKLISTED = "driver_blocklisted"
    ERROR_RATE = "error_rate"
    LOST = "lost"
    PROBE_ERROR = "probe_error"
    ECC_UNCORRECTED = "ecc_uncorrected"
    XID_FATAL = "xid_fatal"
    # Workload rules (check_workload), never stored in a device's health:
    VRAM_SHORT = "vram_short"
    COMPUTE_CAPABILITY = "compute_capability"


#: Reasons that make a device unhealthy rather than degraded.
FATAL_REASONS = frozenset(
    {Reason.LOST, Reason.PROBE_ERROR, Reason.ECC_UNCORRECTED, Reason.XID_FATAL}
)
#: Reasons that disqualify a device from placement without making it unhealthy.
DISQUALIFYING_REASONS = frozenset(
    {Reason.REPEATED_THROTTLE, Reason.DRIVER_BLOCKLISTED, Reason.ERROR_RATE}
)

#: XIDs that NVIDIA documents as needing a GPU reset or indicating hardware failure:
#: 48 double-bit ECC, 62/64 internal/ECC page retirement failure, 74 NVLink, 79 fallen
#: off the bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120
#: GSP errors, 140 unrecovered ECC.
DEFAULT_FATAL_XIDS = frozenset({48, 62, 64, 74, 79, 92, 94, 95, 119, 120, 140})


def _check_fraction(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be in [0, 1], got {value!r}")


def _check_non_negative(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


@attrs.frozen
class HealthConfig:
    """Every health threshold and disqualification rule, with documented defaults.

    The defaults follow section 1.2 of the phase-1 architecture where it gives a number
    and NVIDIA's guidance elsewhere. ``None`` disables a rule.
    """

    #: Degraded at or above this GPU temperature (deg C). 85 is below the slowdown
    #: threshold of every current NVIDIA part (~87-93), so it warns before clocks drop.
    high_temperature_c: int | None = attrs.field(default=85, validator=_check_non_negative)
    #: Degraded when volatile corrected ECC errors reach this count. 1 is strict: any
    #: single-bit error since driver load is worth a look; raise it on fleets where
    #: a few are routine.
    ecc_corrected_limit: int | None = attrs.field(default=1, validator=_check_non_negative)
    #: Unhealthy on any volatile uncorrected ECC error: data on that GPU is suspect.
    ecc_uncorrected_fatal: bool = True
    #: XIDs that make a device unhealthy; any other XID only degrades it.
    fatal_xids: frozenset[int] = DEFAULT_FATAL_XIDS
    #: Workload rule: a device qualifies only if allocatable VRAM >= need + this. 512 MiB
    #: leaves room for the CUDA context and KV-cache growth (section 1.2).
    vram_headroom: int = attrs.field(default=512 * MIB, validator=_check_non_negative)
    #: Workload rule: FP16 work needs at least this compute capability (7.0 = Volta,
    #: the first with tensor cores; older parts run FP16 slowly).
    fp16_min_compute_capability: tuple[int, int] | None = (7, 0)
    #: Driver versions known to crash or corrupt, as fnmatch globs ("470.*", "535.54.03").
    driver_blocklist: tuple[str, ...] = ()
    #: Disqualified at this many thermal throttle *events* (rising edges seen by the
    #: probe) within ``throttle_window_s``: the hardware is unreliable (section 1.2).
    throttle_event_limit: int | None = attrs.field(default=3, validator=_check_non_negative)
    #: Sliding window for ``throttle_event_limit``, seconds (24 h).
    throttle_window_s: float = attrs.field(default=86400.0, validator=_check_non_negative)
    #: Disqualified when the node's inference error rate on the device exceeds this
    #: fraction (section 1.2: "something wrong with the setup").
    max_error_rate: float | None = attrs.field(default=0.05, validator=_check_fraction)

    def __attrs_post_init__(self) -> None:
        cc = self.fp16_min_compute_capability
        if cc is not None and (len(cc) != 2 or min(cc) < 0):
            raise ValueError(f"fp16_min_compute_capability must be (major, minor), got {cc!r}")
        if self.throttle_window_s <= 0:
            raise ValueError(f"throttle_window_s must be > 0, got {self.throttle_window_s!r}")


@attrs.frozen
class DeviceHealth:
    """The verdict on one device. ``eligible`` is false when unhealthy or disqualified."""

    state: HealthState
    reasons: tuple[Reason, ...] = ()

    @property
    def eligible(self) -> bool:
        return self.state is not HealthState.UNHEALTHY and not any(
            r in DISQUALIFYING_REASONS for r in self.reasons
        )

    @classmethod
    def from_reasons(cls, reasons: tuple[Reason, ...]) -> DeviceHealth:
        """The state follows from the reasons, so a record only needs the reasons."""
        ordered = tuple(dict.fromkeys(reasons))
        if any(r in FATAL_REASONS for r in ordered):
            return cls(HealthState.UNHEALTHY, ordered)
        if ordered:
            return cls(HealthState.DEGRADED, ordered)
        return cls(HealthState.HEALTHY, ())


def driver_blocked(driver_version: str | None, blocklist: tuple[str, ...]) -> bool:
    """True if ``driver_version`` matches a blocklist glob."""
    if not driver_version:
        return False
    return any(fnmatch.fnmatchcase(driver_version, pattern) for pattern in blocklist)


def assess_health(
    device: GpuDevice,
    *,
    config: HealthConfig,
    driver_version: str | None = None,
    throttle_events: int = 0,
    error_rate: float | None = None,
) -> DeviceHealth:
    """Apply every device-level rule of ``config`` to one device.

    Args:
        device: Layer A facts for the device.
        config: thresholds.
        driver_version: the node's driver version, for the blocklist.
        throttle_events: thermal throttle events in the window (from
            :class:`ThrottleHistory`).
        error_rate: the node's inference error rate on this device, if it knows one.

    Returns:
        The device's state and every reason that applies, in a fixed order.
    """
    reasons: list[Reason] = []
    if device.lost:
        reasons.append(Reason.LOST)
    elif device.error is not None:
        reasons.append(Reason.PROBE_ERROR)
    if config.ecc_uncorrected_fatal and (device.ecc_uncorrected or 0) > 0:
        reasons.append(Reason.ECC_UNCORRECTED)
    if any(x in config.fatal_xids for x in device.xids):
        reasons.append(Reason.XID_FATAL)
    if any(x not in config.fatal_xids for x in device.xids):
        reasons.append(Reason.XID)
    if device.throttle_thermal:
        reasons.append(Reason.THERMAL_THROTTLE)
    if (
        config.high_temperature_c is not None
        and device.temperature_c is not None
        and device.temperature_c >= config.high_temperature_c
    ):
        reasons.append(Reason.HIGH_TEMPERATURE)
    if (
        config.ecc_corrected_limit is not None
        and device.ecc_corrected is not None
        and device.ecc_corrected >= max(1, config.ecc_corrected_limit)
    ):
        reasons.append(Reason.ECC_CORRECTED)
    if config.throttle_event_limit is not None and throttle_events >= max(
        1, config.throttle_event_limit
    ):
        reasons.append(Reason.REPEATED_THROTTLE)
    if driver_blocked(driver_version, config.driver_blocklist):
        reasons.append(Reason.DRIVER_BLOCKLISTED)
    if (
        config.max_error_rate is not None
        and error_rate is not None
        and error_rate > config.max_error_rate
    ):
        reasons.append(Reason.ERROR_RATE)
    return DeviceHealth.from_reasons(tuple(reasons))


@attrs.frozen
class WorkloadNeed:
    """What a piece of work asks of one device, for :func:`check_workload`."""

    vram: int
    fp16: bool = True


def check_workload(
    compute_capability: tuple[int, int] | None,
    allocatable_vram: int,
    need: WorkloadNeed,
    config: HealthConfig,
) -> tuple[Reason, ...]:
    """The workload-dependent disqualification rules (section 1.2).

    Args:
        compute_capability: the device's, ``None`` when not NVIDIA or unknown (the FP16
            rule then does not apply: it is an NVIDIA rule).
        allocatable_vram: Layer B capacity of the device (or MIG instance), bytes.
        need: the work's VRAM need and whether it runs FP16.
        config: thresholds.

    Returns:
        Reasons the device does not qualify; empty when it does.
    """
    reasons: list[Reason] = []
    if allocatable_vram < need.vram + config.vram_headroom:
        reasons.append(Reason.VRAM_SHORT)
    minimum = config.fp16_min_compute_capability
    if (
        need.fp16
        and minimum is not None
        and compute_capability is not None
        and tuple(compute_capability) < tuple(minimum)
    ):
        reasons.append(Reason.COMPUTE_CAPABILITY)
    return tuple(reasons)


class ThrottleHistory:
    """Thermal throttle events per device, with the timestamps the caller passes in.

    An *event* is a rising edge: a probe that sees thermal throttling after one that did
    not. A GPU that stays throttled across ten probes is one event, so the 3-in-24-h
    rule measures how often the hardware gets into trouble, not how often we looked.
    Bounded: at most ``max_events`` timestamps per device, and devices are forgotten
    when their history empties.
    """

    def __init__(self, window_s: float = 86400.0, max_events: int = 64) -> None:
        if window_s <= 0 or max_events <= 0:
            raise ValueError("window_s and max_events must be > 0")
        self.window_s = window_s
        self.max_events = max_events
        self._events: dict[str, deque[float]] = {}
        self._throttling: dict[str, bool] = {}

    def observe(self, uuid: str, throttling: bool | None, now: float) -> None:
        """Feed one probe's view of one device. ``None`` (unknown) changes nothing."""
        if throttling is None:
            return
        was = self._throttling.get(uuid, False)
        self._throttling[uuid] = throttling
        if throttling and not was:
            events = self._events.setdefault(uuid, deque(maxlen=self.max_events))
            events.append(now)
        self._expire(uuid, now)

    def count(self, uuid: str, now: float) -> int:
        """Events for ``uuid`` in the window ending at ``now``."""
        self._expire(uuid, now)
        return len(self._events.get(uuid, ()))

    def _expire(self, uuid: str, now: float) -> None:
        events = self._events.get(uuid)
        if events is None:
            return
        while events and events[0] <= now - self.window_s:
            events.popleft()
        if not events:
            del self._events[uuid]
