"""Layer B: allocatable capacity, a pure function of Layer A facts and local policy.

Theory of operation
-------------------
What a node *offers* differs from what its GPUs *have*: the owner keeps some VRAM for
local use (``--reserve-vram``) or whole GPUs (withheld by index or UUID), a GPU in MIG
mode is only usable through its MIG instances, an unhealthy or disqualified device offers
nothing, and work this node already runs (its own leases) has claimed some memory.

For one device (or MIG instance), in bytes::

    allocatable = max(0, min(total - reserve - leased, free))

``total - reserve - leased`` honours the reservation and leases that have not touched
memory yet; ``free`` honours everything else already resident (the owner's games, other
tenants' processes, leases that use more than they asked for). Using the smaller of the
two never offers memory twice. On unified-memory machines ``total`` is first scaled by
``unified_memory_fraction``, because the GPU shares that RAM with the OS.

Capacity is recomputed from the latest facts every time the monitor evaluates, so a device
turning unhealthy drops to zero in the same evaluation; there is no hysteresis here.
Invariants (property-tested): never negative, never above the device's total or free
memory, zero for unhealthy/disqualified/withheld devices, and unaffected by Layer C.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence

import attrs

from ._facts import GpuDevice, MigDevice
from ._health import DeviceHealth, HealthState


class CapacityReason(enum.StrEnum):
    """Why a device offers less than its memory. Wire values: ONLY APPEND."""

    UNHEALTHY = "unhealthy"
    DISQUALIFIED = "disqualified"
    WITHHELD = "withheld"
    MIG_NO_INSTANCES = "mig_empty"
    MEMORY_UNKNOWN = "mem_unknown"
    RESERVED = "reserved"
    LEASED = "leased"
    IN_USE = "in_use"


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


def _fraction(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be in [0, 1], got {value!r}")


def _frozen_keys(value: Iterable[str | int]) -> frozenset[str]:
    return frozenset(str(v) for v in value)


@attrs.frozen
class CapacityPolicy:
    """The owner's local policy for what the node offers."""

    #: Bytes kept back on every physical device for the owner (``--reserve-vram``).
    reserve_vram: int = attrs.field(default=0, validator=_non_negative)
    #: Devices never offered: a device index ("0"), a GPU UUID or a MIG UUID.
    withheld: frozenset[str] = attrs.field(default=frozenset(), converter=_frozen_keys)
    #: Share of a unified-memory GPU's RAM offered as VRAM. 0.75 matches the default
    #: Metal working-set limit on Apple Silicon; the rest stays with the OS.
    unified_memory_fraction: float = attrs.field(default=0.75, validator=_fraction)


@attrs.frozen
class Allocation:
    """Work already running here: ``vram`` bytes leased on ``device`` (index, GPU UUID
    or MIG UUID)."""

    device: str = attrs.field(converter=str)
    vram: int = attrs.field(validator=_non_negative)


@attrs.frozen
class PartitionCapacity:
    """Allocatable bytes of one MIG instance: the largest unit placeable there."""

    uuid: str
    vram: int


@attrs.frozen
class DeviceCapacity:
    """What one physical device offers. With MIG, ``vram`` is the sum of its partitions
    and work must fit one partition (see :attr:`largest_unit`)."""

    index: int
    uuid: str
    vram: int
    partitions: tuple[PartitionCapacity, ...] = ()
    reasons: tuple[CapacityReason, ...] = ()

    @property
    def largest_unit(self) -> int:
        """The biggest single allocation this device can take."""
        if self.partitions:
            return max(p.vram for p in self.partitions)
        return self.vram


@attrs.frozen
class Capacity:
    """Layer B for the node, one entry per Layer A device, in the same order."""

    devices: tuple[DeviceCapacity, ...] = ()

    @property
    def vram_total(self) -> int:
        return sum(d.vram for d in self.devices)

    @property
    def allocatable_devices(self) -> int:
        return sum(1 for d in self.devices if d.vram > 0)


def _matches(key: str, device: GpuDevice) -> bool:
    return key == str(device.index) or key == device.uuid


def _leased(allocations: Sequence[Allocation], keys: Iterable[str]) -> int:
    wanted = set(keys)
    return sum(a.vram for a in allocations if a.device in wanted)


def _mig_capacity(
    device: GpuDevice,
    policy: CapacityPolicy,
    allocations: Sequence[Allocation],
    reasons: list[CapacityReason],
) -> tuple[int, tuple[PartitionCapacity, ...]]:
    if not device.mig_devices:
        reasons.append(CapacityReason.MIG_NO_INSTANCES)
        return 0, ()
    # Per partition: its own total/free minus leases placed on it by MIG UUID.
    amounts: list[int] = []
    for mig in device.mig_devices:
        amounts.append(_partition_amount(mig, policy, allocations, reasons))
    # Then what applies to the parent (reservation, leases named by index or GPU UUID),
    # taken greedily in order, and the parent's total as a ceiling. Not the parent's
    # free memory: in MIG mode it already counts what each instance uses, which the
    # per-instance free above has accounted for.
    parent_debt = policy.reserve_vram + _leased(allocations, (str(device.index), device.uuid))
    if policy.reserve_vram:
        reasons.append(CapacityReason.RESERVED)
    budget = device.memory_total
    out: list[PartitionCapacity] = []
    for mig, amount in zip(device.mig_devices, amounts, strict=True):
        take = min(parent_debt, amount)
        amount -= take
        parent_debt -= take
        if budget is not None:
            amount = min(amount, budget)
            budget -= amount
        out.append(PartitionCapacity(mig.uuid, amount))
    return sum(p.vram for p in out), tuple(out)


def _partition_amount(
    mig: MigDevice,
    policy: CapacityPolicy,
    allocations: Sequence[Allocation],
    reasons: list[CapacityReason],
) -> int:
    if mig.uuid in policy.withheld:
        if CapacityReason.WITHHELD not in reasons:
            reasons.append(CapacityReason.WITHHELD)
        return 0
    if mig.memory_total is None:
        if CapacityReason.MEMORY_UNKNOWN not in reasons:
            reasons.append(CapacityReason.MEMORY_UNKNOWN)
        return 0
    amount = mig.memory_total - _leased(allocations, (mig.uuid,))
    if mig.memory_free is not None:
        amount = min(amount, mig.memory_free)
    return max(0, amount)


def _device_capacity(
    device: GpuDevice,
    health: DeviceHealth | None,
    policy: CapacityPolicy,
    allocations: Sequence[Allocation],
) -> DeviceCapacity:
    def nothing(reason: CapacityReason) -> DeviceCapacity:
        return DeviceCapacity(device.index, device.uuid, 0, (), (reason,))

    if health is None or health.state is HealthState.UNHEALTHY:
        return nothing(CapacityReason.UNHEALTHY)
    if not health.eligible:
        return nothing(CapacityReason.DISQUALIFIED)
    if any(_matches(key, device) for key in policy.withheld):
        return nothing(CapacityReason.WITHHELD)
    reasons: list[CapacityReason] = []
    if device.mig_enabled:
        vram, partitions = _mig_capacity(device, policy, allocations, reasons)
        return DeviceCapacity(device.index, device.uuid, vram, partitions, tuple(reasons))
    if device.memory_total is None:
        return nothing(CapacityReason.MEMORY_UNKNOWN)
    total = device.memory_total
    if device.unified_memory:
        total = int(total * policy.unified_memory_fraction)
    leased = _leased(allocations, (str(device.index), device.uuid))
    if policy.reserve_vram:
        reasons.append(CapacityReason.RESERVED)
    if leased:
        reasons.append(CapacityReason.LEASED)
    vram = total - (device.memory_reserved or 0) - policy.reserve_vram - leased
    if device.memory_free is not None and device.memory_free < vram:
        vram = device.memory_free
        reasons.append(CapacityReason.IN_USE)
    return DeviceCapacity(device.index, device.uuid, max(0, vram), (), tuple(reasons))


def compute_capacity(
    devices: Sequence[GpuDevice],
    health: Sequence[DeviceHealth | None] | Mapping[str, DeviceHealth],
    policy: CapacityPolicy | None = None,
    allocations: Sequence[Allocation] = (),
) -> Capacity:
    """Layer B from Layer A: what each device offers right now.

    Args:
        devices: Layer A devices.
        health: the verdict per device, either aligned with ``devices`` or keyed by UUID.
            A device without a verdict is treated as unhealthy (never offer what was
            not assessed).
        policy: reservations and withheld devices.
        allocations: work already running on this node, by device.

    Returns:
        One :class:`DeviceCapacity` per device, in order.
    """
    policy = policy or CapacityPolicy()
    if isinstance(health, Mapping):
        verdicts: list[DeviceHealth | None] = [health.get(d.uuid) for d in devices]
    else:
        verdicts = list(health)
        if len(verdicts) != len(devices):
            raise ValueError(f"{len(verdicts)} health verdicts for {len(devices)} devices")
    return Capacity(
        tuple(
            _device_capacity(device, verdict, policy, allocations)
            for device, verdict in zip(devices, verdicts, strict=True)
        )
    )
