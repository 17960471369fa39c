"""Revocations: signed by the authority only, merged as a grow-only set, gossiped as bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.certificate import CertificateError
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.revocation import (
    Revocation,
    RevocationList,
    read_revocation,
    write_revocation,
)

from .conftest import NOW

AUTHORITY = ClusterAuthority.from_seed(b"A" * 32)

revocations = st.one_of(
    st.builds(
        lambda s, t: AUTHORITY.revoke(now=NOW + t, serial=s), st.integers(0, 30), st.integers(0, 3)
    ),
    st.builds(
        lambda k, t: AUTHORITY.revoke(now=NOW + t, node_public_key=bytes([k]) * 32),
        st.integers(0, 30),
        st.integers(0, 3),
    ),
)
lists = st.builds(RevocationList.of, st.lists(revocations, max_size=6))
LAWS = settings(max_examples=60, deadline=None)


@LAWS
@given(lists, lists)
def test_merge_is_commutative(a: RevocationList, b: RevocationList) -> None:
    assert a.merge(b) == b.merge(a)
    assert a.merge(b).to_bytes() == b.merge(a).to_bytes()


@LAWS
@given(lists, lists, lists)
def test_merge_is_associative(a: RevocationList, b: RevocationList, c: RevocationList) -> None:
    assert a.merge(b).merge(c) == a.merge(b.merge(c))


@LAWS
@given(lists, lists)
def test_merge_is_idempotent_and_only_grows(a: RevocationList, b: RevocationList) -> None:
    assert a.merge(a) == a
    merged = a.merge(b)
    assert merged.merge(b) == merged
    assert a.revocations <= merged.revocations and b.revocations <= merged.revocations


@LAWS
@given(lists)
def test_wire_round_trip_and_digest(a: RevocationList) -> None:
    decoded = RevocationList.from_bytes(a.to_bytes(), AUTHORITY.public_key)
    assert decoded == a
    assert decoded.digest() == a.digest()
    assert list(decoded) == sorted(a.revocations, key=lambda r: r.raw)


def test_digest_tells_lists_apart() -> None:
    one = RevocationList().with_revocation(AUTHORITY.revoke(now=NOW, serial=1))
    two = one.with_revocation(AUTHORITY.revoke(now=NOW, serial=2))
    assert one.digest() != two.digest() and len(two) == 2


def test_serial_and_key_revocations(node: NodeIdentity, other_node: NodeIdentity) -> None:
    cert = AUTHORITY.enroll(node.public_key, now=NOW, serial=5)
    other = AUTHORITY.enroll(other_node.public_key, now=NOW, serial=6)
    by_serial = RevocationList().with_revocation(AUTHORITY.revoke(now=NOW, serial=5))
    assert by_serial.is_revoked(cert) and not by_serial.is_revoked(other)
    by_key = RevocationList().with_revocation(
        AUTHORITY.revoke(now=NOW, node_public_key=other_node.public_key)
    )
    assert by_key.is_revoked(other) and not by_key.is_revoked(cert)
    assert by_key.is_key_revoked(other_node.public_key)


def test_revocation_needs_exactly_one_target(node: NodeIdentity) -> None:
    with pytest.raises(ValueError):
        AUTHORITY.revoke(now=NOW)
    with pytest.raises(ValueError):
        AUTHORITY.revoke(now=NOW, serial=1, node_public_key=node.public_key)


def test_only_the_authority_can_revoke(other_authority: ClusterAuthority) -> None:
    forged = other_authority.revoke(now=NOW, serial=1)
    with pytest.raises(CertificateError) as info:
        Revocation.from_bytes(forged.raw, AUTHORITY.public_key)
    assert info.value.reason == "wrong_authority"
    tampered = forged.raw[:-1] + bytes([forged.raw[-1] ^ 1])
    with pytest.raises(CertificateError) as info:
        Revocation.from_bytes(tampered, other_authority.public_key)
    assert info.value.reason == "bad_signature"
    # One bad entry spoils a gossiped list: it is refused whole.
    good = AUTHORITY.revoke(now=NOW, serial=2)
    mixed = RevocationList.of([good, Revocation.from_bytes(forged.raw, other_authority.public_key)])
    with pytest.raises(CertificateError):
        RevocationList.from_bytes(mixed.to_bytes(), AUTHORITY.public_key)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_certificate_error(data: bytes) -> None:
    with pytest.raises(CertificateError):
        Revocation.from_bytes(data, AUTHORITY.public_key)
    try:
        RevocationList.from_bytes(data, AUTHORITY.public_key)
    except CertificateError:
        pass


def test_revocation_file_round_trip(tmp_path: Path, node: NodeIdentity) -> None:
    revocation = AUTHORITY.revoke(now=NOW, node_public_key=node.public_key)
    write_revocation(tmp_path / "r.revoke", revocation)
    assert read_revocation(tmp_path / "r.revoke", AUTHORITY.public_key) == revocation
    assert "revoke node key" in (tmp_path / "r.revoke").read_text()
