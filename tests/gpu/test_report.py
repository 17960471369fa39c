"""The GPU report's record form (NodeRecord), provenance and presentation."""

from __future__ import annotations

import copy

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from populi_p2p.gpu import (
    GIB,
    MIB,
    RECORD_VERSION,
    Allocation,
    CapacityPolicy,
    DeclaredGpu,
    GpuDevice,
    GpuReport,
    HardwareFacts,
    HealthState,
    MigDevice,
    Source,
    Vendor,
    build_report,
    field_provenance,
    member_gpu_summary,
)

from .gpu_helpers import CPU, eight_gpu_report, h100, hardware_facts


def test_record_for_8_gpus_is_small():
    """The whole GPU report for an 8xH100 box, with labels and a declared GPU, must leave
    room in the 4 KiB member metadata for the rest of the signed NodeRecord."""
    report = eight_gpu_report(
        labels={"region": "eu-west-1", "pool": "training", "cost-tier": "reserved"},
        declared=[DeclaredGpu("H100", 8, 80 * GIB)],
        policy=CapacityPolicy(reserve_vram=2 * GIB),
    )
    packed = msgpack.packb(report.to_record())
    print(f"GPU record for 8 GPUs: {len(packed)} bytes")
    assert len(packed) <= 1500
    # And a full MIG box: 8 GPUs x 7 instances.
    migs = tuple(
        h100(
            i,
            mig_enabled=True,
            mig_devices=tuple(
                MigDevice(
                    m,
                    f"MIG-{i:04x}{m:04x}-1111-4222-8333-444444444444",
                    9728 * MIB,
                    9700 * MIB,
                    m + 1,
                    0,
                )
                for m in range(7)
            ),
        )
        for i in range(8)
    )
    mig_report = build_report(HardwareFacts(devices=migs, cpu=CPU))
    mig_packed = msgpack.packb(mig_report.to_record())
    print(f"GPU record for 8 GPUs x 7 MIG: {len(mig_packed)} bytes")
    assert len(mig_packed) <= 3000
    # Over budget, the record drops telemetry first, and says so by raising past that.
    lean = mig_report.to_record(max_bytes=2400)
    assert len(msgpack.packb(lean)) <= 2400
    assert "pd" not in lean["A"]["d"][0] and "mt" in lean["A"]["d"][0]
    assert (
        GpuReport.from_record(lean).capacity
        == GpuReport.from_record(mig_report.to_record()).capacity
    )
    with pytest.raises(ValueError, match="even lean"):
        mig_report.to_record(max_bytes=1000)
    assert report.to_record(max_bytes=4096) == report.to_record()


def test_uuids_travel_compactly_but_read_back_exactly():
    odd = h100(1, uuid="GPU-NOT-A-STANDARD-UUID", source=Source.NVIDIA_SMI)
    apple_amd = GpuDevice(1, "apple-x-1", "AMD Radeon Pro 5500M", Vendor.AMD,
                          Source.SYSTEM_PROFILER, memory_total=8 * GIB)  # fmt: skip
    report = build_report(HardwareFacts(devices=(h100(0), odd, apple_amd)))
    record = report.to_record()
    first, second, third = record["A"]["d"]
    assert isinstance(first["u"], bytes) and len(first["u"]) == 17
    assert second["u"] == "GPU-NOT-A-STANDARD-UUID" and second["s"] == "nvidia-smi"
    assert third["k"] == "amd"  # a vendor its source does not imply is written out
    back = GpuReport.from_record(msgpack.unpackb(msgpack.packb(record)))
    assert [d.uuid for d in back.facts.devices] == [d.uuid for d in report.facts.devices]
    assert [d.vendor for d in back.facts.devices] == [Vendor.NVIDIA, Vendor.NVIDIA, Vendor.AMD]


def test_record_round_trip_exact_for_mib_aligned_facts():
    report = eight_gpu_report(labels={"region": "eu"}, declared=[DeclaredGpu("A100", 2)])
    record = report.to_record()
    back = GpuReport.from_record(msgpack.unpackb(msgpack.packb(record)))
    assert back == report
    assert back.to_record() == record


def test_record_is_deterministic():
    a = eight_gpu_report(labels={"b": "1", "a": "2"})
    b = eight_gpu_report(labels={"a": "2", "b": "1"})
    assert msgpack.packb(a.to_record()) == msgpack.packb(b.to_record())


def test_record_sections_say_layer_and_source():
    report = eight_gpu_report(labels={"region": "eu"}, declared=[DeclaredGpu("A100")])
    record = report.to_record()
    assert record["v"] == RECORD_VERSION
    assert record["A"]["s"] == "nvml"  # the default source of every device in A
    assert all("s" not in d for d in record["A"]["d"])
    assert record["B"]["s"] == "derived"
    assert record["C"]["s"] == "operator"
    assert record["C"]["g"][0]["s"] == "declared"
    prov = field_provenance(record)
    assert prov["gpu.0.memory_total"] == {"layer": "A", "source": "nvml"}
    assert prov["gpu.0.health"] == {"layer": "A", "source": "nvml"}
    assert prov["capacity.0.vram"] == {"layer": "B", "source": "derived"}
    assert prov["label.region"] == {"layer": "C", "source": "operator"}
    assert prov["declared.0"] == {"layer": "C", "source": "declared"}
    assert prov["cpu.model"] == {"layer": "A", "source": "procfs"}
    assert all(p["layer"] in "ABC" for p in prov.values())


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(hardware_facts(max_devices=4), st.lists(st.integers(0, 100 * GIB), max_size=3))
def test_record_round_trip_is_canonical(facts, leases):
    allocations = [Allocation("0", v) for v in leases]
    report = build_report(facts, allocations=allocations, labels={"k": "v"})
    record = report.to_record()
    wire = msgpack.unpackb(msgpack.packb(record))
    back = GpuReport.from_record(wire)
    assert back.to_record() == record
    assert [h.state for h in back.health] == [h.state for h in report.health]
    assert back.capacity.vram_total <= report.capacity.vram_total  # floored to MiB


def _mutations(record):
    """Structurally plausible corruptions of a valid record."""
    yield None
    yield []
    yield {}
    yield {**record, "v": 2}
    for section in ("A", "B", "C"):
        broken = copy.deepcopy(record)
        del broken[section]
        yield broken
        broken = copy.deepcopy(record)
        broken[section] = "nope"
        yield broken
    for key, value in [
        ("i", "zero"), ("u", None), ("mt", -1), ("mt", "big"), ("cc", [9]), ("h", "fine"),
        ("k", "intel"), ("s", "guess"), ("mg", [[0]]), ("x", ["79"]), ("tt", "yes"),
        ("L", 1),
    ]:  # fmt: skip
        broken = copy.deepcopy(record)
        broken["A"]["d"][0][key] = value
        yield broken
    broken = copy.deepcopy(record)
    broken["B"]["d"].pop()
    yield broken
    broken = copy.deepcopy(record)
    broken["C"]["l"] = {"bad key": "x"}
    yield broken
    broken = copy.deepcopy(record)
    broken["C"]["g"] = [{"s": "nvml", "m": "A100", "n": 1}]
    yield broken
    broken = copy.deepcopy(record)
    broken["A"]["p"] = [["nvml"]]
    yield broken


def test_malformed_records_raise_value_error_only():
    record = eight_gpu_report(declared=[DeclaredGpu("A100")]).to_record()
    count = 0
    for broken in _mutations(record):
        count += 1
        with pytest.raises(ValueError, match="GPU record"):
            GpuReport.from_record(broken)
        assert member_gpu_summary(broken) in ("GPU record unreadable", "no GPU record")
    assert count > 20


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["v", "A", "B", "C", "d", "p", "cpu"]), json_values))
def test_arbitrary_input_never_crashes_the_parser(garbage):
    try:
        GpuReport.from_record(garbage)
    except ValueError:
        pass


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_fuzzed_valid_record_fields_never_crash(data):
    record = eight_gpu_report().to_record()
    device = record["A"]["d"][data.draw(st.integers(0, 7))]
    key = data.draw(st.sampled_from(sorted(device)))
    device[key] = data.draw(json_values)
    try:
        GpuReport.from_record(record)
    except ValueError:
        pass


def test_unknown_keys_and_reasons_from_newer_members_are_tolerated():
    record = eight_gpu_report().to_record()
    record["A"]["d"][0]["zz"] = "future field"
    record["A"]["d"][0]["h"] = "degraded"
    record["A"]["d"][0]["hr"] = ["thermal_throttle", "some_future_reason"]
    record["future_section"] = {"x": 1}
    report = GpuReport.from_record(record)
    assert report.health[0].state is HealthState.DEGRADED
    assert [str(r) for r in report.health[0].reasons] == ["thermal_throttle"]
