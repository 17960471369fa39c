"""The agents' messages: each one round-trips, junk is one `DecodeError`, and nothing
decodes that its sender did not sign."""

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

from .agent_harness import sign_as, verify

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
    Finish(TID, 3, Ended.FAILED, 3),
    Finish(TID, 3, Ended.CANCELLED, 0, OperatorProof(b"c" * 140, 1_700_000_000, b"s" * 64)),
    FinishAnswer(TID, 3, Ended.CANCELLED, Refusal.FINISHED, Ended.SUCCEEDED),
    SpecWanted(TID),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_signed(msg: AgentMessage) -> None:
    data = encode(msg, "n1", sign_as("n1"))
    assert decode(data, verify) == ("n1", msg)


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_a_message_signed_by_someone_else_or_altered_is_refused(msg: AgentMessage) -> None:
    forged = encode(msg, "n1", sign_as("evil"))
    with pytest.raises(DecodeError, match="signature"):
        decode(forged, verify)
    raw = msgpack.unpackb(encode(msg, "n1", sign_as("n1")))
    raw[2] = "n2"  # claims another sender
    with pytest.raises(DecodeError):
        decode(msgpack.packb(raw), verify)


def test_bounds_are_checked_after_the_signature() -> None:
    evil = sign_as("n1")
    with pytest.raises(DecodeError, match="too large"):
        decode(b"\x00" * (MESSAGE_BYTES_MAX + 1), verify)
    from populi_p2p.leases.agent_wire import _signed_bytes

    for body in ([b"short", 1, "n1"], [bytes(16), 2**62, "n1"], [bytes(16), -1, "n1"]):
        raw = [1, 3, "n1", body, b""]
        raw[4] = evil(_signed_bytes(3, "n1", body))
        with pytest.raises(DecodeError):
            decode(msgpack.packb(raw), verify)
    # A digest renewal: a count within the renewal bound, 16 bytes of digest; a
    # renewal answer's `missed` flag is 1 or absent.
    for kind, body in ((11, [1, 0, bytes(16)]), (11, [1, 4096, bytes(16)]),
                       (11, [1, 2, bytes(15)]), (11, [1, 2, "x" * 16]), (7, [1, [], 0]),
                       (7, [1, [], True])):  # fmt: skip
        raw = [1, kind, "n1", body, evil(_signed_bytes(kind, "n1", body))]
        with pytest.raises(DecodeError):
            decode(msgpack.packb(raw), verify)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_junk_is_one_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(data, verify)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(MESSAGES) - 1), st.data())
def test_a_flipped_byte_never_decodes_to_something_else(i: int, data: st.DataObject) -> None:
    raw = bytearray(encode(MESSAGES[i], "n1", sign_as("n1")))
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] ^= data.draw(st.integers(1, 255))
    try:
        sender, msg = decode(bytes(raw), verify)
    except DecodeError:
        return
    assert (sender, msg) == ("n1", MESSAGES[i])  # only a flip msgpack ignores


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
    data = encode(msg, "n1", sign_as("n1"))
    assert len(data) <= MESSAGE_BYTES_MAX
    assert decode(data, verify) == ("n1", msg)


def _signed_finish(body: list[object]) -> bytes:
    from populi_p2p.leases.agent_wire import _signed_bytes

    return msgpack.packb([1, 8, "n1", body, sign_as("n1")(_signed_bytes(8, "n1", body))])


HOSTILE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=300)
    | st.text(max_size=20) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=8,
)  # fmt: skip


@settings(derandomize=True, max_examples=300, deadline=None)
@given(HOSTILE)
def test_a_hostile_operator_proof_is_one_decode_error_or_a_bounded_proof(raw: object) -> None:
    """Whatever a signed member puts in the proof's place: a `DecodeError`, or a proof
    within the bounds (certificate at most 256 bytes, a 64-byte signature)."""
    data = _signed_finish([bytes(16), 1, int(Ended.CANCELLED), 0, raw])
    try:
        _, msg = decode(data, verify)
    except DecodeError:
        return
    assert isinstance(msg, Finish) and msg.operator is not None
    proof = msg.operator
    assert 0 < len(proof.certificate) <= OPERATOR_CERTIFICATE_BYTES_MAX
    assert len(proof.signature) == 64 and 0 <= proof.signed_at <= 1 << 40


def test_an_operator_proof_rides_only_on_a_cancel_and_is_bounded() -> None:
    proof = [b"c" * 140, 1, b"s" * 64]
    with pytest.raises(DecodeError, match="for a cancel"):
        decode(_signed_finish([bytes(16), 1, int(Ended.SUCCEEDED), 0, proof]), verify)
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
            decode(_signed_finish([bytes(16), 1, int(Ended.CANCELLED), 0, bad]), verify)


@pytest.mark.parametrize("ended", [Ended.NO, Ended.CANCELLING])
def test_an_end_that_only_a_granter_records_is_not_a_message(ended: Ended) -> None:
    """`CANCELLING` is a granter's state while a cancel waits on a lease: an owner that
    posted it could end its own task as cancelled with no canceller's say."""
    data = encode(Finish(TID, 3, ended, 0), "n1", sign_as("n1"))
    with pytest.raises(DecodeError, match="not an end anyone posts"):
        decode(data, verify)
    assert decode(encode(FinishAnswer(TID, 3, Ended.CANCELLED, 0, ended), "n1", sign_as("n1")),
                  verify)[1].final is ended  # fmt: skip
