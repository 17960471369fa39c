"""Operator keys: the cluster authority's leave for a person to cancel any task.

A task may be cancelled by the node that accepted it (where its user submitted it). An
operator who must stop a task from elsewhere (the accepting node is gone, or is not
theirs to log in to) holds an operator key: an Ed25519 key of its own, certified by the
authority in the "operator" scope (an `EnrollmentCertificate`, so it expires and is
revoked as any certificate is, and it admits nobody to the mesh: members need scope
"member"). `populi-node cluster operator` makes one file with both halves.

The secret never leaves the operator's machine: `populi-node cancel ID --operator-key
FILE` signs a proof for that one task (`leases._cancel.OperatorProof`) and hands only
the proof to the daemon, which passes it to the task's granters. Each checks it with
`operator_checker`: the authority's signature, the scope, the validity period, the
revocation list, and the operator's signature over the task id and signing time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import attrs
import nacl.signing

from ..leases._cancel import (
    OPERATOR_CANCEL_CONTEXT,
    OPERATOR_CERTIFICATE_BYTES_MAX,
    OperatorCheck,
    OperatorProof,
    operator_cancel_bytes,
)
from ._codec import CodecError, pack_canonical, unpack_strict
from ._keyfiles import KEY_BYTES, KeyFileError, read_armored, write_armored
from .authority import ClusterAuthority
from .certificate import (
    DEFAULT_CLOCK_SKEW,
    CertificateError,
    EnrollmentCertificate,
)
from .identity import node_id_from_public_key, verify_signature
from .revocation import RevocationList

__all__ = ["OPERATOR_SCOPE", "OperatorKey", "operator_checker", "proof_from_json", "proof_to_json"]

#: The certificate scope of an operator key (members are "member").
OPERATOR_SCOPE: Final = "operator"
#: Armor label of an operator key file.
OPERATOR_KEY_LABEL: Final = "POPULI OPERATOR KEY"


@attrs.frozen(repr=False)
class OperatorKey:
    """An operator's signing key and the authority's certificate of it (raw bytes: the
    granters verify it; the machine that signs may hold no authority key)."""

    _signing_key: nacl.signing.SigningKey
    certificate: bytes

    def __repr__(self) -> str:
        return f"OperatorKey(id={self.key_id!r})"

    @property
    def key_id(self) -> str:
        """The operator key's id (the node id form of its public key)."""
        return node_id_from_public_key(bytes(self._signing_key.verify_key))

    @classmethod
    def create(
        cls, authority: ClusterAuthority, *, now: float, expires_in: float | None = None
    ) -> tuple[OperatorKey, EnrollmentCertificate]:
        """A fresh key, and `authority`'s certificate of it in the operator scope.

        Raises:
            ValueError: a non-positive `expires_in`.
        """
        signing_key = nacl.signing.SigningKey.generate()
        public = bytes(signing_key.verify_key)
        cert = authority.enroll(public, OPERATOR_SCOPE, expires_in, now=now)
        return cls(signing_key, cert.raw), cert

    def prove_cancel(self, task_id: str, now: float) -> OperatorProof:
        """The proof that lets any node ask the granters to cancel `task_id`."""
        at = int(now)
        message = OPERATOR_CANCEL_CONTEXT + operator_cancel_bytes(task_id, at)
        signature = bytes(self._signing_key.sign(message).signature)
        return OperatorProof(self.certificate, at, signature)

    def write(self, path: Path, note: str = "") -> None:
        """Write the key and its certificate as one file, mode 0600.

        Raises:
            FileExistsError: `path` exists already.
        """
        body = pack_canonical([bytes(self._signing_key), self.certificate])
        write_armored(
            path, OPERATOR_KEY_LABEL, body, secret=True,
            comments=[
                f"populi operator key {self.key_id}{note}",
                "it may cancel any task of the cluster: keep it off the mesh",
            ],
        )  # fmt: skip

    @classmethod
    def read(cls, path: Path) -> OperatorKey:
        """Read an operator key file.

        Raises:
            KeyFileError: missing, readable by others, or not an operator key file.
        """
        data = read_armored(path, OPERATOR_KEY_LABEL, secret=True)
        try:
            fields = unpack_strict(data)
        except CodecError as exc:
            raise KeyFileError(f"{path}: not an operator key file ({exc})") from None
        if not (
            isinstance(fields, list)
            and len(fields) == 2
            and isinstance(fields[0], bytes)
            and len(fields[0]) == KEY_BYTES
            and isinstance(fields[1], bytes)
            and 0 < len(fields[1]) <= OPERATOR_CERTIFICATE_BYTES_MAX
        ):
            raise KeyFileError(
                f"{path}: not an operator key file (make one with populi-node cluster operator)"
            )
        return cls(nacl.signing.SigningKey(fields[0]), fields[1])


def operator_checker(
    authority_key: bytes,
    revocations: Callable[[], RevocationList | None],
    clock: Callable[[], float] = time.time,
    *,
    clock_skew: float = DEFAULT_CLOCK_SKEW,
) -> OperatorCheck:
    """The check of operator proofs a node passes to its lease agent and table (see
    `leases._cancel.OperatorCheck`). A fresh cancel needs a certificate valid now and a
    proof signed within `clock_skew` of now; a recorded one, a certificate valid when
    the operator signed. Either way it must not be revoked."""

    def check(task_id: str, proof: OperatorProof, fresh: bool) -> str | None:
        now = clock()
        try:
            cert = EnrollmentCertificate.from_bytes(proof.certificate, authority_key)
            at = now if fresh else float(proof.signed_at)
            cert.check(None, at, OPERATOR_SCOPE, revocations(), clock_skew=clock_skew)
        except CertificateError as exc:
            return f"operator certificate refused: {exc}"
        if proof.signed_at > now + clock_skew or (fresh and proof.signed_at < now - clock_skew):
            return (
                f"operator proof signed at {proof.signed_at}, {proof.signed_at - now:+.0f} s"
                " from this node's clock (sign it again; check both clocks)"
            )
        message = operator_cancel_bytes(task_id, proof.signed_at)
        if not verify_signature(
            cert.node_public_key, OPERATOR_CANCEL_CONTEXT, message, proof.signature
        ):
            return "the operator signature does not verify for this task"
        return None

    return check


def proof_to_json(proof: OperatorProof) -> dict[str, object]:
    """The proof as the control API carries it (hex bytes)."""
    return {
        "certificate": proof.certificate.hex(),
        "signed_at": proof.signed_at,
        "signature": proof.signature.hex(),
    }


def proof_from_json(value: object) -> OperatorProof:
    """The proof from the control API's JSON.

    Raises:
        ValueError: one line saying what is wrong.
    """
    if not isinstance(value, dict):
        raise ValueError("operator: expected an object with certificate, signed_at, signature")
    try:
        raw = [
            bytes.fromhex(value["certificate"]),
            value["signed_at"],
            bytes.fromhex(value["signature"]),
        ]
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            "operator: certificate and signature are hex strings, signed_at an integer"
        ) from None
    return OperatorProof.from_wire(raw)
