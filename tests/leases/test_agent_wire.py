"""The agents' messages: each one round-trips, junk is one `DecodeError`, and nothing
decodes that its sender did not sign."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.leases import DecodeError, Requirements, TaskKind, TaskSpec
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
