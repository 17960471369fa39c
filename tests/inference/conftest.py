"""A small cluster for the inference tests: one authority, three enrolled nodes."""

from __future__ import annotations

from populi_p2p.inference.peer_auth import PeerCallSigner, PeerCallVerifier
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.envelope_keys import EnvelopeKeys
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.revocation import RevocationList

#: Realtime used by the signature tests (Unix seconds).
NOW = 1_700_000_000.0

AUTHORITY = ClusterAuthority.from_seed(b"A" * 32)
OTHER_AUTHORITY = ClusterAuthority.from_seed(b"Z" * 32)
ALICE = NodeIdentity.from_seed(b"a" * 32)
BOB = NodeIdentity.from_seed(b"b" * 32)
MALLORY = NodeIdentity.from_seed(b"m" * 32)
CERTS = {
    n.node_id: AUTHORITY.enroll(n.public_key, now=NOW - 60, serial=i).raw
    for i, n in enumerate((ALICE, BOB))
}


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def signer(identity: NodeIdentity, clock: Clock, cert: bytes | None = None) -> PeerCallSigner:
    return PeerCallSigner(
        identity, cert if cert is not None else CERTS[identity.node_id], clock=clock
    )


def keys(identity: NodeIdentity, revocations: RevocationList | None = None) -> EnvelopeKeys:
    return EnvelopeKeys(
        identity, CERTS[identity.node_id], AUTHORITY.public_key, revocations=revocations
    )


def verifier(identity: NodeIdentity, clock: Clock, **kwargs: object) -> PeerCallVerifier:
    return PeerCallVerifier(keys(identity), identity.node_id, clock=clock, **kwargs)  # type: ignore[arg-type]
