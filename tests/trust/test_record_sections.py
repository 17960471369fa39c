"""The record's optional `sections`: signed, round-trips, absent when empty (so a
record without sections is byte-for-byte the old format), malformed ones refused."""

from __future__ import annotations

import pytest

from populi_p2p.trust._codec import pack_canonical, split_signed, unpack_strict
from populi_p2p.trust.record import (
    RECORD_CONTEXT,
    Capabilities,
    NodeRecord,
    NodeStatus,
    RecordError,
    SignedNodeRecord,
)
from tests.inference.conftest import ALICE, CERTS


def _record(**sections: dict[str, object]) -> NodeRecord:
    return NodeRecord(
        node_id=ALICE.node_id, public_key=ALICE.public_key, name="a", address="127.0.0.1",
        port=7950, software_version="t", protocol_version=1, started_at=1.0, sequence=1,
        status=NodeStatus.AVAILABLE, capabilities=Capabilities(1, 1), labels={},
        certificate=CERTS[ALICE.node_id], sections=sections,
    )  # fmt: skip


def test_sections_round_trip_and_are_signed() -> None:
    signed = _record(peer={"port": 7951}, models={"m": {"ctx": 4096}}).sign(ALICE)
    back = SignedNodeRecord.from_bytes(signed.raw)
    assert back.record.sections == {"peer": {"port": 7951}, "models": {"m": {"ctx": 4096}}}
    body, sig = split_signed(signed.raw)
    fields = unpack_strict(body)
    fields[-1]["peer"]["port"] = 1
    with pytest.raises(RecordError) as info:
        SignedNodeRecord.from_bytes(pack_canonical(fields) + sig)
    assert info.value.reason == "bad_signature"


def test_no_sections_is_the_old_sixteen_fields() -> None:
    body, _ = split_signed(_record().sign(ALICE).raw)
    assert len(unpack_strict(body)) == 16


@pytest.mark.parametrize("bad", [{}, [], 5, {"x": 1}])
def test_malformed_sections_refused(bad: object) -> None:
    body, _ = split_signed(_record().sign(ALICE).raw)
    fields = unpack_strict(body)
    fields.append(bad)
    forged = pack_canonical(fields)
    raw = forged + ALICE.sign(RECORD_CONTEXT, forged)
    with pytest.raises(RecordError) as info:
        SignedNodeRecord.from_bytes(raw)
    assert info.value.reason == "malformed"
