"""Layer B: capacity as a pure function of facts, and its invariants (Hypothesis)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from populi_p2p.gpu import (
    GIB,
    Allocation,
    CapacityPolicy,
    CapacityReason,
    DeclaredGpu,
    DeviceHealth,
    GpuDevice,
    HardwareFacts,
    HealthState,
    MigDevice,
    Reason,
    Source,
    Vendor,
    build_report,
    compute_capacity,
)

from .gpu_helpers import hardware_facts

HEALTHY = DeviceHealth(HealthState.HEALTHY)
GPU = GpuDevice(
    index=0,
    uuid="GPU-a",
    name="NVIDIA GeForce RTX 4090",
    vendor=Vendor.NVIDIA,
    source=Source.NVML,
    memory_total=24 * GIB,
    memory_used=1 * GIB,
    memory_free=23 * GIB,
)


def cap(device=GPU, health=HEALTHY, policy=None, allocations=()):
    (out,) = compute_capacity([device], [health], policy, allocations).devices
    return out


def test_free_memory_offered():
    assert cap().vram == 23 * GIB
    assert cap().reasons == (CapacityReason.IN_USE,)


def test_reserve_and_leases_subtract_from_total():
    policy = CapacityPolicy(reserve_vram=4 * GIB)
    # total 24 - reserve 4 - lease 6 = 14, below free (23): the reservation holds even
    # though the owner is not using it right now.
    c = cap(policy=policy, allocations=[Allocation("GPU-a", 6 * GIB)])
    assert c.vram == 14 * GIB
    assert c.reasons == (CapacityReason.RESERVED, CapacityReason.LEASED)
    # Leases by index count the same as by UUID; leases on other devices do not count.
    assert cap(allocations=[Allocation(0, 6 * GIB), Allocation("GPU-b", 9 * GIB)]).vram == (
        18 * GIB
    )


def test_withheld_by_index_or_uuid():
    for key in ("0", "GPU-a"):
        c = cap(policy=CapacityPolicy(withheld={key}))
        assert c.vram == 0 and c.reasons == (CapacityReason.WITHHELD,)


def test_unhealthy_and_disqualified_offer_nothing():
    lost = DeviceHealth.from_reasons((Reason.LOST,))
    assert cap(health=lost).vram == 0
    assert cap(health=lost).reasons == (CapacityReason.UNHEALTHY,)
    bad_driver = DeviceHealth.from_reasons((Reason.DRIVER_BLOCKLISTED,))
    assert bad_driver.state is HealthState.DEGRADED
    assert cap(health=bad_driver).reasons == (CapacityReason.DISQUALIFIED,)
    # A device with no verdict is never offered.
    (c,) = compute_capacity([GPU], {}).devices
    assert c.vram == 0


def test_unknown_memory_offers_nothing():
    c = cap(device=attrs.evolve(GPU, memory_total=None, memory_free=None))
    assert c.vram == 0 and c.reasons == (CapacityReason.MEMORY_UNKNOWN,)


def test_mig_partitions_and_parent_leases():
    device = attrs.evolve(
        GPU,
        memory_total=80 * GIB,
        memory_free=79 * GIB,
        mig_enabled=True,
        mig_devices=(
            MigDevice(0, "MIG-0", 40 * GIB, 40 * GIB),
            MigDevice(1, "MIG-1", 20 * GIB, 19 * GIB),
            MigDevice(2, "MIG-2", 20 * GIB, 20 * GIB),
        ),
    )
    c = cap(device=device, allocations=[Allocation("MIG-0", 10 * GIB)])
    assert [p.vram for p in c.partitions] == [30 * GIB, 19 * GIB, 20 * GIB]
    assert c.vram == 69 * GIB and c.largest_unit == 30 * GIB
    c = cap(device=device, policy=CapacityPolicy(withheld={"MIG-2"}))
    assert [p.vram for p in c.partitions] == [40 * GIB, 19 * GIB, 0]
    # Reserve on a MIG GPU comes out of its partitions in order.
    c = cap(device=device, policy=CapacityPolicy(reserve_vram=45 * GIB))
    assert [p.vram for p in c.partitions] == [0, 14 * GIB, 20 * GIB]


def test_health_list_must_align():
    with pytest.raises(ValueError, match="health verdicts"):
        compute_capacity([GPU], [])


def test_policy_validation():
    with pytest.raises(ValueError, match="reserve_vram"):
        CapacityPolicy(reserve_vram=-1)
    with pytest.raises(ValueError, match="unified_memory_fraction"):
        CapacityPolicy(unified_memory_fraction=1.5)
    with pytest.raises(ValueError, match="vram"):
        Allocation("0", -5)


########################################################################################
# Properties
########################################################################################

policies = st.builds(
    CapacityPolicy,
    reserve_vram=st.integers(0, 100 * GIB),
    withheld=st.frozensets(st.sampled_from(["0", "1", "GPU-2", "MIG-0-1", "nope"]), max_size=2),
    unified_memory_fraction=st.floats(0, 1),
)
allocations = st.lists(
    st.builds(
        Allocation,
        device=st.sampled_from(["0", "1", "2", "GPU-3", "MIG-0-0", "MIG-1-1", "elsewhere"]),
        vram=st.integers(0, 100 * GIB),
    ),
    max_size=5,
)
SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(hardware_facts(max_devices=4), policies, allocations)
def test_capacity_never_exceeds_facts(facts, policy, allocs):
    report = build_report(facts, policy=policy, allocations=allocs)
    for device, c in zip(facts.devices, report.capacity.devices, strict=True):
        assert c.vram >= 0
        assert (c.index, c.uuid) == (device.index, device.uuid)
        if device.memory_total is None and not device.mig_enabled:
            assert c.vram == 0
        if device.memory_total is not None:
            assert c.vram <= device.memory_total
        if device.mig_enabled:
            assert c.vram == sum(p.vram for p in c.partitions)
            for mig, p in zip(device.mig_devices, c.partitions, strict=False):
                assert p.uuid == mig.uuid
                assert 0 <= p.vram <= (mig.memory_total or 0)
                if mig.memory_free is not None:
                    assert p.vram <= mig.memory_free
        elif device.memory_free is not None:
            assert c.vram <= device.memory_free
    assert report.capacity.vram_total == sum(c.vram for c in report.capacity.devices)


@SETTINGS
@given(hardware_facts(max_devices=4), policies, allocations)
def test_unhealthy_or_ineligible_device_has_zero_capacity(facts, policy, allocs):
    report = build_report(facts, policy=policy, allocations=allocs)
    for health, c in zip(report.health, report.capacity.devices, strict=True):
        if health.state is HealthState.UNHEALTHY or not health.eligible:
            assert c.vram == 0
            assert all(p.vram == 0 for p in c.partitions)
            assert c.largest_unit == 0


@SETTINGS
@given(hardware_facts(max_devices=4), allocations, st.integers(0, 10 * GIB))
def test_more_reservation_or_leases_never_increase_capacity(facts, allocs, extra):
    base = build_report(facts, allocations=allocs[:-1] if allocs else ()).capacity
    more_leases = build_report(facts, allocations=allocs).capacity
    more_reserve = build_report(
        facts, allocations=allocs[:-1] if allocs else (), policy=CapacityPolicy(reserve_vram=extra)
    ).capacity
    for a, b, c in zip(base.devices, more_leases.devices, more_reserve.devices, strict=True):
        assert b.vram <= a.vram
        assert c.vram <= a.vram


labels = st.dictionaries(
    st.from_regex(r"[a-z][a-z0-9]{0,10}", fullmatch=True),
    st.from_regex(r"[a-z0-9]{0,10}", fullmatch=True),
    max_size=5,
)
declared = st.lists(
    st.builds(
        DeclaredGpu,
        model=st.sampled_from(["A100", "H100", "RTX 4090", "MI300X"]),
        count=st.integers(1, 8),
        vram=st.none() | st.integers(0, 200 * GIB),
    ),
    max_size=4,
)


@SETTINGS
@given(hardware_facts(max_devices=4), labels, declared)
def test_labels_and_declared_gpus_never_create_capacity(facts, labels, declared):
    without = build_report(facts)
    with_c = build_report(facts, labels=labels, declared=declared)
    assert with_c.capacity == without.capacity
    assert with_c.health == without.health
    assert with_c.declared == tuple(declared)
    if not facts.devices:
        assert with_c.capacity.vram_total == 0
        assert with_c.capacity.devices == ()


def test_declared_only_node_offers_nothing():
    report = build_report(
        HardwareFacts(), labels={"gpu": "a100"}, declared=[DeclaredGpu("A100", 8, 80 * GIB)]
    )
    assert report.capacity.vram_total == 0
    assert report.capacity.allocatable_devices == 0
    assert report.to_record()["B"]["d"] == []
    assert report.to_record()["C"]["g"] == [{"s": "declared", "m": "A100", "n": 8, "v": 80 * 1024}]
