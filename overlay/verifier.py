"""What the envelope needs from an identity system, as interfaces the overlay is handed.

Why: `overlay/` carries packets; who may send them (certificates, enrollment, revocation)
is the node's business. `PacketAuthenticator` is handed a `PacketSigner` (this node's
key and credential) and a `PeerVerifier` (how a sender's credential and signature are
checked), and imports nothing from `populi_p2p`. populi's implementation of both is
`populi_p2p.trust.envelope_keys.EnvelopeKeys`; a test can hand in anything that fits.
"""

from __future__ import annotations

from typing import Final, Literal, Protocol

__all__ = [
    "NODE_ID_LENGTH",
    "SIGNATURE_BYTES",
    "CredentialError",
    "CredentialReason",
    "PacketSigner",
    "PeerCredential",
    "PeerVerifier",
]

#: Bytes of a signature in the envelope (Ed25519).
SIGNATURE_BYTES: Final = 64
#: Characters of a node id (the ADDRESSED recipient), ASCII.
NODE_ID_LENGTH: Final = 16

CredentialReason = Literal["bad_certificate", "revoked"]


class CredentialError(Exception):
    """A sender's credential was refused; `reason` says how the packet is counted."""

    def __init__(self, reason: CredentialReason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason: CredentialReason = reason


class PeerCredential(Protocol):
    """A sender's verified credential (populi: an `EnrollmentCertificate`)."""

    @property
    def node_id(self) -> str:
        """The sender's node id, `NODE_ID_LENGTH` ASCII characters."""
        ...

    @property
    def raw(self) -> bytes:
        """The exact bytes it was loaded from (the cache compares them)."""
        ...


class PeerVerifier(Protocol):
    """Checks senders' credentials and signatures. Must be pure and must not raise
    anything but `CredentialError` for any input."""

    def load(self, raw: bytes) -> PeerCredential:
        """Verify a credential's own signature and decode it (the expensive, cached part).

        Raises:
            CredentialError: not a credential this cluster issued (`bad_certificate`).
        """
        ...

    def admit(self, credential: PeerCredential, public_key: bytes, now_real: float) -> None:
        """Check, per packet, that `credential` admits `public_key` now.

        Raises:
            CredentialError: wrong key, expired, wrong scope (`bad_certificate`), or
                revoked (`revoked`).
        """
        ...

    def verify(self, public_key: bytes, context: bytes, body: bytes, signature: bytes) -> bool:
        """Whether `signature` is `public_key`'s signature of context + body; never raises."""
        ...


class PacketSigner(Protocol):
    """This node's side: its key, its credential, and signing."""

    @property
    def node_id(self) -> str: ...

    @property
    def public_key(self) -> bytes:
        """32 bytes, sent in every envelope."""
        ...

    @property
    def credential(self) -> bytes:
        """This node's credential bytes, carried with CERT (at most 65,535 bytes)."""
        ...

    def sign(self, context: bytes, body: bytes) -> bytes:
        """A `SIGNATURE_BYTES` signature of context + body."""
        ...
