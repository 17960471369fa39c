"""`populi_p2p.trust.record_book.RecordBook`: what gets into a node's view, what is
dropped and why, and what a member is refused for (the record format itself is in
test_record.py)."""

from __future__ import annotations

from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.record import Capabilities, NodeRecord, NodeStatus
from populi_p2p.trust.record_book import RECORD_DROP_REASONS, RecordBook
from populi_p2p.trust.revocation import RevocationList

from .conftest import NOW

AUTHORITY = ClusterAuthority.from_seed(b"A" * 32)
NODES = [NodeIdentity.from_seed(bytes([i]) * 32) for i in range(1, 5)]


def signed(
    node: NodeIdentity, sequence: int = 1, *, cert: bytes | None = None, name: str = "box"
) -> bytes:
    if cert is None:
        cert = AUTHORITY.enroll(node.public_key, now=NOW, expires_in=3600, serial=sequence).raw
    record = NodeRecord(
        node_id=node.node_id,
        public_key=node.public_key,
        name=name,
        address="10.0.0.1",
        port=7946,
        software_version="0.1.0",
        protocol_version=1,
        started_at=NOW,
        sequence=sequence,
        status=NodeStatus.AVAILABLE,
        capabilities=Capabilities(cpu_cores=4, ram_bytes=1 << 30, gpu=None),
        labels={},
        certificate=cert,
    )
    return record.sign(node).raw


def drops(book: RecordBook) -> dict[str, int]:
    counts = book.drops.as_dict()
    assert set(counts) == set(RECORD_DROP_REASONS)  # every reason listed, even at 0
    return {reason: n for reason, n in counts.items() if n}


def test_records_are_kept_by_node_id_and_listed_in_order() -> None:
    book = RecordBook(AUTHORITY.public_key)
    for node in reversed(NODES):
        assert book.accept(signed(node), NOW) is not None
    assert len(book) == 4 and NODES[0].node_id in book and "nobody" not in book
    assert [r.node_id for r in book.records()] == sorted(n.node_id for n in NODES)
    assert book.accepted == 4


def test_a_newer_record_replaces_and_an_older_one_is_stale_but_not_a_refusal() -> None:
    node = NODES[0]
    book = RecordBook(AUTHORITY.public_key)
    old, new = signed(node, 1), signed(node, 2, name="renamed")
    book.accept(old, NOW, node_id=node.node_id)
    assert book.accept(new, NOW, node_id=node.node_id).name == "renamed"  # type: ignore[union-attr]
    assert book.accept(old, NOW, node_id=node.node_id) is None
    assert drops(book) == {"stale_sequence": 1}
    assert book.refusal(node.node_id) is None  # a replay: the newer record still stands
    assert book.signed(node.node_id) == new


def test_a_record_carried_under_another_name_is_a_key_mismatch() -> None:
    book = RecordBook(AUTHORITY.public_key)
    assert book.accept(signed(NODES[0]), NOW, node_id=NODES[1].node_id) is None
    assert drops(book) == {"key_mismatch": 1}
    assert book.refusal(NODES[1].node_id) == "key_mismatch"
    assert NODES[0].node_id not in book


def test_a_refusal_is_cleared_by_the_next_good_record() -> None:
    node = NODES[0]
    book = RecordBook(AUTHORITY.public_key)
    foreign = ClusterAuthority.from_seed(b"B" * 32).enroll(node.public_key, now=NOW).raw
    assert book.accept(signed(node, cert=foreign), NOW, node_id=node.node_id) is None
    assert book.refusal(node.node_id) == "wrong_authority"
    assert book.accept(signed(node), NOW, node_id=node.node_id) is not None
    assert book.refusal(node.node_id) is None


def test_a_new_record_with_the_same_certificate_is_not_checked_again() -> None:
    node = NODES[0]
    cert = AUTHORITY.enroll(node.public_key, now=NOW, expires_in=3600).raw
    book = RecordBook(AUTHORITY.public_key)
    book.accept(signed(node, 1, cert=cert), NOW)
    held = book._certs[node.node_id]
    book.accept(signed(node, 2, cert=cert), NOW)
    assert book._certs[node.node_id] is held  # the cached, verified certificate


def test_the_book_is_bounded_and_says_full() -> None:
    book = RecordBook(AUTHORITY.public_key, max_records=2)
    for node in NODES[:3]:
        book.accept(signed(node), NOW)
    assert len(book) == 2 and drops(book) == {"full": 1}
    book.accept(signed(NODES[0], 2), NOW)  # a held node's newer record still gets in
    assert book.get(NODES[0].node_id).sequence == 2  # type: ignore[union-attr]


def test_revocations_and_expiry_drop_records_and_say_why() -> None:
    book = RecordBook(AUTHORITY.public_key)
    for node in NODES[:3]:
        book.accept(signed(node), NOW)
    revoked = RevocationList.of([AUTHORITY.revoke(now=NOW, node_public_key=NODES[1].public_key)])
    assert book.update_revocations(revoked, NOW) == [NODES[1].node_id]
    assert book.revocations is revoked
    assert book.refusal(NODES[1].node_id) == "revoked"
    assert book.accept(signed(NODES[1], 2), NOW) is None
    assert drops(book) == {"revoked": 1}
    assert sorted(book.revalidate(NOW + 7200)) == sorted(n.node_id for n in (NODES[0], NODES[2]))
    assert len(book) == 0
    assert book.refusal(NODES[0].node_id) == "expired"


def test_forget_drops_the_record_and_its_refusal() -> None:
    book = RecordBook(AUTHORITY.public_key)
    book.accept(signed(NODES[0]), NOW, node_id=NODES[0].node_id)
    book.accept(b"garbage", NOW, node_id=NODES[1].node_id)
    assert book.refusal(NODES[1].node_id) == "malformed"
    for node in NODES[:2]:
        book.forget(node.node_id)
        assert book.get(node.node_id) is None and book.refusal(node.node_id) is None
    assert book.signed(NODES[0].node_id) is None


def test_a_record_over_the_size_limit_is_too_large() -> None:
    book = RecordBook(AUTHORITY.public_key, max_record_bytes=100)
    assert book.accept(signed(NODES[0]), NOW) is None
    assert drops(book) == {"too_large": 1}
