"""The codec treats every byte string as hostile: junk is one DecodeError, never a crash."""

from __future__ import annotations

import attrs
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.leases import DecodeError, TaskResult
from populi_p2p.leases.wire import (
    VERSION,
    MessageType,
    _result,
    decode_entries,
    decode_message,
)

from .helpers import anti_entropy, spec, table

FUZZ = settings(derandomize=True, max_examples=300, deadline=None)


def _valid_messages() -> list[bytes]:
    a, b = table("a"), table("b")
    tid, submit = a.submit(spec(1, by="a"), 0.0)
    b.apply(submit, 0.0)
    claim = b.claim(tid, 1, 3, "why", 1.0)
    result = b.post_result(tid, TaskResult(0, b"ok"), 2.0)
    a.submit(spec(2, by="a"), 0.0)
    summary = b.state_for(a.digest())
    assert summary is not None
    push = a.merge_state(summary, 3.0).reply
    assert push is not None
    return [submit, claim, result, a.digest(), summary, push]


VALID = _valid_messages()


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_mutated_messages_never_crash(msg: bytes, data: st.DataObject) -> None:
    flips = data.draw(
        st.lists(
            st.tuples(st.integers(0, len(msg) - 1), st.integers(0, 255)), min_size=1, max_size=4
        )
    )
    raw = bytearray(msg)
    for i, v in flips:
        raw[i] = v
    cut = data.draw(st.integers(1, len(raw)))
    mutated = bytes(raw[:cut])
    t = table("c")
    t.apply(VALID[0], 0.0)
    t.apply(mutated, 1.0)  # must not raise
    t.state_for(mutated)
    t.merge_state(mutated, 1.0)
    t.check_invariants()


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_are_decode_errors(data: bytes) -> None:
    t = table("c")
    assert t.apply(data, 0.0) == []  # random bytes are never a valid signed delta
    t.state_for(data)
    t.merge_state(data, 0.0)
    try:
        kind, body = decode_message(data)
    except DecodeError:
        return
    if kind is MessageType.ENTRIES:
        try:
            decode_entries(body)
        except DecodeError:
            pass


@pytest.mark.parametrize(
    "body",
    [
        [VERSION + 1, 1, []],  # future version
        [VERSION, 99, []],  # unknown type
        [VERSION, 1, [["nothex", None, b"", [], None]]],
        [VERSION, 1, [["0" * 32, None, b"", [[1, 0, "a", b"s", "", 5, 0, None, b""]], None]]],
        [
            VERSION,
            1,
            [
                [
                    "0" * 32,
                    None,
                    b"",
                    [[2, 0, "a", b"", "", 1, 0, None, b""], [1, 0, "a", b"", "", 1, 0, None, b""]],
                    None,
                ]
            ],
        ],
        [VERSION, 1, [["0" * 32, [1, "batch"], b"", [], None]]],  # bad spec
    ],
    ids=["version", "type", "task-id", "phase-without-result", "epoch-order", "spec"],
)
def test_specific_junk_is_rejected(body: list) -> None:
    data = msgpack.packb(body)
    with pytest.raises(DecodeError):
        _, b = decode_message(data)
        decode_entries(b)
    t = table("c")
    assert t.apply(data, 0.0) == []
    assert t.statistics().decode_errors == 1


def test_a_final_result_round_trips_and_other_results_keep_their_bytes() -> None:
    a, b = table("a"), table("b")
    tid, submit = a.submit(spec(1, by="a", retry_limit=2), 0.0)
    b.apply(submit, 0.0)
    a.apply(b.claim(tid, 1, 3, "why", 1.0), 1.0)
    a.apply(b.post_result(tid, TaskResult(127, b"x", final=True), 2.0), 2.0)
    entry = a.get(tid)
    assert entry is not None and entry.accepted_result is not None
    assert entry.accepted_result.final, "carried, and its signature checked, over the wire"
    # One failed attempt of three allowed, yet finished: no retry can mend it.
    assert entry.failures() == 1 and entry.finished() and entry.failures_to_report() == 3
    plain = TaskResult(127, b"x")
    assert len(plain.to_wire()) == 5, "results without the flag encode as before"
    assert plain.signed_bytes(tid, 1, "b") != attrs.evolve(plain, final=True).signed_bytes(
        tid, 1, "b"
    ), "the flag is signed"


@pytest.mark.parametrize("flag", [False, 1, None, [True]])
def test_a_final_flag_other_than_true_is_refused(flag: object) -> None:
    good = [127, b"x", 0.0, False, b"sig"]
    assert _result([*good, True]).final and not _result(good).final
    for forged in ([*good, flag], [*good, True, True]):
        with pytest.raises(DecodeError):
            _result(forged)  # one result, one encoding


def test_a_spec_that_does_not_hash_to_its_id_is_rejected() -> None:
    s1, s2 = spec(1), spec(2)
    body = [VERSION, 1, [[s1.task_id(), s2.to_wire(), b"sig", [], None]]]
    with pytest.raises(DecodeError, match="hash"):
        decode_entries(decode_message(msgpack.packb(body))[1])


def test_digest_round_trip_is_quiet() -> None:
    a, b = table("a"), table("b")
    assert b.state_for(a.digest()) is None
    assert anti_entropy(a, b) == len(a.digest())


@FUZZ
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=300)
        | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4),
        max_leaves=8,
    )
)  # fmt: skip
def test_a_hostile_cancel_record_is_one_decode_error_or_a_bounded_one(proof: object) -> None:
    """A cancel record ``[by, signature, proof]`` with anything in the proof's place:
    a `DecodeError`, or a proof within its bounds; never a crash."""
    from populi_p2p.leases.wire import entry_from_wire

    raw = ["0" * 32, None, b"", [], ["n1", b"sig", proof]]
    try:
        entry = entry_from_wire(raw)
    except DecodeError:
        return
    assert entry.cancel is not None and entry.cancel.operator is not None
    assert 0 < len(entry.cancel.operator.certificate) <= 256
    assert len(entry.cancel.operator.signature) == 64


def test_a_cancel_record_has_two_or_three_parts() -> None:
    from populi_p2p.leases.wire import entry_from_wire

    proof = [b"c" * 140, 5, b"s" * 64]
    assert entry_from_wire(["0" * 32, None, b"", [], ["n1", b"sig"]]).cancel is not None
    assert entry_from_wire(["0" * 32, None, b"", [], ["n1", b"sig", proof]]).cancel is not None
    for bad in (["n1"], ["n1", b"sig", proof, proof], ["n1", b"sig", [b"c", 5]]):
        with pytest.raises(DecodeError, match="cancel"):
            entry_from_wire(["0" * 32, None, b"", [], bad])
