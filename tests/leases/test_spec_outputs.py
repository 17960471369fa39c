"""Declared outputs in the signed spec (its fourteenth element), directory inputs (an
input's fourth element), and the outputs a result names (its seventh element, signed)."""

from __future__ import annotations

import pytest

from populi_p2p.leases import BlobInput, Requirements, TaskKind, TaskOutput, TaskResult, TaskSpec
from populi_p2p.leases.wire import DecodeError, _result

SHA = "cd" * 32


def spec(**kw) -> TaskSpec:
    return TaskSpec(TaskKind.BATCH, Requirements(), ["x"], submitted_by="n0", **kw)


def test_outputs_round_trip_sorted_and_change_the_id() -> None:
    s = spec(outputs=["b/c.txt", "a"], inputs=[BlobInput("tree", SHA, 10, unpack=True)])
    wire = s.to_wire()
    assert len(wire) == 14 and wire[13] == ["a", "b/c.txt"]
    assert wire[11] == [["tree", SHA, 10, True]]
    assert TaskSpec.from_wire(wire) == s
    assert s.task_id() != spec(inputs=[BlobInput("tree", SHA, 10, unpack=True)]).task_id()
    assert len(spec().to_wire()) == 9  # no outputs: the old bytes
    assert len(spec(inputs=[BlobInput("f", SHA, 1)]).to_wire()) == 13  # a file: 3 elements


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../b", "a//b", ".", "a/", "x" * 200])
def test_bad_output_paths_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match="relative to the work dir"):
        spec(outputs=[path])


@pytest.mark.parametrize(
    "mutate",
    [
        lambda w: w.__setitem__(13, []),  # encoded only when set
        lambda w: w.__setitem__(13, ["b", "a"]),  # sorted
        lambda w: w.__setitem__(13, ["a", "a"]),  # once each
        lambda w: w.__setitem__(13, ["../a"]),
        lambda w: w.__setitem__(11, [["f", SHA, 1, False]]),  # unpack only when true
    ],
)
def test_hostile_output_encodings_are_refused(mutate) -> None:
    wire = spec(outputs=["a"], inputs=[BlobInput("f", SHA, 1)]).to_wire()
    mutate(wire)
    with pytest.raises((ValueError, TypeError)):
        TaskSpec.from_wire(wire)


def test_a_result_signs_its_outputs_and_holders() -> None:
    outputs = (TaskOutput("a", SHA, 5), TaskOutput("d", SHA, 7, unpack=True))
    result = TaskResult(0, b"ok", 1.0, outputs=outputs, holders=("n1", "n2", "n3"))
    assert _result(result.to_wire()) == result
    plain = TaskResult(0, b"ok", 1.0)
    assert len(plain.to_wire()) == 5  # results without outputs keep their bytes
    signed = result.signed_bytes("t", 1, "n1")
    for other in (
        TaskResult(0, b"ok", 1.0, outputs=outputs, holders=("n1", "n2", "n4")),
        TaskResult(0, b"ok", 1.0, outputs=outputs[:1], holders=("n1", "n2", "n3")),
    ):
        assert other.signed_bytes("t", 1, "n1") != signed


@pytest.mark.parametrize(
    "seventh",
    [[[], ["n1"]], [[["a", SHA, 1, False]], []], [[["../a", SHA, 1, False]], ["n1"]], "junk"],
)
def test_hostile_result_outputs_are_one_decode_error(seventh) -> None:
    with pytest.raises(DecodeError):
        _result([0, b"", 1.0, False, b"", False, seventh])
    with pytest.raises(DecodeError):
        _result([0, b"", 1.0, False, b"", False])  # final false is not encoded alone
