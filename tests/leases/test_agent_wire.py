"""The agents' messages: each one round-trips, and junk, a version-1 (signed) or
version-2 (sender inside) message and anything out of the wire's bounds are one
`DecodeError`. (The packet envelope signs them and names their sender.)"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.leases import DecodeError, Requirements, TaskKind, TaskSpec
from populi_p2p.leases._cancel import OPERATOR_CERTIFICATE_BYTES_MAX, OperatorProof
from populi_p2p.leases.agent_wire import (
    MESSAGE_BYTES_MAX,
    AgentMessage,
    Finish,
    FinishAnswer,
    GrantAnswer,
    GrantRequest,
    Offer,
    OfferAck,
    Own,
    Renew,
    RenewAnswer,
    RenewDigest,
    SpecWanted,
    decode,
    encode,
)
from populi_p2p.leases.grants import Ended, Refusal

from .agent_harness import sign_as

SPEC = TaskSpec(TaskKind.BATCH, Requirements(gpu_count=1, vram_per_gpu=1 << 30), ("x", "y"),
                env={"A": "b"}, submitted_by="n0", replicas=("n0", "n1", "n2"))  # fmt: skip
TID = SPEC.task_id()
SIG = sign_as("n0")(b"spec")

MESSAGES: list[AgentMessage] = [
    Offer(SPEC, SIG),
    OfferAck(TID),
    GrantRequest(TID, 3, "n1"),
    GrantAnswer(TID, 3, "n1", 0, 3, 0.0, 1),
    GrantAnswer(TID, 3, "n1", Refusal.LEASE_LIVE, 2, 4.5, 0),
    Own(TID, 3, SPEC, SIG, 2),
    Renew(7, ((TID, 3), ("0" * 32, 1))),
    RenewAnswer(7, ((TID, Refusal.SUPERSEDED),)),
    RenewAnswer(8, (), missed=True),
    RenewDigest(9, 2, bytes(range(16))),
    RenewDigest(10, 3, bytes(range(16)), quiet=True),
    Finish(TID, 3, Ended.FAILED, 3),
    Finish(TID, 3, Ended.CANCELLED, 0, OperatorProof(b"c" * 140, 1_700_000_000, b"s" * 64)),
    FinishAnswer(TID, 3, Ended.CANCELLED, Refusal.FINISHED, Ended.SUCCEEDED),
    SpecWanted(TID),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg: AgentMessage) -> None:
    assert decode(encode(msg)) == msg


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_an_older_version_or_an_extra_element_is_refused(msg: AgentMessage) -> None:
    """Version 1 carried its own signature as a fifth element, version 2 its sender as
    the third: neither is read any more."""
    raw = msgpack.unpackb(encode(msg))
    v1 = [1, raw[1], "n1", raw[2], b"s" * 64]
    v2 = [2, raw[1], "n1", raw[2]]
    for bad in (v1, v2, [3, raw[1], "n1", raw[2]], [*raw, b"s" * 64], raw[:2]):
        with pytest.raises(DecodeError, match="bad envelope"):
            decode(msgpack.packb(bad))


def test_bounds_are_checked() -> None:
    with pytest.raises(DecodeError, match="too large"):
        decode(b"\x00" * (MESSAGE_BYTES_MAX + 1))
    for owner in ("", "n" * 129, 7, None):
        with pytest.raises(DecodeError, match="bad node id"):
            decode(msgpack.packb([3, 3, [bytes(16), 1, owner]]))
    for body in ([b"short", 1, "n1"], [bytes(16), 2**62, "n1"], [bytes(16), -1, "n1"]):
        with pytest.raises(DecodeError):
            decode(msgpack.packb([3, 3, body]))
    # A digest renewal: a count within the renewal bound, 16 bytes of digest, a quiet
    # flag that is 1 or absent; a renewal answer's `missed` flag is 1 or absent.
    for kind, body in ((11, [1, 0, bytes(16)]), (11, [1, 4096, bytes(16)]),
                       (11, [1, 2, bytes(15)]), (11, [1, 2, "x" * 16]),
                       (11, [1, 2, bytes(16), 0]), (11, [1, 2, bytes(16), True]),
                       (11, [1, 2, bytes(16), 1, 1]), (7, [1, [], 0]),
                       (7, [1, [], True])):  # fmt: skip
        with pytest.raises(DecodeError):
            decode(msgpack.packb([3, kind, body]))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_junk_is_one_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(data)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.integers(0, len(MESSAGES) - 1), st.data())
def test_a_flipped_byte_is_a_decode_error_or_a_message_within_bounds(
    i: int, data: st.DataObject
) -> None:
    """No signature guards the bytes here (the envelope's does, in transit): whatever a
    flip makes of them decodes to a message that encodes again, or to one error."""
    raw = bytearray(encode(MESSAGES[i]))
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] ^= data.draw(st.integers(1, 255))
    try:
        msg = decode(bytes(raw))
    except DecodeError:
        return
    assert decode(encode(msg)) == msg


PROOFS = st.builds(
    OperatorProof,
    st.binary(min_size=1, max_size=OPERATOR_CERTIFICATE_BYTES_MAX),
    st.integers(0, 1 << 40),
    st.binary(min_size=64, max_size=64),
)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.binary(min_size=16, max_size=16), st.integers(0, (1 << 62) - 1), PROOFS)
def test_a_cancel_with_any_operator_proof_round_trips(
    tid: bytes, epoch: int, proof: OperatorProof
) -> None:
    msg = Finish(tid.hex(), epoch, Ended.CANCELLED, 0, proof)
    data = encode(msg)
    assert len(data) <= MESSAGE_BYTES_MAX
    assert decode(data) == msg


def _finish(body: list[object]) -> bytes:
    return msgpack.packb([3, 8, body])  # type: ignore[no-any-return]


HOSTILE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=300)
    | st.text(max_size=20) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=8,
)  # fmt: skip


@settings(derandomize=True, max_examples=300, deadline=None)
@given(HOSTILE)
def test_a_hostile_operator_proof_is_one_decode_error_or_a_bounded_proof(raw: object) -> None:
    """Whatever a member puts in the proof's place: a `DecodeError`, or a proof
    within the bounds (certificate at most 256 bytes, a 64-byte signature)."""
    data = _finish([bytes(16), 1, int(Ended.CANCELLED), 0, raw])
    try:
        msg = decode(data)
    except DecodeError:
        return
    assert isinstance(msg, Finish) and msg.operator is not None
    proof = msg.operator
    assert 0 < len(proof.certificate) <= OPERATOR_CERTIFICATE_BYTES_MAX
    assert len(proof.signature) == 64 and 0 <= proof.signed_at <= 1 << 40


def test_an_operator_proof_rides_only_on_a_cancel_and_is_bounded() -> None:
    proof = [b"c" * 140, 1, b"s" * 64]
    with pytest.raises(DecodeError, match="for a cancel"):
        decode(_finish([bytes(16), 1, int(Ended.SUCCEEDED), 0, proof]))
    for bad in (
        [b"c" * (OPERATOR_CERTIFICATE_BYTES_MAX + 1), 1, b"s" * 64],
        [b"", 1, b"s" * 64],
        [b"c", -1, b"s" * 64],
        [b"c", 1 << 41, b"s" * 64],
        [b"c", 1, b"s" * 63],
        [b"c", True, b"s" * 64],
        ["c", 1, b"s" * 64],
        [b"c", 1, b"s" * 64, b"more"],
    ):
        with pytest.raises(DecodeError, match="operator proof"):
            decode(_finish([bytes(16), 1, int(Ended.CANCELLED), 0, bad]))


@pytest.mark.parametrize("ended", [Ended.NO, Ended.CANCELLING])
def test_an_end_that_only_a_granter_records_is_not_a_message(ended: Ended) -> None:
    """`CANCELLING` is a granter's state while a cancel waits on a lease: an owner that
    posted it could end its own task as cancelled with no canceller's say."""
    with pytest.raises(DecodeError, match="not an end anyone posts"):
        decode(encode(Finish(TID, 3, ended, 0)))
    answer = decode(encode(FinishAnswer(TID, 3, Ended.CANCELLED, 0, ended)))
    assert isinstance(answer, FinishAnswer) and answer.final is ended
