"""Certificates learned from verified records (`PacketAuthenticator.learn`), and what an
attacker can do with that path: nothing more than before.

A member whose signed record we verified sends its packets without its certificate
from the first one on. The credential is checked as if it came in a packet, each packet
still needs its own signature by that key, and until the member's first packet has
authenticated, forgeries in its name are judged by their source address (as they were
before its certificate was learned), so they cannot spend a budget its packets need.
"""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from overlay.auth import AuthError, Opened, PacketAuthenticator
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.identity import NodeIdentity

from .auth_cluster import ALICE, AUTHORITY, BOB, CERTS, NOW, make_authenticator

ALICE_AT = "10.0.0.1"
MALLORY_AT = "10.0.0.66"


def opens(receiver: PacketAuthenticator, packet: bytes, source: str) -> Opened | None:
    try:
        return receiver.open(packet, NOW, source=source)
    except AuthError:
        return None


def in_the_name_of(victim: NodeIdentity, forger: NodeIdentity, counter: int) -> bytes:
    """A well-formed envelope that names `victim`'s key, without CERT, ADDRESSED to bob,
    signed by `forger`: what a member whose certificate bob holds would send, but not
    by that member."""
    from overlay.auth import FLAG_ADDRESSED, KIND_PLAIN_V1, PACKET_CONTEXT

    body = struct.pack(
        ">BB32sQQ", KIND_PLAIN_V1, FLAG_ADDRESSED, victim.public_key, int(NOW * 1e6), counter
    )
    body += b"\x01payload"
    return body + forger.sign(PACKET_CONTEXT + BOB.node_id.encode(), body)


def test_a_member_whose_record_we_hold_opens_without_its_certificate(
    alice: PacketAuthenticator, bob: PacketAuthenticator
) -> None:
    lean = alice.seal(b"\x01hello", NOW, recipient=BOB.node_id, include_certificate=False)
    assert opens(bob, lean, ALICE_AT) is None  # nothing known of alice yet
    assert bob.drops["unknown_sender"] == 1
    assert bob.learn(ALICE.public_key, CERTS[ALICE.node_id], NOW)
    again = alice.seal(b"\x01hello", NOW, recipient=BOB.node_id, include_certificate=False)
    opened = opens(bob, again, ALICE_AT)
    assert opened is not None and opened.sender_node_id == ALICE.node_id
    assert opened.payload == b"\x01hello" and opened.new_session
    # Learning the same certificate again costs nothing and changes nothing.
    assert bob.learn(ALICE.public_key, CERTS[ALICE.node_id], NOW)
    assert bob.statistics().certificates == 1


def test_learn_checks_the_credential_as_a_packet_would(bob: PacketAuthenticator) -> None:
    rogue = ClusterAuthority.generate()
    refused = [
        rogue.enroll(ALICE.public_key, now=NOW - 60).raw,  # another cluster's
        CERTS[BOB.node_id],  # a real certificate, for another key
        AUTHORITY.enroll(ALICE.public_key, now=NOW - 7200, expires_in=3600).raw,  # expired
        b"",
        b"\x00" * 136,
    ]
    for credential in refused:
        assert not bob.learn(ALICE.public_key, credential, NOW)
    assert bob.statistics().certificates == 0
    alice = make_authenticator(ALICE)
    lean = alice.seal(b"\x01x", NOW, recipient=BOB.node_id, include_certificate=False)
    assert opens(bob, lean, ALICE_AT) is None
    assert bob.drops["unknown_sender"] == 1


@given(credential=st.binary(max_size=400), key=st.binary(min_size=32, max_size=32))
def test_learn_never_raises_on_junk(credential: bytes, key: bytes) -> None:
    bob = make_authenticator(BOB)
    assert not bob.learn(key, credential, NOW)
    assert bob.statistics().certificates == 0


def test_a_packet_in_a_learned_members_name_signed_by_another_key_is_refused(
    bob: PacketAuthenticator,
) -> None:
    """The brief's attack: bob holds alice's certificate from her record; mallory (an
    enrolled insider, or anyone with a key) names alice's key and signs with its own."""
    mallory = NodeIdentity.from_seed(b"m" * 32)
    assert bob.learn(ALICE.public_key, CERTS[ALICE.node_id], NOW)
    assert opens(bob, in_the_name_of(ALICE, mallory, 1), MALLORY_AT) is None
    assert bob.drops["bad_signature"] == 1
    # It changed nothing: alice's own first packet still starts her session, and opens.
    alice = make_authenticator(ALICE)
    lean = alice.seal(b"\x01x", NOW, recipient=BOB.node_id, include_certificate=False)
    opened = opens(bob, lean, ALICE_AT)
    assert opened is not None and opened.new_session


def test_forgeries_in_a_learned_members_name_cost_it_nothing(bob: PacketAuthenticator) -> None:
    """A flood of forgeries naming a member that has not sent us anything yet is charged
    to the forger's source, not to the member's name: its first real packet (which
    continues no replay window) still earns its signature check."""
    mallory = NodeIdentity.from_seed(b"m" * 32)
    assert bob.learn(ALICE.public_key, CERTS[ALICE.node_id], NOW)
    for counter in range(1, 201):
        assert opens(bob, in_the_name_of(ALICE, mallory, counter), MALLORY_AT) is None
    drops = bob.drops.as_dict()
    assert drops["bad_signature"] + drops["rate_limited"] == 200
    assert drops["rate_limited"] > 150  # the forger's source ran out of budget
    alice = make_authenticator(ALICE)
    lean = alice.seal(b"\x01x", NOW, recipient=BOB.node_id, include_certificate=False)
    assert opens(bob, lean, ALICE_AT) is not None
    # Once alice has been heard, her name is hers: her packets continue her window.
    for _ in range(50):
        assert opens(bob, in_the_name_of(ALICE, mallory, 10**18), MALLORY_AT) is None
    nxt = alice.seal(b"\x01y", NOW, recipient=BOB.node_id, include_certificate=False)
    assert opens(bob, nxt, ALICE_AT) is not None


def test_a_learned_certificate_is_still_checked_per_packet(bob: PacketAuthenticator) -> None:
    """Expiry is checked on every packet, as for a certificate that came in one."""
    short = AUTHORITY.enroll(ALICE.public_key, now=NOW - 60, expires_in=120).raw
    assert bob.learn(ALICE.public_key, short, NOW)
    alice = make_authenticator(ALICE)
    later = NOW + 3600
    lean = alice.seal(b"\x01x", later, recipient=BOB.node_id, include_certificate=False)
    try:
        bob.open(lean, later, source=ALICE_AT)
    except AuthError as exc:
        assert exc.reason == "bad_certificate"
    else:
        raise AssertionError("a packet under an expired learned certificate opened")
