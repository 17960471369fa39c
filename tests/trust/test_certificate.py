"""Cluster authority and enrollment certificates: issue, verify, and every refusal reason."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.trust.authority import (
    AUTHORITY_KEY_FILE,
    AUTHORITY_PUBLIC_FILE,
    ClusterAuthority,
    cluster_fingerprint,
    generate_cluster_secret,
    read_authority_public_key,
    read_cluster_secret,
    write_cluster_secret,
)
from populi_p2p.trust.certificate import (
    CERTIFICATE_REASONS,
    CertificateError,
    EnrollmentCertificate,
    read_certificate,
    verify_certificate,
    write_certificate,
)
from populi_p2p.trust.identity import KeyFileError, NodeIdentity
from populi_p2p.trust.revocation import RevocationList

from .conftest import NOW


def test_enroll_then_verify(authority: ClusterAuthority, node: NodeIdentity) -> None:
    cert = authority.enroll(node.public_key, now=NOW, expires_in=3600, serial=7)
    got = verify_certificate(cert.raw, authority.public_key, node.public_key, NOW + 10)
    assert got == cert
    assert (got.scope, got.issued_at, got.expires_at, got.serial) == (
        "member",
        1_700_000_000,
        1_700_003_600,
        7,
    )
    assert got.node_id == node.node_id
    assert len(cert.raw) <= 140


def test_random_serials_differ(authority: ClusterAuthority, node: NodeIdentity) -> None:
    serials = {authority.enroll(node.public_key, now=NOW).serial for _ in range(20)}
    assert len(serials) == 20


def _refusal(
    reason: str,
    authority: ClusterAuthority,
    other_authority: ClusterAuthority,
    node: NodeIdentity,
    other_node: NodeIdentity,
) -> CertificateError:
    """Produce the certificate error for `reason` by breaking exactly one thing."""
    cert = authority.enroll(node.public_key, "member", 3600, now=NOW, serial=1)
    key, now, scope, revocations = node.public_key, NOW + 1, "member", None
    raw = cert.raw
    if reason == "malformed":
        raw = raw[:20]
    elif reason == "wrong_authority":
        raw = other_authority.enroll(node.public_key, now=NOW).raw
    elif reason == "bad_signature":
        raw = raw[:-1] + bytes([raw[-1] ^ 1])
    elif reason == "expired":
        now = NOW + 3600
    elif reason == "not_yet_valid":
        now = NOW - 301
    elif reason == "key_mismatch":
        key = other_node.public_key
    elif reason == "scope_mismatch":
        scope = "admin"
    elif reason == "revoked":
        revocations = RevocationList().with_revocation(authority.revoke(now=NOW, serial=1))
    with pytest.raises(CertificateError) as info:
        verify_certificate(raw, authority.public_key, key, now, scope, revocations)
    return info.value


@pytest.mark.parametrize("reason", CERTIFICATE_REASONS)
def test_every_refusal_reason(
    reason: str,
    authority: ClusterAuthority,
    other_authority: ClusterAuthority,
    node: NodeIdentity,
    other_node: NodeIdentity,
) -> None:
    error = _refusal(reason, authority, other_authority, node, other_node)
    assert error.reason == reason
    assert str(error).startswith(reason)


def test_forged_body_with_real_key_id_is_bad_signature(
    authority: ClusterAuthority, other_authority: ClusterAuthority, node: NodeIdentity
) -> None:
    # An attacker signs a certificate body naming our authority with their own key.
    body = EnrollmentCertificate.encode_body(
        authority.key_id, node.public_key, "member", 0, None, 1
    )
    forged = body + other_authority._signing_key.sign(b"populi/certificate/v1" + body).signature
    with pytest.raises(CertificateError) as info:
        verify_certificate(forged, authority.public_key, node.public_key, NOW)
    assert info.value.reason == "bad_signature"


def test_any_scope_when_none_required(authority: ClusterAuthority, node: NodeIdentity) -> None:
    cert = authority.enroll(node.public_key, "observer", now=NOW)
    assert (
        verify_certificate(cert.raw, authority.public_key, node.public_key, NOW, None).scope
        == "observer"
    )


def test_revoking_the_key_revokes_every_certificate(
    authority: ClusterAuthority, node: NodeIdentity
) -> None:
    revocations = RevocationList().with_revocation(
        authority.revoke(now=NOW, node_public_key=node.public_key)
    )
    for _ in range(3):
        cert = authority.enroll(node.public_key, now=NOW + 100)
        with pytest.raises(CertificateError, match="revoked"):
            verify_certificate(
                cert.raw, authority.public_key, node.public_key, NOW + 100, revocations=revocations
            )


@pytest.mark.parametrize(
    "kwargs", [{"scope": ""}, {"scope": "has space"}, {"scope": "x" * 65}, {"expires_in": 0}]
)
def test_enroll_rejects_bad_arguments(
    authority: ClusterAuthority, node: NodeIdentity, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(ValueError):
        authority.enroll(node.public_key, now=NOW, **kwargs)


def test_enroll_rejects_bad_key(authority: ClusterAuthority) -> None:
    with pytest.raises(ValueError):
        authority.enroll(b"short", now=NOW)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_certificate_error(
    authority: ClusterAuthority, data: bytes
) -> None:
    with pytest.raises(CertificateError) as info:
        verify_certificate(data, authority.public_key, None, NOW)
    assert info.value.reason in {"malformed", "wrong_authority", "bad_signature"}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**63), 2**64 - 1),
            st.binary(max_size=40),
            st.text(max_size=10),
        ),
        min_size=7,
        max_size=7,
    )
)
def test_wrongly_typed_bodies_are_malformed(authority: ClusterAuthority, fields: list[Any]) -> None:
    fields[1] = authority.key_id
    body = msgpack.packb(fields, use_bin_type=True)
    raw = body + authority._signing_key.sign(b"populi/certificate/v1" + body).signature
    try:
        cert = EnrollmentCertificate.from_bytes(raw, authority.public_key)
    except CertificateError as exc:
        assert exc.reason == "malformed"
    else:  # the fields happened to be well typed: then they decode faithfully
        assert [
            1,
            cert.authority_key_id,
            cert.node_public_key,
            cert.scope,
            cert.issued_at,
            cert.expires_at,
            cert.serial,
        ] == fields


def test_authority_files(tmp_path: Path, node: NodeIdentity) -> None:
    directory = tmp_path / "authority"
    created = ClusterAuthority.create(directory)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(directory / AUTHORITY_KEY_FILE).st_mode) == 0o600
    loaded = ClusterAuthority.load(directory)
    assert loaded.public_key == created.public_key
    assert read_authority_public_key(directory / AUTHORITY_PUBLIC_FILE) == created.public_key
    assert created.fingerprint == cluster_fingerprint(created.public_key)
    assert len(created.fingerprint) == 16 and created.fingerprint in repr(created)
    with pytest.raises(FileExistsError):
        ClusterAuthority.create(directory)
    os.chmod(directory / AUTHORITY_KEY_FILE, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        ClusterAuthority.load(directory)


def test_certificate_file_round_trip(
    tmp_path: Path, authority: ClusterAuthority, node: NodeIdentity
) -> None:
    cert = authority.enroll(node.public_key, now=NOW, expires_in=86400)
    path = tmp_path / "node.cert"
    write_certificate(path, cert)
    text = path.read_text()
    assert node.node_id in text and "BEGIN POPULI ENROLLMENT CERTIFICATE" in text
    assert read_certificate(path) == cert.raw
    # Comments are not trusted: editing them changes nothing, editing the block breaks it.
    path.write_text(text.replace("scope member", "scope admin"))
    assert read_certificate(path) == cert.raw
    with pytest.raises(KeyFileError):
        read_certificate(tmp_path / "missing.cert")
    (tmp_path / "junk.cert").write_text(
        "-----BEGIN POPULI ENROLLMENT CERTIFICATE-----\n!!\n"
        "-----END POPULI ENROLLMENT CERTIFICATE-----\n"
    )
    with pytest.raises(KeyFileError, match="base64"):
        read_certificate(tmp_path / "junk.cert")


def test_cluster_secret_file(tmp_path: Path) -> None:
    secret = generate_cluster_secret()
    write_cluster_secret(tmp_path / "cluster.secret", secret)
    assert read_cluster_secret(tmp_path / "cluster.secret") == secret
    os.chmod(tmp_path / "cluster.secret", 0o640)
    with pytest.raises(KeyFileError):
        read_cluster_secret(tmp_path / "cluster.secret")


def test_cluster_secret_file_is_plain_hex(tmp_path: Path) -> None:
    path = tmp_path / "made-by-openssl"
    path.write_text("ab" * 32 + "\n")
    os.chmod(path, 0o600)
    assert read_cluster_secret(path) == b"\xab" * 32
    path.write_text("xy" * 32)
    with pytest.raises(KeyFileError, match="hex"):
        read_cluster_secret(path)
    path.write_text("ab" * 16)
    with pytest.raises(KeyFileError, match="64 hex digits"):
        read_cluster_secret(path)
