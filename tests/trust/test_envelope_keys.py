"""`populi_p2p.trust.envelope_keys.EnvelopeKeys`: populi's signer and verifier for the
packet envelope, and how certificate refusals map to the envelope's two reasons."""

from __future__ import annotations

import pytest

from overlay.auth import PacketAuthenticator
from overlay.verifier import CredentialError
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.certificate import CertificateError
from populi_p2p.trust.envelope_keys import EnvelopeKeys, packet_authenticator
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.revocation import RevocationList

from .conftest import NOW


def keys_for(authority: ClusterAuthority, node: NodeIdentity, **kwargs: object) -> EnvelopeKeys:
    cert = authority.enroll(node.public_key, now=NOW, expires_in=3600).raw
    return EnvelopeKeys(node, cert, authority.public_key, **kwargs)  # type: ignore[arg-type]


def test_the_signer_is_the_node(authority: ClusterAuthority, node: NodeIdentity) -> None:
    keys = keys_for(authority, node)
    assert (keys.node_id, keys.public_key) == (node.node_id, node.public_key)
    signature = keys.sign(b"ctx", b"body")
    assert keys.verify(node.public_key, b"ctx", b"body", signature)
    assert not keys.verify(node.public_key, b"ctx", b"other", signature)
    assert not keys.verify(node.public_key, b"ctx", b"body", b"\0" * 64)


def test_a_peer_enrolled_by_our_authority_is_admitted(
    authority: ClusterAuthority, node: NodeIdentity, other_node: NodeIdentity
) -> None:
    keys = keys_for(authority, node)
    peer = keys_for(authority, other_node)
    credential = keys.load(peer.credential)
    assert credential.node_id == other_node.node_id
    keys.admit(credential, other_node.public_key, NOW + 10)  # no raise


def test_refusals_map_to_bad_certificate_or_revoked(
    authority: ClusterAuthority,
    other_authority: ClusterAuthority,
    node: NodeIdentity,
    other_node: NodeIdentity,
) -> None:
    keys = keys_for(authority, node)
    stranger = keys_for(other_authority, other_node)
    with pytest.raises(CredentialError) as caught:
        keys.load(stranger.credential)
    assert caught.value.reason == "bad_certificate"
    peer = keys.load(keys_for(authority, other_node).credential)
    for public_key, at in ((node.public_key, NOW), (other_node.public_key, NOW + 7200)):
        with pytest.raises(CredentialError) as caught:
            keys.admit(peer, public_key, at)  # the wrong key; expired
        assert caught.value.reason == "bad_certificate"
    keys.update_revocations(
        RevocationList.of([authority.revoke(now=NOW, node_public_key=other_node.public_key)])
    )
    with pytest.raises(CredentialError) as caught:
        keys.admit(peer, other_node.public_key, NOW)
    assert caught.value.reason == "revoked"


def test_admit_refuses_a_credential_of_another_kind(
    authority: ClusterAuthority, node: NodeIdentity
) -> None:
    class Fake:
        node_id = "x" * 16
        raw = b""

    with pytest.raises(CredentialError, match="not an enrollment certificate"):
        keys_for(authority, node).admit(Fake(), node.public_key, NOW)


def test_a_scope_is_required_unless_none(authority: ClusterAuthority, node: NodeIdentity) -> None:
    operator_cert = authority.enroll(node.public_key, "operator", now=NOW)
    keys = keys_for(authority, node)
    with pytest.raises(CredentialError, match="scope"):
        keys.admit(keys.load(operator_cert.raw), node.public_key, NOW)
    any_scope = keys_for(authority, node, required_scope=None)
    any_scope.admit(any_scope.load(operator_cert.raw), node.public_key, NOW)


def test_our_own_certificate_must_be_for_our_key_and_from_the_authority(
    authority: ClusterAuthority,
    other_authority: ClusterAuthority,
    node: NodeIdentity,
    other_node: NodeIdentity,
) -> None:
    theirs = authority.enroll(other_node.public_key, now=NOW).raw
    with pytest.raises(ValueError, match=f"this node is {node.node_id}"):
        EnvelopeKeys(node, theirs, authority.public_key)
    foreign = other_authority.enroll(node.public_key, now=NOW).raw
    with pytest.raises(CertificateError):
        EnvelopeKeys(node, foreign, authority.public_key)


def test_packet_authenticator_uses_the_keys_both_ways(
    authority: ClusterAuthority, node: NodeIdentity
) -> None:
    cert = authority.enroll(node.public_key, now=NOW).raw
    auth = packet_authenticator(node, cert, authority.public_key)
    assert isinstance(auth, PacketAuthenticator)
    assert isinstance(auth.verifier, EnvelopeKeys)
    assert auth.verifier.credential == cert
