"""`populi_p2p.trust.authority`: the authority's files, what it signs, and the cluster
secret file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from populi_p2p.trust._keyfiles import KeyFileError
from populi_p2p.trust.authority import (
    AUTHORITY_KEY_FILE,
    AUTHORITY_PUBLIC_FILE,
    ClusterAuthority,
    cluster_fingerprint,
    generate_cluster_secret,
    read_authority_public_key,
    read_cluster_secret,
    write_authority_public_key,
    write_cluster_secret,
)
from populi_p2p.trust.certificate import (
    CERTIFICATE_CONTEXT,
    EnrollmentCertificate,
    authority_key_id,
)
from populi_p2p.trust.identity import NodeIdentity, verify_signature
from populi_p2p.trust.revocation import REVOCATION_CONTEXT, Revocation

from .conftest import NOW


def test_create_then_load_is_the_same_authority(tmp_path: Path) -> None:
    directory = tmp_path / "ca"
    created = ClusterAuthority.create(directory)
    assert ClusterAuthority.load(directory).public_key == created.public_key
    assert read_authority_public_key(directory / AUTHORITY_PUBLIC_FILE) == created.public_key
    assert os.stat(directory / AUTHORITY_KEY_FILE).st_mode & 0o077 == 0
    assert os.stat(directory).st_mode & 0o077 == 0
    with pytest.raises(FileExistsError):
        ClusterAuthority.create(directory)
    assert ClusterAuthority.load(directory).public_key == created.public_key  # untouched


def test_a_secret_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    ClusterAuthority.create(tmp_path / "ca")
    os.chmod(tmp_path / "ca" / AUTHORITY_KEY_FILE, 0o644)
    with pytest.raises(KeyFileError):
        ClusterAuthority.load(tmp_path / "ca")


def test_the_public_key_file_names_the_cluster(tmp_path: Path) -> None:
    authority = ClusterAuthority.from_seed(b"A" * 32)
    path = tmp_path / "authority.pub"
    write_authority_public_key(path, authority.public_key)
    assert authority.fingerprint in path.read_text()
    with pytest.raises(FileExistsError):
        write_authority_public_key(path, authority.public_key)
    write_authority_public_key(path, authority.public_key, overwrite=True)


def test_the_fingerprint_is_16_hex_digits_of_the_key_id() -> None:
    authority = ClusterAuthority.from_seed(b"A" * 32)
    assert re.fullmatch("[0-9a-f]{16}", authority.fingerprint)
    assert authority.fingerprint == cluster_fingerprint(authority.public_key)
    assert authority.key_id == authority_key_id(authority.public_key)
    assert authority.fingerprint != ClusterAuthority.from_seed(b"B" * 32).fingerprint
    assert authority.fingerprint in repr(authority)
    assert "signing" not in repr(authority).lower()  # the secret is never shown


def test_from_seed_is_deterministic_and_checks_the_length() -> None:
    assert ClusterAuthority.from_seed(b"x" * 32).public_key == (
        ClusterAuthority.from_seed(b"x" * 32).public_key
    )
    with pytest.raises(ValueError, match="32 bytes"):
        ClusterAuthority.from_seed(b"short")


def test_an_enrollment_verifies_against_the_authority(authority: ClusterAuthority) -> None:
    node = NodeIdentity.from_seed(b"n" * 32)
    cert = authority.enroll(node.public_key, now=NOW + 0.9, expires_in=60, serial=7)
    assert (cert.issued_at, cert.expires_at, cert.serial) == (int(NOW), int(NOW) + 60, 7)
    assert EnrollmentCertificate.from_bytes(cert.raw, authority.public_key) == cert
    forever = authority.enroll(node.public_key, now=NOW)
    assert forever.expires_at is None
    assert forever.serial != authority.enroll(node.public_key, now=NOW).serial  # random


@pytest.mark.parametrize(
    ("key", "kwargs", "words"),
    [
        (b"k" * 31, {}, "32 bytes"),
        (b"k" * 32, {"scope": "two words"}, "no spaces"),
        (b"k" * 32, {"expires_in": 0}, "expires_in must be positive"),
    ],
)
def test_enroll_refuses_bad_arguments(
    authority: ClusterAuthority, key: bytes, kwargs: dict[str, object], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        authority.enroll(key, now=NOW, **kwargs)  # type: ignore[arg-type]


def test_a_revocation_verifies_against_the_authority(authority: ClusterAuthority) -> None:
    revocation = authority.revoke(now=NOW, serial=7)
    assert Revocation.from_bytes(revocation.raw, authority.public_key) == revocation
    with pytest.raises(ValueError, match="32 bytes"):
        authority.revoke(now=NOW, node_public_key=b"short")


def test_statements_sign_their_own_context_but_never_a_certificates(
    authority: ClusterAuthority,
) -> None:
    signed = authority.sign_statement(b"populi/test/v1", b"body")
    assert signed.startswith(b"body")
    assert verify_signature(authority.public_key, b"populi/test/v1", b"body", signed[4:])
    assert not verify_signature(authority.public_key, b"populi/other/v1", b"body", signed[4:])
    for context in (CERTIFICATE_CONTEXT, REVOCATION_CONTEXT):
        with pytest.raises(ValueError, match="their own methods"):
            authority.sign_statement(context, b"body")


def test_a_cluster_secret_round_trips_private(tmp_path: Path) -> None:
    secret = generate_cluster_secret()
    assert len(secret) == 32 and secret != generate_cluster_secret()
    path = tmp_path / "cluster.secret"
    write_cluster_secret(path, secret)
    assert path.read_text() == secret.hex() + "\n"
    assert os.stat(path).st_mode & 0o077 == 0
    assert read_cluster_secret(path) == secret
    with pytest.raises(FileExistsError):
        write_cluster_secret(path, secret)
    with pytest.raises(ValueError, match="32 bytes"):
        write_cluster_secret(tmp_path / "short", b"x")


@pytest.mark.parametrize(
    ("text", "words"),
    [("ab" * 31 + "\n", "64 hex digits"), ("zz" * 32 + "\n", "hex digits only")],
)
def test_a_malformed_cluster_secret_says_how_to_make_one(
    tmp_path: Path, text: str, words: str
) -> None:
    path = tmp_path / "cluster.secret"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match=words):
        read_cluster_secret(path)


def test_an_operator_made_secret_with_spaces_and_newlines_is_read(tmp_path: Path) -> None:
    path = tmp_path / "cluster.secret"
    secret = bytes(range(32))
    path.write_text(secret.hex()[:20] + " \n" + secret.hex()[20:] + "\n")
    path.chmod(0o600)
    assert read_cluster_secret(path) == secret
