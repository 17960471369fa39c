"""Signed NodeRecords and the RecordBook: only the owner can change its record."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.record import (
    Capabilities,
    NodeRecord,
    NodeStatus,
    RecordError,
    SignedNodeRecord,
    next_sequence,
)
from populi_p2p.trust.record_book import RECORD_DROP_REASONS, RecordBook
from populi_p2p.trust.revocation import RevocationList

from .conftest import NOW


def gpu_report(devices: int) -> dict[str, Any]:
    """A GPU report shaped like the GPU module's record form (short keys, per device)."""
    return {
        "v": 1,
        "A": {
            "p": [{"s": "nvml", "ok": True}],
            "drv": "550.54.15",
            "cuda": "12.4",
            "d": [
                {
                    "s": "nvml",
                    "i": i,
                    "u": f"GPU-{i:08x}-1f2e-4d3c-8b9a-0123456789ab",
                    "n": "NVIDIA H100 80GB HBM3",
                    "m": 81559,
                    "f": 80000 - i,
                    "cc": [9, 0],
                    "t": 41 + i,
                    "w": 350,
                    "h": {"st": "ok"},
                }
                for i in range(devices)
            ],
            "cpu": {"c": 64, "m": 515_000},
        },
        "B": {"s": "derived", "d": [{"a": True, "m": 80000} for _ in range(devices)]},
        "C": {"s": "operator", "l": {}},
    }


def make_record(
    identity: NodeIdentity,
    cert: bytes,
    *,
    sequence: int = 1,
    gpu: dict[str, Any] | None = None,
    name: str = "gpu-box-1",
    **changes: object,
) -> NodeRecord:
    fields: dict[str, Any] = dict(
        node_id=identity.node_id,
        public_key=identity.public_key,
        name=name,
        address="100.101.102.103",
        port=7946,
        software_version="0.1.0",
        protocol_version=1,
        started_at=NOW,
        sequence=sequence,
        status=NodeStatus.AVAILABLE,
        capabilities=Capabilities(cpu_cores=64, ram_bytes=512 << 30, gpu=gpu),
        labels={"rack": "b2", "owner": "lab-7"},
        certificate=cert,
    )
    fields.update(changes)
    return NodeRecord(**fields)


@pytest.fixture(scope="module")
def cert(authority: ClusterAuthority, node: NodeIdentity) -> bytes:
    return authority.enroll(node.public_key, now=NOW, expires_in=365 * 86400).raw


@pytest.fixture
def book(authority: ClusterAuthority) -> RecordBook:
    return RecordBook(authority.public_key)


def test_sign_and_accept_round_trip(node: NodeIdentity, cert: bytes, book: RecordBook) -> None:
    record = make_record(node, cert, gpu=gpu_report(2), status=NodeStatus.DRAINING)
    signed = record.sign(node)
    assert SignedNodeRecord.from_bytes(signed.raw).record == record
    assert book.accept(signed.raw, NOW) == record
    assert book.get(node.node_id) == record and book.signed(node.node_id) == signed.raw
    assert book.accepted == 1 and book.drops.total == 0
    # Gossip repeats itself: the same bytes again are the current record, not a drop.
    assert book.accept(signed.raw, NOW, node_id=node.node_id) == record
    assert book.accepted == 1 and book.drops.total == 0


def test_encoding_is_canonical(node: NodeIdentity, cert: bytes) -> None:
    a = make_record(node, cert, labels={"a": "1", "b": "2"}, gpu={"y": 1, "x": [1, 2]})
    b = make_record(node, cert, labels={"b": "2", "a": "1"}, gpu={"x": (1, 2), "y": 1})
    assert a.encode_body() == b.encode_body()
    assert a.sign(node).raw == b.sign(node).raw  # Ed25519 is deterministic too


def test_higher_sequence_replaces_lower_is_stale(
    node: NodeIdentity, cert: bytes, book: RecordBook
) -> None:
    first = make_record(node, cert, sequence=10).sign(node).raw
    second = make_record(node, cert, sequence=11, status=NodeStatus.BUSY).sign(node).raw
    assert book.accept(first, NOW) is not None
    assert book.accept(second, NOW) is not None
    assert book.get(node.node_id).status is NodeStatus.BUSY  # type: ignore[union-attr]
    assert book.accept(first, NOW) is None  # an old record replayed over a newer one
    equal = make_record(node, cert, sequence=11, status=NodeStatus.DEGRADED).sign(node).raw
    assert book.accept(equal, NOW) is None
    assert book.drops["stale_sequence"] == 2
    assert book.get(node.node_id).status is NodeStatus.BUSY  # type: ignore[union-attr]


def test_record_signed_by_another_key_is_dropped(
    node: NodeIdentity, other_node: NodeIdentity, cert: bytes, book: RecordBook
) -> None:
    genuine = make_record(node, cert, sequence=1).sign(node)
    book.accept(genuine.raw, NOW)
    # The attacker keeps the victim's id, key and certificate and signs with its own key.
    forged_body = make_record(node, cert, sequence=99, name="evil").encode_body()
    forged = forged_body + other_node.sign(b"populi/record/v1", forged_body)
    assert book.accept(forged, NOW) is None
    assert book.drops["bad_signature"] == 1
    assert book.get(node.node_id) == genuine.record


def test_tampered_record_is_dropped(node: NodeIdentity, cert: bytes, book: RecordBook) -> None:
    raw = make_record(node, cert, sequence=5).sign(node).raw
    tampered = raw.replace(b"gpu-box-1", b"gpu-box-9")
    assert tampered != raw
    assert book.accept(tampered, NOW) is None
    assert book.drops["bad_signature"] == 1 and len(book) == 0


def test_node_id_that_is_not_the_key_is_key_mismatch(
    node: NodeIdentity, other_node: NodeIdentity, cert: bytes, book: RecordBook
) -> None:
    body = msgpack.unpackb(make_record(node, cert).encode_body())
    body[1] = other_node.node_id  # claim another node's id with our own key
    packed = msgpack.packb(body, use_bin_type=True)
    assert book.accept(packed + node.sign(b"populi/record/v1", packed), NOW) is None
    # A valid record carried under another member's name is also a key mismatch.
    good = make_record(node, cert).sign(node).raw
    assert book.accept(good, NOW, node_id=other_node.node_id) is None
    assert book.drops["key_mismatch"] == 2 and len(book) == 0


def test_certificate_problems(
    authority: ClusterAuthority,
    other_authority: ClusterAuthority,
    node: NodeIdentity,
    other_node: NodeIdentity,
    book: RecordBook,
) -> None:
    foreign = other_authority.enroll(node.public_key, now=NOW).raw
    someone_elses = authority.enroll(other_node.public_key, now=NOW).raw
    expired = authority.enroll(node.public_key, now=NOW - 100, expires_in=50).raw
    for bad in (foreign, someone_elses, expired, b""):
        assert book.accept(make_record(node, bad).sign(node).raw, NOW) is None
    assert book.drops["bad_certificate"] == 4 and len(book) == 0


def test_revocation_drops_and_refuses(
    authority: ClusterAuthority, node: NodeIdentity, cert: bytes, book: RecordBook
) -> None:
    assert book.accept(make_record(node, cert, sequence=1).sign(node).raw, NOW) is not None
    revoked = RevocationList().with_revocation(
        authority.revoke(now=NOW, node_public_key=node.public_key)
    )
    assert book.update_revocations(revoked, NOW) == [node.node_id]
    assert node.node_id not in book
    assert book.accept(make_record(node, cert, sequence=2).sign(node).raw, NOW) is None
    assert book.drops["revoked"] == 1


def test_revalidate_drops_expired(
    authority: ClusterAuthority, node: NodeIdentity, book: RecordBook
) -> None:
    short = authority.enroll(node.public_key, now=NOW, expires_in=60).raw
    assert book.accept(make_record(node, short).sign(node).raw, NOW) is not None
    assert book.revalidate(NOW + 30) == []
    assert book.revalidate(NOW + 60) == [node.node_id]


def test_book_is_bounded(authority: ClusterAuthority) -> None:
    book = RecordBook(authority.public_key, max_records=2)
    ids = [NodeIdentity.from_seed(bytes([i]) * 32) for i in range(3)]
    for identity in ids:
        c = authority.enroll(identity.public_key, now=NOW).raw
        book.accept(make_record(identity, c).sign(identity).raw, NOW)
    assert len(book) == 2 and book.drops["full"] == 1
    book.forget(ids[0].node_id)
    assert [r.node_id for r in book.records()] == sorted([ids[1].node_id])


def test_too_large(node: NodeIdentity, cert: bytes, authority: ClusterAuthority) -> None:
    big = make_record(node, cert, gpu={"blob": b"x" * 5000})
    with pytest.raises(ValueError, match="limit"):
        big.sign(node)
    raw = big.sign(node, max_bytes=10_000).raw
    book = RecordBook(authority.public_key)
    assert book.accept(raw, NOW) is None and book.drops["too_large"] == 1


def test_only_own_key_signs(node: NodeIdentity, other_node: NodeIdentity, cert: bytes) -> None:
    with pytest.raises(ValueError):
        make_record(node, cert).sign(other_node)


@pytest.mark.parametrize(
    "changes",
    [
        {"port": 70000},
        {"name": "x" * 65},
        {"labels": {"": "v"}},
        {"labels": {f"k{i}": "v" for i in range(33)}},
        {"sequence": -1},
        {"status": "available"},
        {"node_id": "aaaaaaaaaaaaaaaa"},
    ],
)
def test_invalid_records_cannot_be_built(
    node: NodeIdentity, cert: bytes, changes: dict[str, Any]
) -> None:
    with pytest.raises(ValueError):
        make_record(node, cert, **changes)


def test_gpu_report_must_be_plain(node: NodeIdentity, cert: bytes) -> None:
    with pytest.raises(ValueError, match="gpu report"):
        make_record(node, cert, gpu={"when": object()})
    with pytest.raises(ValueError, match="gpu report"):
        make_record(node, cert, gpu={"x": msgpack.ExtType(5, b"")})


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_are_dropped_never_raised(data: bytes) -> None:
    book = RecordBook(ClusterAuthority.from_seed(b"A" * 32).public_key)
    assert book.accept(data, NOW) is None
    assert book.drops.total == 1
    assert set(book.drops.as_dict()) == set(RECORD_DROP_REASONS)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_records_are_dropped_never_raised(
    node: NodeIdentity, cert: bytes, data: st.DataObject
) -> None:
    raw = bytearray(make_record(node, cert).sign(node).raw)
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    book = RecordBook(ClusterAuthority.from_seed(b"A" * 32).public_key)
    assert book.accept(bytes(raw), NOW) is None


def test_decode_errors_have_reasons(node: NodeIdentity, cert: bytes) -> None:
    with pytest.raises(RecordError) as info:
        SignedNodeRecord.from_bytes(b"\x93\x01\x02\x03" + b"\x00" * 64)
    assert info.value.reason == "malformed"


def test_next_sequence_survives_restarts() -> None:
    first = next_sequence(None, NOW)
    assert next_sequence(first, NOW) == first + 1  # two records in the same millisecond
    # A restart one second later starts above everything the last run could have signed
    # (up to 1000 records per second of uptime).
    assert next_sequence(None, NOW + 1) > first + 999


def test_record_sizes(node: NodeIdentity, cert: bytes) -> None:
    """Records must fit the swim core's 4 KiB metadata slot; printed for the report."""
    sizes = {
        n: len(make_record(node, cert, gpu=gpu_report(n) if n else None).sign(node).raw)
        for n in (0, 1, 8)
    }
    print(f"signed record bytes: no GPU {sizes[0]}, 1 GPU {sizes[1]}, 8 GPUs {sizes[8]}")
    assert sizes[0] < 400
    assert sizes[8] < 4096


def test_refusal_says_why_a_node_has_no_trustworthy_record(
    authority: ClusterAuthority,
    other_authority: ClusterAuthority,
    node: NodeIdentity,
    other_node: NodeIdentity,
    cert: bytes,
    book: RecordBook,
) -> None:
    nid = node.node_id
    genuine = make_record(node, cert, sequence=5).sign(node).raw
    assert book.accept(genuine, NOW, node_id=nid) is not None
    assert book.refusal(nid) is None
    # A newer record signed by another key: the member's current record is bad, even
    # though the book still holds the genuine one.
    body = make_record(node, cert, sequence=6, name="evil").encode_body()
    assert book.accept(body + other_node.sign(b"populi/record/v1", body), NOW, node_id=nid) is None
    assert book.refusal(nid) == "bad_signature" and book.get(nid) is not None
    # Its genuine record arriving again clears it.
    assert book.accept(genuine, NOW, node_id=nid) is not None
    assert book.refusal(nid) is None
    # An older record of its own, replayed, is no reason to distrust it.
    assert book.accept(make_record(node, cert, sequence=4).sign(node).raw, NOW, node_id=nid) is None
    assert book.refusal(nid) is None
    # Another cluster's certificate: the certificate's own reason.
    foreign = other_authority.enroll(node.public_key, now=NOW).raw
    assert (
        book.accept(make_record(node, foreign, sequence=7).sign(node).raw, NOW, node_id=nid) is None
    )
    assert book.refusal(nid) == "wrong_authority"
    assert book.accept(make_record(node, cert, sequence=8).sign(node).raw, NOW, node_id=nid)
    assert book.refusal(nid) is None
    # Revoked after it was accepted.
    revoked = RevocationList().with_revocation(
        authority.revoke(now=NOW, node_public_key=node.public_key)
    )
    assert book.update_revocations(revoked, NOW) == [nid]
    assert book.refusal(nid) == "revoked" and book.get(nid) is None
    book.forget(nid)
    assert book.refusal(nid) is None
    # Carried under another member's name, and nothing else known about that member.
    assert book.accept(genuine, NOW, node_id=other_node.node_id) is None
    assert book.refusal(other_node.node_id) == "key_mismatch"


def test_refusals_are_bounded(authority: ClusterAuthority) -> None:
    book = RecordBook(authority.public_key, max_records=2)
    for i in range(5):
        book.accept(b"junk", NOW, node_id=f"{i:016d}")
    assert [book.refusal(f"{i:016d}") for i in range(5)] == [None, None, None] + ["malformed"] * 2
