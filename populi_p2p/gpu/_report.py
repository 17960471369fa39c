"""The whole GPU report (layers A, B, C) and its canonical record form for NodeRecords.

Theory of operation
-------------------
:func:`build_report` is the one place the three layers meet: Layer A facts, health
assessed from them, Layer B capacity computed from both, and Layer C labels and declared
GPUs carried alongside, untouched by the first two.

:meth:`GpuReport.to_record` gives the canonical, msgpack-friendly form that rides inside
the signed NodeRecord. It is built to be small (a member's metadata has 4 KiB in all):

* sections are keyed by their layer, ``"A"``, ``"B"``, ``"C"``; each says its source
  (``"s"``): per device in A (``"nvml"``, ``"nvidia-smi"``, ...), ``"derived"`` for B,
  ``"operator"`` for labels and ``"declared"`` on every declared GPU. So any reader can
  tell verified from declared without knowing this code (:func:`field_provenance`
  expands it to a ``{"layer", "source"}`` pair per field);
* keys are one or two letters, memory is in MiB (floored, so capacity is never rounded
  up), power in whole watts, and absent values are omitted rather than sent as nil;
* what can be derived is not repeated: a device's source is written only where it
  differs from the section's ``"s"``, its vendor only where the source does not imply
  it, names go in one table (``"nm"``) that devices index, free memory only where it is
  not total minus used, health ``"h"`` only when not healthy, and NVIDIA ``GPU-``/``MIG-``
  UUIDs travel as 17 bytes instead of 40 characters.

For 8 GPUs with labels the record is about 1.4 KB of msgpack; 8 GPUs with 7 MIG
instances each, about 2.7 KB. ``to_record(max_bytes=...)`` drops telemetry
(:data:`LEAN_DROPS`) when the full form does not fit.

The record is canonical: ``to_record(from_record(r)) == r`` for any record this code
produced, and the same report always encodes to the same bytes (labels sorted, device
order kept), so an unchanged report never causes a re-sign. :meth:`GpuReport.from_record`
is the parser for records from other members: anything malformed raises one
``ValueError``; unknown keys are ignored (extension-first), and unknown health reasons are
dropped while the explicit state is kept, so newer members stay readable.

Wire version 1. ONLY APPEND keys; never change what an existing key means.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import msgpack

from ._capacity import (
    Allocation,
    Capacity,
    CapacityPolicy,
    CapacityReason,
    DeviceCapacity,
    PartitionCapacity,
    compute_capacity,
)
from ._facts import MIB, CpuInfo, GpuDevice, HardwareFacts, MigDevice, ProbeStatus, Source, Vendor
from ._health import DeviceHealth, HealthConfig, HealthState, Reason, assess_health
from ._labels import DeclaredGpu, parse_label

RECORD_VERSION = 1
#: Source strings of the non-probe layers.
SOURCE_DERIVED = "derived"
SOURCE_OPERATOR = "operator"
SOURCE_DECLARED = "declared"


def _labels(value: Mapping[str, str] | Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k), str(v)) for k, v in items))


def _declared(value: Iterable[DeclaredGpu]) -> tuple[DeclaredGpu, ...]:
    return tuple(value)


@attrs.frozen
class GpuReport:
    """Layers A, B and C of one node at one evaluation.

    ``health`` and ``capacity.devices`` are aligned with ``facts.devices``.
    """

    facts: HardwareFacts
    health: tuple[DeviceHealth, ...]
    capacity: Capacity
    labels: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_labels)
    declared: tuple[DeclaredGpu, ...] = attrs.field(default=(), converter=_declared)

    def __attrs_post_init__(self) -> None:
        n = len(self.facts.devices)
        if len(self.health) != n or len(self.capacity.devices) != n:
            raise ValueError(
                f"report misaligned: {n} devices, {len(self.health)} health verdicts, "
                f"{len(self.capacity.devices)} capacity entries"
            )

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    # ------------------------------------------------------------------ record
    def to_record(self, max_bytes: int | None = None) -> dict[str, Any]:
        """The canonical msgpack-friendly dict (see the module docstring).

        Args:
            max_bytes: if the full record packs larger than this, drop the telemetry
                fields (:data:`LEAN_DROPS`: PCI bus id, utilization, temperature, power,
                power throttling) and try again.

        Raises:
            ValueError: even the lean record is larger than ``max_bytes``.
        """
        record = self._record(lean=False)
        if max_bytes is None:
            return record
        size = len(msgpack.packb(record))
        if size <= max_bytes:
            return record
        record = self._record(lean=True)
        lean = len(msgpack.packb(record))
        if lean > max_bytes:
            raise ValueError(f"GPU record needs {lean} bytes even lean, over {max_bytes}")
        return record

    def _record(self, *, lean: bool) -> dict[str, Any]:
        devices = self.facts.devices
        source = _default_source(self.facts)
        names = list(dict.fromkeys(d.name for d in devices))
        a: dict[str, Any] = {"p": [_status_record(p) for p in self.facts.probes]}
        if source is not None:
            a["s"] = str(source)
        _put(a, "drv", self.facts.driver_version)
        _put(a, "cuda", self.facts.cuda_driver_version)
        if names:
            a["nm"] = names
        a["d"] = [
            _device_record(d, h, source, names, lean)
            for d, h in zip(devices, self.health, strict=True)
        ]
        a["cpu"] = _cpu_record(self.facts.cpu)
        b = {"s": SOURCE_DERIVED, "d": [_capacity_record(c) for c in self.capacity.devices]}
        c: dict[str, Any] = {"s": SOURCE_OPERATOR, "l": dict(self.labels)}
        if self.declared:
            c["g"] = [_declared_record(g) for g in self.declared]
        return {"v": RECORD_VERSION, "A": a, "B": b, "C": c}

    @classmethod
    def from_record(cls, record: Any) -> GpuReport:
        """Parse a record (from this node or another member).

        Raises:
            ValueError: the record is malformed or of an unsupported version.
        """
        try:
            return _from_record(record)
        except _Malformed as exc:
            raise ValueError(f"malformed GPU record: {exc}") from None
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed GPU record: {type(exc).__name__}: {exc}") from None


def build_report(
    facts: HardwareFacts,
    *,
    health_config: HealthConfig | None = None,
    policy: CapacityPolicy | None = None,
    allocations: Sequence[Allocation] = (),
    throttle_events: Mapping[str, int] | None = None,
    error_rates: Mapping[str, float] | None = None,
    labels: Mapping[str, str] | None = None,
    declared: Sequence[DeclaredGpu] = (),
) -> GpuReport:
    """Assess health, compute capacity and attach labels: the three layers, together.

    Args:
        facts: Layer A, from :class:`LocalProber`.
        health_config: thresholds and disqualification rules.
        policy: reservations and withheld devices.
        allocations: work this node already runs.
        throttle_events: thermal throttle events in the window, by device UUID.
        error_rates: inference error rate by device UUID (fed by the node).
        labels: Layer C labels (already validated by :func:`parse_labels`).
        declared: Layer C declared GPUs.
    """
    config = health_config or HealthConfig()
    throttle_events = throttle_events or {}
    error_rates = error_rates or {}
    health = tuple(
        assess_health(
            device,
            config=config,
            driver_version=facts.driver_version,
            throttle_events=throttle_events.get(device.uuid, 0),
            error_rate=error_rates.get(device.uuid),
        )
        for device in facts.devices
    )
    capacity = compute_capacity(facts.devices, health, policy, allocations)
    return GpuReport(facts, health, capacity, labels or {}, declared)


########################################################################################
# Encoding
########################################################################################


def _put(target: dict[str, Any], key: str, value: Any) -> None:
    if value is not None and value != () and value is not False:
        target[key] = list(value) if isinstance(value, tuple) else value


def _mib(value: int | None) -> int | None:
    return None if value is None else max(0, value) // MIB


def _watts(value: float | None) -> int | None:
    return None if value is None else round(value)


def _status_record(status: ProbeStatus) -> list[Any]:
    return [str(status.source), status.error, status.devices]


def _default_source(facts: HardwareFacts) -> Source | None:
    """The source most devices came from: written once, per device only where it differs."""
    counts: dict[Source, int] = {}
    for d in facts.devices:
        counts[d.source] = counts.get(d.source, 0) + 1
    return max(counts, key=lambda s: (counts[s], -list(counts).index(s))) if counts else None


#: The vendor a source implies; "k" is written only where a device differs.
_SOURCE_VENDOR = {
    Source.NVML: Vendor.NVIDIA,
    Source.NVIDIA_SMI: Vendor.NVIDIA,
    Source.ROCM_SMI: Vendor.AMD,
    Source.AMD_SMI: Vendor.AMD,
    Source.SYSTEM_PROFILER: Vendor.APPLE,
}
#: Telemetry dropped by ``to_record(max_bytes=...)`` when the full record is too big:
#: useful to people, not needed for placement (health already reflects temperature).
LEAN_DROPS = ("b", "ug", "ux", "t", "pd", "pl", "tp")
_UUID_RE = re.compile(r"(GPU|MIG)-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
_UUID_KIND = {"GPU": 1, "MIG": 2}
_UUID_PREFIX = {v: k for k, v in _UUID_KIND.items()}


def _uuid_out(text: str) -> str | bytes:
    """NVIDIA's ``GPU-<uuid>``/``MIG-<uuid>`` as 17 bytes (kind + 16) instead of 40 chars."""
    match = _UUID_RE.fullmatch(text)
    if match is None:
        return text
    return bytes([_UUID_KIND[match[1]]]) + uuid.UUID(match[2]).bytes


def _uuid_in(value: Any) -> str:
    if isinstance(value, str):
        return value
    _need(
        isinstance(value, bytes) and len(value) == 17 and value[0] in _UUID_PREFIX,
        "bad device uuid",
    )
    return f"{_UUID_PREFIX[value[0]]}-{uuid.UUID(bytes=bytes(value[1:]))}"


def _device_record(
    d: GpuDevice, h: DeviceHealth, source: Source | None, names: list[str], lean: bool
) -> dict[str, Any]:
    r: dict[str, Any] = {}
    if d.source is not source:
        r["s"] = str(d.source)
    r["i"] = d.index
    r["u"] = _uuid_out(d.uuid)
    r["n"] = names.index(d.name)
    if _SOURCE_VENDOR.get(d.source) is not d.vendor:
        r["k"] = str(d.vendor)
    _put(r, "b", d.pci_bus_id)
    _put(r, "cc", d.compute_capability)
    _put(r, "mt", _mib(d.memory_total))
    _put(r, "mu", _mib(d.memory_used))
    _put(r, "mr", _mib(d.memory_reserved))
    derived_free = (
        d.memory_total - (d.memory_reserved or 0) - d.memory_used
        if d.memory_total is not None and d.memory_used is not None
        else None
    )
    if d.memory_free != derived_free:
        _put(r, "mf", _mib(d.memory_free))
    _put(r, "um", d.unified_memory)
    _put(r, "ug", d.utilization_gpu)
    _put(r, "ux", d.utilization_memory)
    _put(r, "t", d.temperature_c)
    _put(r, "pd", _watts(d.power_draw_w))
    _put(r, "pl", _watts(d.power_limit_w))
    if d.throttle_thermal is not None:
        r["tt"] = d.throttle_thermal
    if d.throttle_power is not None:
        r["tp"] = d.throttle_power
    _put(r, "ec", d.ecc_corrected)
    _put(r, "eu", d.ecc_uncorrected)
    if d.mig_enabled is not None:
        r["mig"] = d.mig_enabled
    if d.mig_devices:  # identity and size; free/instance ids stay local (JSON form)
        r["mg"] = [[_uuid_out(m.uuid), _mib(m.memory_total)] for m in d.mig_devices]
    _put(r, "x", d.xids)
    _put(r, "e", d.error)
    _put(r, "L", d.lost)
    if h.state is not HealthState.HEALTHY:  # absent means healthy
        r["h"] = str(h.state)
    _put(r, "hr", [str(x) for x in h.reasons] or None)
    if lean:
        for key in LEAN_DROPS:
            r.pop(key, None)
    return r


def _cpu_record(c: CpuInfo) -> dict[str, Any]:
    r: dict[str, Any] = {"s": str(c.source)}
    _put(r, "m", c.model)
    _put(r, "a", c.arch)
    _put(r, "cl", c.cores_logical)
    _put(r, "cp", c.cores_physical)
    flags = [name for name, on in (("avx", c.avx), ("avx2", c.avx2), ("avx512", c.avx512)) if on]
    _put(r, "x", flags or None)
    _put(r, "ram", _mib(c.ram_total))
    _put(r, "e", c.error)
    return r


def _capacity_record(c: DeviceCapacity) -> dict[str, Any]:
    r: dict[str, Any] = {"v": _mib(c.vram)}
    _put(r, "p", [_mib(p.vram) for p in c.partitions] or None)
    _put(r, "r", [str(x) for x in c.reasons] or None)
    return r


def _declared_record(g: DeclaredGpu) -> dict[str, Any]:
    r: dict[str, Any] = {"s": SOURCE_DECLARED, "m": g.model, "n": g.count}
    _put(r, "v", _mib(g.vram))
    return r


########################################################################################
# Decoding (input from the network: validate everything)
########################################################################################


class _Malformed(Exception):
    pass


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise _Malformed(message)


def _opt(r: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = r.get(key)
    if value is None:
        return None
    _need(
        isinstance(value, kind) and not (isinstance(value, bool) and kind is int),
        f"{key!r} has wrong type {type(value).__name__}",
    )
    return value


def _req(r: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    _need(key in r, f"missing {key!r}")
    value = _opt(r, key, kind)
    _need(value is not None, f"{key!r} is nil")
    return value


def _opt_mib(r: Mapping[str, Any], key: str) -> int | None:
    value = _opt(r, key, int)
    _need(value is None or value >= 0, f"{key!r} is negative")
    return None if value is None else value * MIB


def _source(text: Any) -> Source:
    try:
        return Source(text)
    except ValueError:
        raise _Malformed(f"unknown source {text!r}") from None


def _from_record(record: Any) -> GpuReport:
    _need(isinstance(record, Mapping), "not a map")
    version = record.get("v")
    _need(version == RECORD_VERSION, f"unsupported version {version!r}")
    a = _req(record, "A", Mapping)
    b = _req(record, "B", Mapping)
    c = _req(record, "C", Mapping)
    probes = tuple(
        ProbeStatus(_source(p[0]), _check_str_or_none(p[1]), _check_int(p[2]))
        for p in _req(a, "p", list)
    )
    default_source = _source(a["s"]) if "s" in a else None
    names = _opt(a, "nm", list) or []
    _need(all(isinstance(n, str) for n in names), "bad name table")
    devices: list[GpuDevice] = []
    health: list[DeviceHealth] = []
    for entry in _req(a, "d", list):
        _need(isinstance(entry, Mapping), "device entry is not a map")
        device, verdict = _device_from(entry, default_source, names)
        devices.append(device)
        health.append(verdict)
    cpu = _cpu_from(_req(a, "cpu", Mapping))
    facts = HardwareFacts(
        devices=tuple(devices),
        cpu=cpu,
        probes=probes,
        driver_version=_opt(a, "drv", str),
        cuda_driver_version=_opt(a, "cuda", str),
    )
    cap_entries = _req(b, "d", list)
    _need(len(cap_entries) == len(devices), "capacity and device lists differ in length")
    capacity = Capacity(
        tuple(_capacity_from(e, d) for e, d in zip(cap_entries, devices, strict=True))
    )
    labels = _req(c, "l", Mapping)
    for key, value in labels.items():
        _need(isinstance(key, str) and isinstance(value, str), "label is not a string")
        try:
            parse_label(f"{key}={value}")
        except ValueError as exc:
            raise _Malformed(str(exc)) from None
    declared: list[DeclaredGpu] = []
    for g in _opt(c, "g", list) or []:
        _need(isinstance(g, Mapping), "declared entry is not a map")
        _need(g.get("s") == SOURCE_DECLARED, "declared entry without source 'declared'")
        try:
            declared.append(DeclaredGpu(_req(g, "m", str), _req(g, "n", int), _opt_mib(g, "v")))
        except ValueError as exc:
            raise _Malformed(str(exc)) from None
    return GpuReport(facts, tuple(health), capacity, labels, declared)


def _check_str_or_none(value: Any) -> str | None:
    _need(value is None or isinstance(value, str), "probe error is not a string")
    return value  # type: ignore[no-any-return]


def _check_int(value: Any) -> int:
    _need(
        isinstance(value, int) and not isinstance(value, bool) and value >= 0, "count is not an int"
    )
    return value  # type: ignore[no-any-return]


def _device_from(
    r: Mapping[str, Any], default_source: Source | None, names: list[str]
) -> tuple[GpuDevice, DeviceHealth]:
    cc = _opt(r, "cc", list)
    if cc is not None:
        _need(len(cc) == 2 and all(isinstance(x, int) for x in cc), "bad compute capability")
    migs = []
    for position, m in enumerate(_opt(r, "mg", list) or []):
        _need(isinstance(m, list) and len(m) >= 2, "bad MIG entry")
        _need(m[1] is None or (isinstance(m[1], int) and m[1] >= 0), "bad MIG entry")
        migs.append(MigDevice(position, _uuid_in(m[0]), None if m[1] is None else m[1] * MIB))
    xids = _opt(r, "x", list) or []
    _need(all(isinstance(x, int) for x in xids), "bad XID list")
    source = _source(r["s"]) if "s" in r else default_source
    _need(source is not None, "device without a source")
    assert source is not None
    vendor = _SOURCE_VENDOR.get(source)
    if "k" in r or vendor is None:
        try:
            vendor = Vendor(_req(r, "k", str))
        except ValueError:
            raise _Malformed(f"unknown vendor {r.get('k')!r}") from None
    name_index = _req(r, "n", int)
    _need(0 <= name_index < len(names), "name index out of range")
    pd, pl = _opt(r, "pd", int), _opt(r, "pl", int)
    memory_total = _opt_mib(r, "mt")
    memory_used = _opt_mib(r, "mu")
    memory_free = _opt_mib(r, "mf")
    memory_reserved = _opt_mib(r, "mr")
    if memory_free is None and memory_total is not None and memory_used is not None:
        memory_free = memory_total - (memory_reserved or 0) - memory_used
    device = GpuDevice(
        index=_req(r, "i", int),
        uuid=_uuid_in(_req(r, "u", (str, bytes))),
        name=names[name_index],
        vendor=vendor,
        source=source,
        pci_bus_id=_opt(r, "b", str),
        compute_capability=(cc[0], cc[1]) if cc is not None else None,
        memory_total=memory_total,
        memory_used=memory_used,
        memory_free=memory_free,
        memory_reserved=memory_reserved,
        unified_memory=bool(_opt(r, "um", bool)),
        utilization_gpu=_opt(r, "ug", int),
        utilization_memory=_opt(r, "ux", int),
        temperature_c=_opt(r, "t", int),
        power_draw_w=None if pd is None else float(pd),
        power_limit_w=None if pl is None else float(pl),
        throttle_thermal=_opt(r, "tt", bool),
        throttle_power=_opt(r, "tp", bool),
        ecc_corrected=_opt(r, "ec", int),
        ecc_uncorrected=_opt(r, "eu", int),
        mig_enabled=_opt(r, "mig", bool),
        mig_devices=tuple(migs),
        xids=tuple(xids),
        error=_opt(r, "e", str),
        lost=bool(_opt(r, "L", bool)),
    )
    try:
        state = HealthState(_opt(r, "h", str) or HealthState.HEALTHY)
    except ValueError:
        raise _Malformed(f"unknown health state {r.get('h')!r}") from None
    reasons = []
    for text in _opt(r, "hr", list) or []:
        try:
            reasons.append(Reason(text))
        except ValueError:
            continue  # a newer member's reason: keep the state, drop what we cannot name
    return device, DeviceHealth(state, tuple(reasons))


def _cpu_from(r: Mapping[str, Any]) -> CpuInfo:
    flags = _opt(r, "x", list) or []
    return CpuInfo(
        model=_opt(r, "m", str),
        arch=_opt(r, "a", str),
        cores_logical=_opt(r, "cl", int),
        cores_physical=_opt(r, "cp", int),
        avx="avx" in flags,
        avx2="avx2" in flags,
        avx512="avx512" in flags,
        ram_total=_opt_mib(r, "ram"),
        source=_source(r.get("s")),
        error=_opt(r, "e", str),
    )


def _capacity_from(r: Any, device: GpuDevice) -> DeviceCapacity:
    _need(isinstance(r, Mapping), "capacity entry is not a map")
    vram = _opt_mib(r, "v")
    _need(vram is not None, "capacity without 'v'")
    parts = _opt(r, "p", list) or []
    _need(len(parts) in (0, len(device.mig_devices)), "partition list does not match MIG devices")
    _need(all(isinstance(p, int) and p >= 0 for p in parts), "bad partition capacity")
    reasons = []
    for text in _opt(r, "r", list) or []:
        try:
            reasons.append(CapacityReason(text))
        except ValueError:
            continue
    return DeviceCapacity(
        device.index,
        device.uuid,
        vram or 0,
        tuple(
            PartitionCapacity(m.uuid, p * MIB)
            for m, p in zip(device.mig_devices, parts, strict=False)
        ),
        tuple(reasons),
    )


########################################################################################
# Provenance
########################################################################################


def field_provenance(record: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Expand a record's section sources into ``{"layer", "source"}`` per field.

    Keys look like ``"gpu.0.memory_total"``, ``"capacity.0.vram"``, ``"label.region"``,
    ``"declared.0"``, ``"cpu.model"``. A reader uses this to show verified (A/B) apart
    from declared (C) values.

    Raises:
        ValueError: the record is malformed.
    """
    report = GpuReport.from_record(record)
    out: dict[str, dict[str, str]] = {}
    device_fields = [f.name for f in attrs.fields(GpuDevice) if f.name not in ("source", "vendor")]
    for position, device in enumerate(report.facts.devices):
        for name in device_fields:
            if getattr(device, name) not in (None, ()):
                out[f"gpu.{position}.{name}"] = {"layer": "A", "source": str(device.source)}
        out[f"gpu.{position}.health"] = {"layer": "A", "source": str(device.source)}
        out[f"capacity.{position}.vram"] = {"layer": "B", "source": SOURCE_DERIVED}
    for name in (
        "model",
        "arch",
        "cores_logical",
        "cores_physical",
        "ram_total",
        "avx",
        "avx2",
        "avx512",
    ):
        if getattr(report.facts.cpu, name) is not None:
            out[f"cpu.{name}"] = {"layer": "A", "source": str(report.facts.cpu.source)}
    for key, _ in report.labels:
        out[f"label.{key}"] = {"layer": "C", "source": SOURCE_OPERATOR}
    for position, _g in enumerate(report.declared):
        out[f"declared.{position}"] = {"layer": "C", "source": SOURCE_DECLARED}
    return out
