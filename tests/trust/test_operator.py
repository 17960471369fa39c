"""`populi_p2p.trust.operator`: operator keys, their file, the proof of a cancel, and
the check every granter runs on it (fresh and recorded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from populi_p2p.leases._cancel import OperatorCheck, OperatorProof
from populi_p2p.trust._keyfiles import KeyFileError, write_armored
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.certificate import DEFAULT_CLOCK_SKEW, EnrollmentCertificate
from populi_p2p.trust.identity import node_id_from_public_key
from populi_p2p.trust.operator import (
    OPERATOR_KEY_LABEL,
    OPERATOR_SCOPE,
    OperatorKey,
    operator_checker,
    proof_from_json,
    proof_to_json,
)
from populi_p2p.trust.revocation import RevocationList

from .conftest import NOW

TASK = "ab" * 16


@pytest.fixture(scope="module")
def operator(authority: ClusterAuthority) -> tuple[OperatorKey, EnrollmentCertificate]:
    return OperatorKey.create(authority, now=NOW, expires_in=3600)


def checker(
    authority: ClusterAuthority, now: float, revocations: RevocationList | None = None
) -> OperatorCheck:
    return operator_checker(authority.public_key, lambda: revocations, lambda: now)


def test_the_key_is_certified_in_the_operator_scope(
    operator: tuple[OperatorKey, EnrollmentCertificate],
) -> None:
    key, cert = operator
    assert cert.scope == OPERATOR_SCOPE
    assert key.certificate == cert.raw
    assert key.key_id == node_id_from_public_key(cert.node_public_key)
    assert key.key_id in repr(key)


def test_a_fresh_proof_passes_the_check(
    authority: ClusterAuthority, operator: tuple[OperatorKey, EnrollmentCertificate]
) -> None:
    key, _ = operator
    proof = key.prove_cancel(TASK, NOW + 5.7)
    assert proof.signed_at == int(NOW + 5)
    assert checker(authority, NOW + 6)(TASK, proof, True) is None


def test_a_proof_for_another_task_does_not_verify(
    authority: ClusterAuthority, operator: tuple[OperatorKey, EnrollmentCertificate]
) -> None:
    proof = operator[0].prove_cancel(TASK, NOW)
    assert checker(authority, NOW)("cd" * 16, proof, True) == (
        "the operator signature does not verify for this task"
    )


def test_an_old_proof_is_refused_fresh_but_stands_as_a_record(
    authority: ClusterAuthority, operator: tuple[OperatorKey, EnrollmentCertificate]
) -> None:
    proof = operator[0].prove_cancel(TASK, NOW)
    later = NOW + DEFAULT_CLOCK_SKEW + 60
    refusal = checker(authority, later)(TASK, proof, True)
    assert refusal is not None and "sign it again" in refusal
    assert checker(authority, later)(TASK, proof, False) is None
    # Long after the certificate expired, the record still stands: it held when signed.
    assert checker(authority, NOW + 10 * 3600)(TASK, proof, False) is None
    # ... but a fresh cancel needs a certificate valid now.
    fresh = operator[0].prove_cancel(TASK, NOW + 10 * 3600)
    expired = checker(authority, NOW + 10 * 3600)(TASK, fresh, True)
    assert expired is not None and expired.startswith("operator certificate refused: expired")


def test_a_proof_from_the_future_is_refused_either_way(
    authority: ClusterAuthority, operator: tuple[OperatorKey, EnrollmentCertificate]
) -> None:
    proof = operator[0].prove_cancel(TASK, NOW + DEFAULT_CLOCK_SKEW + 60)
    for fresh in (True, False):
        refusal = checker(authority, NOW)(TASK, proof, fresh)
        assert refusal is not None and "from this node's clock" in refusal


def test_a_revoked_or_foreign_or_member_certificate_is_refused(
    authority: ClusterAuthority,
    other_authority: ClusterAuthority,
    operator: tuple[OperatorKey, EnrollmentCertificate],
) -> None:
    key, cert = operator
    proof = key.prove_cancel(TASK, NOW)
    revoked = RevocationList.of([authority.revoke(now=NOW, serial=cert.serial)])
    for check in (checker(authority, NOW, revoked), checker(other_authority, NOW)):
        for fresh in (True, False):
            refusal = check(TASK, proof, fresh)
            assert refusal is not None and refusal.startswith("operator certificate refused")
    member = authority.enroll(b"m" * 32, now=NOW)  # a member's certificate, not an operator's
    forged = OperatorProof(member.raw, proof.signed_at, proof.signature)
    refusal = checker(authority, NOW)(TASK, forged, True)
    assert refusal is not None and "scope" in refusal


def test_the_key_file_round_trips_and_is_private(
    tmp_path: Path, authority: ClusterAuthority, operator: tuple[OperatorKey, EnrollmentCertificate]
) -> None:
    key = operator[0]
    path = tmp_path / "op.key"
    key.write(path, " (alice)")
    assert os.stat(path).st_mode & 0o077 == 0
    assert "(alice)" in path.read_text()
    again = OperatorKey.read(path)
    assert again.certificate == key.certificate and again.key_id == key.key_id
    assert checker(authority, NOW)(TASK, again.prove_cancel(TASK, NOW), True) is None
    with pytest.raises(FileExistsError):
        key.write(path)


@pytest.mark.parametrize("body", [b"\xc1", b"\x92\x01\x02", b"\x91\xc4\x01x"])
def test_a_file_that_is_not_an_operator_key_says_so(tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "op.key"
    write_armored(path, OPERATOR_KEY_LABEL, body, secret=True)
    with pytest.raises(KeyFileError, match="not an operator key file"):
        OperatorKey.read(path)


def test_proof_json_round_trips(operator: tuple[OperatorKey, EnrollmentCertificate]) -> None:
    proof = operator[0].prove_cancel(TASK, NOW)
    assert proof_from_json(proof_to_json(proof)) == proof


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([], "expected an object"),
        ({"certificate": "zz", "signed_at": 1, "signature": "00"}, "hex strings"),
        ({"signed_at": 1, "signature": "00"}, "hex strings"),
        ({"certificate": "00", "signed_at": 1, "signature": "00"}, "signature is 64 bytes"),
    ],
)
def test_bad_proof_json_gets_one_line(value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        proof_from_json(value)
