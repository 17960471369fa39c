"""Enrollment certificates: the cluster authority's signed statement "this key is a member".

Admission is default-deny: a peer is let in only if it presents a certificate that this
module verifies against the cluster authority's public key, for the peer's own public
key, in the scope asked for, inside its validity period, and not revoked. Each failure
has its own reason so an operator can tell "wrong cluster" from "expired" in `status`.

Wire format (also the content of a ``.cert`` file, armored): ``body || signature``.
`body` is canonical msgpack, a 7-element array::

    [1,                       # format version (ONLY APPEND new versions)
     authority_key_id,        # bin 8: first 8 bytes of the authority fingerprint hash
     node_public_key,         # bin 32: the enrolled node's Ed25519 public key
     scope,                   # str: what the node may do, "member" by default
     issued_at,               # int: Unix seconds, the authority's clock
     expires_at,              # int Unix seconds, or nil for no expiry
     serial]                  # int: random 64-bit, what a revocation by serial names

`signature` is the authority's Ed25519 signature of ``b"populi/certificate/v1" + body``.
A certificate is 134 bytes without expiry, 136 with one (for the usual 6-letter scope).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final, Literal, Protocol

import attrs

from ._codec import CodecError, pack_canonical, split_signed, unpack_strict
from ._keyfiles import KEY_BYTES, encode_public_key, read_armored, write_armored
from .identity import node_id_from_public_key, verify_signature

__all__ = [
    "CERTIFICATE_REASONS",
    "DEFAULT_SCOPE",
    "CertificateError",
    "CertificateReason",
    "EnrollmentCertificate",
    "authority_key_id",
    "read_certificate",
    "verify_certificate",
    "write_certificate",
]


class Revocations(Protocol):
    """What `check` asks of a revocation list (`revocation.RevocationList` is one; it
    imports this module, so the type is named here, not imported)."""

    def is_revoked(self, cert: EnrollmentCertificate) -> bool: ...


#: The scope `enroll` grants and verification requires unless told otherwise.
DEFAULT_SCOPE: Final = "member"
#: How far a certificate's issue time may lie in the verifier's future (clock skew
#: between the authority's machine and the verifier's), in seconds.
DEFAULT_CLOCK_SKEW: Final = 300.0
#: Bytes of the authority key id carried in certificates and revocations.
AUTHORITY_KEY_ID_BYTES: Final = 8
#: Longest scope string accepted.
MAX_SCOPE_LENGTH: Final = 64
#: The only certificate format version this code reads. ONLY APPEND new versions.
CERTIFICATE_VERSION: Final = 1
#: Signature context: see `identity.verify_signature`.
CERTIFICATE_CONTEXT: Final = b"populi/certificate/v1"
#: Armor label of a certificate file.
CERTIFICATE_LABEL: Final = "POPULI ENROLLMENT CERTIFICATE"
_AUTHORITY_PERSON: Final = b"populi-authority"

CertificateReason = Literal[
    "malformed",
    "wrong_authority",
    "bad_signature",
    "expired",
    "not_yet_valid",
    "key_mismatch",
    "scope_mismatch",
    "revoked",
]
#: Every reason a certificate can be refused for, in a fixed order (for counters).
CERTIFICATE_REASONS: Final[tuple[CertificateReason, ...]] = (
    "malformed",
    "wrong_authority",
    "bad_signature",
    "expired",
    "not_yet_valid",
    "key_mismatch",
    "scope_mismatch",
    "revoked",
)


class CertificateError(Exception):
    """A certificate (or revocation) was refused; `reason` says why, `str()` says more."""

    def __init__(self, reason: CertificateReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: CertificateReason = reason


def authority_key_id(authority_public_key: bytes) -> bytes:
    """The 32-byte personalised BLAKE2b of an authority public key, truncated to 8 bytes.

    Certificates carry it so a verifier can say "issued by another cluster's authority"
    instead of just "bad signature"; its hex form is the cluster fingerprint.
    """
    if len(authority_public_key) != KEY_BYTES:
        raise ValueError(f"a public key is {KEY_BYTES} bytes, got {len(authority_public_key)}")
    digest = hashlib.blake2b(authority_public_key, digest_size=32, person=_AUTHORITY_PERSON)
    return digest.digest()[:AUTHORITY_KEY_ID_BYTES]


def check_scope(scope: str) -> str:
    """Validate a scope string: 1 to 64 printable ASCII characters, no spaces."""
    if not (0 < len(scope) <= MAX_SCOPE_LENGTH and scope.isascii() and scope.isprintable()):
        raise ValueError(f"a scope is 1 to {MAX_SCOPE_LENGTH} printable ASCII characters")
    if " " in scope:
        raise ValueError("a scope has no spaces")
    return scope


def _is_int(value: object) -> bool:
    return type(value) is int


@attrs.frozen
class EnrollmentCertificate:
    """A decoded certificate whose authority signature has been checked.

    Only `from_bytes` (verification) and `ClusterAuthority.enroll` (issuance) make
    these; `raw` is the exact signed bytes, what travels and what is cached.
    """

    authority_key_id: bytes
    node_public_key: bytes
    scope: str
    issued_at: int
    expires_at: int | None
    serial: int
    raw: bytes = attrs.field(repr=False)
    #: The node id of the enrolled key (computed once: it is asked for on every packet).
    node_id: str = attrs.field(init=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "node_id", node_id_from_public_key(self.node_public_key))

    @staticmethod
    def encode_body(
        authority_key_id: bytes,
        node_public_key: bytes,
        scope: str,
        issued_at: int,
        expires_at: int | None,
        serial: int,
    ) -> bytes:
        """The canonical body that the authority signs (see the module docstring)."""
        return pack_canonical(
            [
                CERTIFICATE_VERSION,
                authority_key_id,
                node_public_key,
                scope,
                issued_at,
                expires_at,
                serial,
            ]
        )

    @classmethod
    def from_bytes(cls, data: bytes, authority_public_key: bytes) -> EnrollmentCertificate:
        """Check the authority's signature on `data` and decode it.

        This is the expensive, cacheable part of verification: its result depends only on
        `data` and the authority. Time, key, scope and revocation are checked by `check`.

        Raises:
            CertificateError: `malformed`, `wrong_authority` or `bad_signature`.
        """
        try:
            body, signature = split_signed(data)
            fields = unpack_strict(body)
        except CodecError as exc:
            raise CertificateError("malformed", str(exc)) from None
        if not (isinstance(fields, list) and len(fields) == 7):
            raise CertificateError("malformed", "a certificate body is a 7-element array")
        version, key_id, node_key, scope, issued_at, expires_at, serial = fields
        if version != CERTIFICATE_VERSION or not _is_int(version):
            raise CertificateError("malformed", f"unknown certificate version {version!r}")
        if not (
            isinstance(key_id, bytes)
            and len(key_id) == AUTHORITY_KEY_ID_BYTES
            and isinstance(node_key, bytes)
            and len(node_key) == KEY_BYTES
            and isinstance(scope, str)
            and _is_int(issued_at)
            and (expires_at is None or _is_int(expires_at))
            and _is_int(serial)
        ):
            raise CertificateError("malformed", "a certificate field has the wrong type")
        if key_id != authority_key_id(authority_public_key):
            raise CertificateError(
                "wrong_authority",
                f"issued by authority {key_id.hex()}, "
                f"this cluster is {authority_key_id(authority_public_key).hex()}",
            )
        if not verify_signature(authority_public_key, CERTIFICATE_CONTEXT, body, signature):
            raise CertificateError("bad_signature", "the authority signature does not verify")
        return cls(key_id, node_key, scope, issued_at, expires_at, serial, data)

    def check(
        self,
        node_public_key: bytes | None,
        now: float,
        required_scope: str | None = DEFAULT_SCOPE,
        revocations: Revocations | None = None,
        *,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
    ) -> None:
        """Check the cheap, time- and context-dependent conditions.

        Args:
            node_public_key: the key the certificate must be for; None skips the check
                (the caller takes the key from the certificate itself).
            now: the verifier's realtime clock, Unix seconds.
            required_scope: the scope the certificate must grant; None accepts any.
            revocations: a verified revocation list for the same authority
                (`revocation.RevocationList`).
            clock_skew: tolerated amount by which `issued_at` may be in the future.

        Raises:
            CertificateError: `key_mismatch`, `expired`, `not_yet_valid`,
                `scope_mismatch` or `revoked`.
        """
        if node_public_key is not None and node_public_key != self.node_public_key:
            raise CertificateError(
                "key_mismatch",
                f"issued to {encode_public_key(self.node_public_key)}, "
                f"presented by {encode_public_key(node_public_key)}",
            )
        if self.expires_at is not None and now >= self.expires_at:
            raise CertificateError("expired", f"expired at {self.expires_at} (now {now:.0f})")
        if self.issued_at > now + clock_skew:
            raise CertificateError(
                "not_yet_valid", f"issued at {self.issued_at}, in the future (now {now:.0f})"
            )
        if required_scope is not None and self.scope != required_scope:
            raise CertificateError(
                "scope_mismatch", f"scope {self.scope!r}, {required_scope!r} required"
            )
        if revocations is not None and revocations.is_revoked(self):
            raise CertificateError("revoked", f"certificate serial {self.serial} is revoked")


def verify_certificate(
    cert_bytes: bytes,
    authority_public_key: bytes,
    node_public_key: bytes | None,
    now: float,
    required_scope: str | None = DEFAULT_SCOPE,
    revocations: Revocations | None = None,
    *,
    clock_skew: float = DEFAULT_CLOCK_SKEW,
) -> EnrollmentCertificate:
    """Verify a certificate completely: `EnrollmentCertificate.from_bytes` then `check`.

    Returns:
        The decoded certificate.

    Raises:
        CertificateError: with one of `CERTIFICATE_REASONS` as its `reason`.
    """
    cert = EnrollmentCertificate.from_bytes(cert_bytes, authority_public_key)
    cert.check(node_public_key, now, required_scope, revocations, clock_skew=clock_skew)
    return cert


def write_certificate(path: Path, cert: EnrollmentCertificate, *, overwrite: bool = False) -> None:
    """Write `cert` as an armored text file an operator can copy to its node."""
    expiry = "never" if cert.expires_at is None else f"at Unix time {cert.expires_at}"
    write_armored(
        path,
        CERTIFICATE_LABEL,
        cert.raw,
        secret=False,
        overwrite=overwrite,
        comments=[
            f"populi enrollment certificate for node {cert.node_id}",
            f"public key {encode_public_key(cert.node_public_key)}",
            f"scope {cert.scope}, serial {cert.serial}, expires {expiry}",
        ],
    )


def read_certificate(path: Path) -> bytes:
    """Read the certificate bytes from an armored file (verify them with `verify_certificate`).

    Raises:
        KeyFileError: missing, unreadable or not a certificate file.
    """
    return read_armored(path, CERTIFICATE_LABEL, secret=False)
