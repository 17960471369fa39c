"""`populi_p2p.leases.driver.view`: the placement view of members, the GPU slots of a
record, the API's task spec parser (hostile input) and the rows the CLI shows."""

from __future__ import annotations

from typing import Any

import pytest

from populi_p2p.gpu import build_report
from populi_p2p.gpu._facts import GpuDevice, HardwareFacts, Source, Vendor
from populi_p2p.leases import (
    ClaimRecord,
    LeaseTable,
    Phase,
    Requirements,
    TaskEntry,
    TaskKind,
)
from populi_p2p.leases.driver.view import (
    SYNC_DIGEST_BITS,
    LeaseSection,
    build_candidates,
    candidate,
    entry_detail,
    entry_row,
    explain_view,
    find_entry,
    fits,
    gpu_slots,
    pick_gpus,
    spec_from,
    spec_view,
)
from populi_p2p.leases.placement import Gpu
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.record import Capabilities, NodeRecord, NodeStatus
from swim import Member, MemberState

from ..helpers import SPEC, table

GIB = 1 << 30


def gpu_record(*memories_gib: int) -> dict[str, Any]:
    devices = tuple(
        GpuDevice(
            index=i, uuid=f"GPU-{i}", name="H100", vendor=Vendor.NVIDIA, source=Source.NVML,
            compute_capability=(9, 0), memory_total=m * GIB, memory_used=0, memory_free=m * GIB,
        )
        for i, m in enumerate(memories_gib)
    )  # fmt: skip
    return build_report(HardwareFacts(devices=devices)).to_record()


#: Whose record it is does not matter here: `candidate` names it by the member.
IDENTITY = NodeIdentity.from_seed(b"n" * 32)


def record(name: str, gpu: dict[str, Any] | None = None, **changes: Any) -> NodeRecord:
    fields: dict[str, Any] = dict(
        node_id=IDENTITY.node_id, public_key=IDENTITY.public_key, name=name,
        address="10.0.0.1", port=7946,
        software_version="0.1.0", protocol_version=1, started_at=0.0, sequence=1,
        status=NodeStatus.AVAILABLE,
        capabilities=Capabilities(cpu_cores=8, ram_bytes=64 * GIB, gpu=gpu),
        labels={"rack": "b2"}, certificate=b"c",
    )  # fmt: skip
    fields.update(changes)
    return NodeRecord(**fields)


def member(name: str, state: MemberState = MemberState.ALIVE) -> Member:
    return Member(name, ("10.0.0.1", 7946), state, 0, b"", 0.0)


def test_gpu_slots_of_a_record_and_of_none_or_garbage() -> None:
    slots = gpu_slots(gpu_record(80, 40))
    assert [uuid for uuid, _ in slots] == ["GPU-0", "GPU-1"]
    big, small = (g for _, g in slots)
    assert big.compute_capability == (9, 0) and big.healthy
    assert big.vram_allocatable > small.vram_allocatable > 0
    assert gpu_slots(None) == []
    assert gpu_slots({"v": 99, "junk": True}) == []


def test_a_candidate_needs_a_verified_record() -> None:
    assert candidate(member("a"), None, 0.5) is None
    c = candidate(member("a", MemberState.SUSPECT), record("a", gpu_record(80)), 0.5)
    assert c is not None
    assert (c.node_id, c.state, c.draining, c.reliability) == ("a", "suspect", False, 0.5)
    assert (c.cpu_cores, c.ram, c.labels, len(c.gpus)) == (8.0, 64 * GIB, frozenset({"rack=b2"}), 1)


def test_only_the_accepting_node_is_zero_seconds_away() -> None:
    assert candidate(member("a"), record("a"), 0.5, accepting="a").rtt == 0.0  # type: ignore[union-attr]
    assert candidate(member("b"), record("b"), 0.5, accepting="a").rtt is None  # type: ignore[union-attr]


def test_draining_comes_from_the_record_or_our_own_flag() -> None:
    draining = record("a", status=NodeStatus.DRAINING)
    assert candidate(member("a"), draining, 0.5).draining  # type: ignore[union-attr]
    records = {"me": record("me"), "b": record("b"), "c": None}
    built = build_candidates(
        [member("me"), member("b"), member("c")], records.get, {"b": 0.9}, 0.1,
        me="me", draining=True, accepting="me",
    )  # fmt: skip
    assert [(c.node_id, c.draining, c.reliability) for c in built] == [
        ("me", True, 0.1),
        ("b", False, 0.9),
    ]


def test_fits_checks_health_capability_and_vram() -> None:
    req = Requirements(gpu_count=1, vram_per_gpu=10, compute_capability_min=(8, 0))
    assert fits(Gpu(10, (8, 0)), req)
    assert not fits(Gpu(9, (8, 0)), req)
    assert not fits(Gpu(10, (7, 5)), req)
    assert not fits(Gpu(10, (9, 0), healthy=False), req)


def test_pick_gpus_takes_free_ones_that_fit_or_none() -> None:
    mine = record("me", gpu_record(80, 80, 16))
    req = Requirements(gpu_count=2, vram_per_gpu=40 * GIB)
    assert pick_gpus(mine, set(), req) == [("GPU-0", 40 * GIB), ("GPU-1", 40 * GIB)]
    assert pick_gpus(mine, {"GPU-0"}, req) is None  # GPU-2 is too small
    assert pick_gpus(None, set(), req) is None
    assert pick_gpus(None, set(), Requirements()) == []


def entry(task_id: str, *claims: ClaimRecord) -> TaskEntry:
    return TaskEntry(task_id, SPEC, b"sig", claims)


def test_find_entry_by_id_or_a_unique_prefix() -> None:
    entries = [entry("abc1"), entry("abc2"), entry("abd"), entry("ab")]
    assert find_entry(entries, "abd").task_id == "abd"
    assert find_entry(entries, "abc1").task_id == "abc1"
    assert find_entry(entries, "ab").task_id == "ab"  # exact beats prefix
    for bad in ("abc", "zz", ""):
        with pytest.raises(KeyError, match="no single task matches"):
            find_entry(entries, bad)


def test_spec_from_reads_the_api_json() -> None:
    spec = spec_from(
        {
            "kind": "batch", "command": ["python", "x.py"], "env": {"A": 1}, "gpus": 1,
            "vram": 8 * GIB, "min_cc": "8.6", "cpus": 2, "ram": GIB, "labels": ["rack=b2"],
            "timeout": 60, "retries": 0, "no_network": True, "outputs": ["out/a.txt"],
        },
        "me", 100.0,
    )  # fmt: skip
    assert spec.command == ("python", "x.py") and spec.env == {"A": "1"}
    assert spec.requirements.compute_capability_min == (8, 6)
    assert (spec.submitted_by, spec.submitted_at, spec.no_network) == ("me", 100.0, True)
    assert (spec.timeout, spec.retry_limit, spec.kind) == (60.0, 0, TaskKind.BATCH)
    view = spec_view(spec)
    assert view["requirements"]["min_cc"] == "8.6" and view["outputs"] == ["out/a.txt"]
    # The view reads back into the same spec.
    again = spec_from(
        {**view, **view["requirements"], "min_cc": "8.6", "vram": 8 * GIB}, "me", 100.0
    )
    assert again == spec


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ([], "must be a JSON object"),
        ({"env": ["A"]}, "env must be a map"),
        ({"no_network": "yes"}, "no_network must be true or false"),
        ({"inputs": "blob"}, "inputs must be a list"),
        ({"outputs": [1]}, "outputs must be a list"),
        ({"deployment": 3}, "deployment must be"),
        ({"kind": "nonsense"}, "nonsense"),
        ({"gpus": "many"}, "invalid literal"),
        ({"labels": 5}, "bad task spec"),
    ],
)
def test_spec_from_refuses_hostile_json_with_a_value_error(fields: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        spec_from(fields, "me", 0.0)


def claim(epoch: int, owner: str, phase: Phase = Phase.RUNNING) -> ClaimRecord:
    return ClaimRecord(
        epoch=epoch, rank=0, owner=owner, signature=b"s", explanation="fit", phase=phase
    )


def test_rows_and_details_show_the_current_claim() -> None:
    e = entry("t1", claim(1, "a", Phase.FAILED), claim(2, "b"))
    row = entry_row(e, "why not", now_real=SPEC.submitted_at + 12.34)
    assert {k: row[k] for k in ("id", "epoch", "owner", "phase", "age", "why")} == {
        "id": "t1", "epoch": 2, "owner": "b", "phase": "running", "age": 12.3, "why": "why not",
    }  # fmt: skip
    detail = entry_detail(e, None)
    assert [(d["epoch"], d["owner"], d["phase"]) for d in detail["epochs"]] == [
        (1, "a", "failed"),
        (2, "b", "running"),
    ]
    assert detail["result"] is None and detail["spec"] == spec_view(SPEC)
    assert explain_view(e, "placed on b") == {
        "id": "t1", "phase": "running", "claim": "epoch 2 -> b: fit", "placement": "placed on b",
    }  # fmt: skip
    pending = explain_view(TaskEntry("t2"), None)
    assert pending["claim"] is None and pending["phase"] == "pending"
    assert entry_row(TaskEntry("t2"), None)["age"] is None


def test_the_lease_section_syncs_two_tables() -> None:
    a: LeaseTable = table(SPEC.submitted_by)
    b: LeaseTable = table("b")
    a.submit(SPEC, 0.0)
    merged: list[object] = []
    section_a = LeaseSection(a, merged.extend, lambda: 1.0)
    section_b = LeaseSection(b, merged.extend, lambda: 1.0)
    assert section_a.digest() == a.digest(bits=SYNC_DIGEST_BITS)
    assert len(section_a.digest()) <= 256  # swim's bound on a sync's application digest
    assert section_a.digest() != section_b.digest()
    assert section_a.state_for(b"") is None
    payload = section_a.state_for(section_b.digest())
    assert payload is not None
    section_b.merge(payload)
    assert b.get(SPEC.task_id()) is not None
    assert merged  # the merge's events reach the service
    assert section_a.digest() == section_b.digest()
