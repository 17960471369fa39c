"""populi's keys for the packet envelope: certificates, identities and revocations.

`overlay.auth.PacketAuthenticator` is handed a `PacketSigner` and a `PeerVerifier`
(`overlay/verifier.py`) so that `overlay/` imports nothing from here. `EnvelopeKeys` is
both, built from this node's `NodeIdentity`, its enrollment certificate and the cluster
authority; `packet_authenticator` builds the whole authenticator in one call.
"""

from __future__ import annotations

from typing import Any

from overlay.auth import PacketAuthenticator
from overlay.verifier import CredentialError, CredentialReason, PeerCredential

from .certificate import DEFAULT_CLOCK_SKEW, DEFAULT_SCOPE, CertificateError, EnrollmentCertificate
from .identity import NodeIdentity, verify_signature
from .revocation import RevocationList

__all__ = ["EnvelopeKeys", "packet_authenticator"]


class EnvelopeKeys:
    """This node's signer and the cluster's verifier for packet envelopes.

    Args:
        identity: this node's key.
        certificate: this node's enrollment certificate bytes (sent with CERT).
        authority_public_key: the cluster authority; only its enrollees get through.
        revocations: revocations heard so far (replace with `update_revocations`).
        required_scope: the certificate scope a sender needs (None: any scope).
        clock_skew: seconds a certificate's issue time may be ahead of our clock.

    Raises:
        ValueError: `certificate` is not for `identity`'s key, or is too large.
        CertificateError: `certificate` is not from `authority_public_key`.
    """

    def __init__(
        self,
        identity: NodeIdentity,
        certificate: bytes,
        authority_public_key: bytes,
        *,
        revocations: RevocationList | None = None,
        required_scope: str | None = DEFAULT_SCOPE,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
    ) -> None:
        own = EnrollmentCertificate.from_bytes(certificate, authority_public_key)
        if own.node_public_key != identity.public_key:
            raise ValueError(
                f"the certificate is for node {own.node_id}, but this node is {identity.node_id}"
            )
        if len(certificate) > 0xFFFF:
            raise ValueError("the certificate is too large for the envelope")
        self._identity = identity
        self._certificate = certificate
        self._authority = authority_public_key
        self._revocations = revocations if revocations is not None else RevocationList()
        self._scope = required_scope
        self._skew = clock_skew

    # PacketSigner

    @property
    def node_id(self) -> str:
        return self._identity.node_id

    @property
    def public_key(self) -> bytes:
        return self._identity.public_key

    @property
    def credential(self) -> bytes:
        return self._certificate

    def sign(self, context: bytes, body: bytes) -> bytes:
        return self._identity.sign(context, body)

    # PeerVerifier

    def update_revocations(self, revocations: RevocationList) -> None:
        """Adopt a (merged) revocation list; cached certificates are re-checked per packet."""
        self._revocations = revocations

    def load(self, raw: bytes) -> PeerCredential:
        try:
            return EnrollmentCertificate.from_bytes(raw, self._authority)
        except CertificateError as exc:
            raise CredentialError("bad_certificate", str(exc)) from None

    def admit(self, credential: PeerCredential, public_key: bytes, now_real: float) -> None:
        if not isinstance(credential, EnrollmentCertificate):
            raise CredentialError("bad_certificate", "not an enrollment certificate")
        try:
            credential.check(
                public_key, now_real, self._scope, self._revocations, clock_skew=self._skew
            )
        except CertificateError as exc:
            reason: CredentialReason = "revoked" if exc.reason == "revoked" else "bad_certificate"
            raise CredentialError(reason, str(exc)) from None

    def verify(self, public_key: bytes, context: bytes, body: bytes, signature: bytes) -> bool:
        return verify_signature(public_key, context, body, signature)


def packet_authenticator(
    identity: NodeIdentity,
    certificate: bytes,
    authority_public_key: bytes,
    *,
    revocations: RevocationList | None = None,
    required_scope: str | None = DEFAULT_SCOPE,
    clock_skew: float = DEFAULT_CLOCK_SKEW,
    **options: Any,
) -> PacketAuthenticator:
    """A `PacketAuthenticator` with `EnvelopeKeys`; `options` go to the authenticator.

    Its `verifier` is the `EnvelopeKeys`, for `update_revocations`.
    """
    keys = EnvelopeKeys(
        identity,
        certificate,
        authority_public_key,
        revocations=revocations,
        required_scope=required_scope,
        clock_skew=clock_skew,
    )
    return PacketAuthenticator(keys, keys, **options)
