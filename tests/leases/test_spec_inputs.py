"""Task inputs (blobs named by hash in the signed spec) and deployments: the spec's
twelfth and thirteenth elements, and placement's anti-affinity between the replicas
of one deployment."""

from __future__ import annotations

import random

import pytest

from populi_p2p.leases import BlobInput, Deployment, LeaseConfig, Requirements, TaskKind, TaskSpec
from populi_p2p.leases.placement import Candidate, place, replica_nodes

SHA = "ab" * 32


def replica(index: int, name: str = "qwen", replicas: int = 2, **kw) -> TaskSpec:
    return TaskSpec(
        TaskKind.INFERENCE, Requirements(), ["populi-engine", name], submitted_by="n0",
        replicas=("n0", "n1", "n2"), inputs=[BlobInput("model", SHA, 1234)],
        deployment=Deployment(name, index, replicas), **kw,
    )  # fmt: skip


def test_inputs_and_deployment_round_trip_and_change_the_id() -> None:
    spec = replica(0)
    assert TaskSpec.from_wire(spec.to_wire()) == spec
    assert len(spec.to_wire()) == 13
    plain = TaskSpec(TaskKind.INFERENCE, Requirements(), ["x"], submitted_by="n0")
    assert len(plain.to_wire()) == 9  # specs without inputs keep their bytes and ids
    assert replica(1).task_id() != spec.task_id()
    two = [BlobInput("b.bin", SHA, 1), BlobInput("a.bin", SHA, 2)]
    with_input = TaskSpec(TaskKind.BATCH, Requirements(), ["x"], submitted_by="n0", inputs=two)
    assert [i.name for i in with_input.inputs] == ["a.bin", "b.bin"]  # sorted
    assert TaskSpec.from_wire(with_input.to_wire()) == with_input


@pytest.mark.parametrize(
    "mutate",
    [
        lambda w: w.__setitem__(11, [["b", SHA, 1], ["a", SHA, 1]]),  # not sorted
        lambda w: w.__setitem__(11, [["model", "XY" * 32, 1]]),  # not lower-case hex
        lambda w: w.__setitem__(11, [["../model", SHA, 1]]),  # a path
        lambda w: w.__setitem__(11, [["model", SHA, -1]]),
        lambda w: w.__setitem__(11, "junk"),
        lambda w: w.__setitem__(12, ["qwen", 2, 2, 0]),  # index past the count
        lambda w: w.__setitem__(12, ["qwen", 0, 2]),
        lambda w: w.__setitem__(11, []),  # a deployment without its model input
        lambda w: (w.__setitem__(11, []), w.__setitem__(12, None)),  # neither: not encoded
    ],
)
def test_hostile_encodings_are_refused(mutate) -> None:
    wire = replica(0).to_wire()
    mutate(wire)
    with pytest.raises((ValueError, TypeError)):
        TaskSpec.from_wire(wire)


def test_bad_inputs_are_one_line() -> None:
    with pytest.raises(ValueError, match="same name"):
        TaskSpec(TaskKind.BATCH, Requirements(), ["x"], submitted_by="n0",
                 inputs=[BlobInput("a", SHA, 1), BlobInput("a", SHA, 2)])  # fmt: skip
    with pytest.raises(ValueError, match="input named model"):
        TaskSpec(TaskKind.INFERENCE, Requirements(), ["x"], submitted_by="n0",
                 deployment=Deployment("m", 0, 1))  # fmt: skip
    with pytest.raises(ValueError, match="replicas must be"):
        Deployment("m", 0, 0)


def test_replicas_of_one_deployment_never_share_a_node() -> None:
    nodes = [Candidate(f"n{i}", cpu_cores=8, ram=1 << 34) for i in range(3)]
    first, second = replica(0), replica(1)
    spread = replica_nodes(second.task_id(), second, [], [(first.task_id(), first, "n1")])
    assert spread == {"n1"}
    p = place(second, nodes, config=LeaseConfig(), rng=random.Random(0), spread=spread)
    assert p.chosen in {"n0", "n2"}
    assert p.removed["anti_affinity"] == 1 and "anti_affinity=1" in p.explain()
    # Another deployment, or the replica itself, does not count.
    other = replica(0, name="llama")
    assert replica_nodes(other.task_id(), other, [], [(first.task_id(), first, "n1")]) == set()
    assert replica_nodes(first.task_id(), first, [], [(first.task_id(), first, "n1")]) == set()
    # With every node holding a sibling, the replica waits, explained.
    p = place(second, nodes, config=LeaseConfig(), rng=random.Random(0),
              spread={"n0", "n1", "n2"})  # fmt: skip
    assert p.chosen is None and p.removed["anti_affinity"] == 3
