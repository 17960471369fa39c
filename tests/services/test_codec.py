"""`services.codec`: the inbox lane of a raw payload, and what `AuthCodec` counts and
hands on (the seal/open exchanges between two nodes: tests/node/test_node_codec.py)."""

from __future__ import annotations

from overlay.base import Address
from overlay.inbox import BULK, URGENT, Incoming
from populi_p2p.services.codec import WIRE_PACKET_BUDGET, AuthCodec, lane
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.envelope_keys import packet_authenticator
from populi_p2p.trust.identity import NodeIdentity

AUTHORITY = ClusterAuthority.from_seed(b"A" * 32)
ALICE = NodeIdentity.from_seed(b"a" * 32)
BOB = NodeIdentity.from_seed(b"b" * 32)
NOW = 1_700_000_000.0
ALICE_AT: Address = ("10.0.0.1", 7946)
BOB_AT: Address = ("10.0.0.2", 7946)


def codec(identity: NodeIdentity, **handlers: object) -> AuthCodec:
    cert = AUTHORITY.enroll(identity.public_key, now=NOW - 60, serial=1).raw
    auth = packet_authenticator(identity, cert, AUTHORITY.public_key)
    return AuthCodec(auth, 1 << 20, clock=lambda: 5.0, realtime=lambda: NOW, **handlers)  # type: ignore[arg-type]


def test_a_payload_that_fits_a_datagram_is_urgent_a_bigger_one_bulk() -> None:
    assert lane(b"x" * WIRE_PACKET_BUDGET) == URGENT
    assert lane(b"x" * (WIRE_PACKET_BUDGET + 1)) == BULK


def test_bytes_are_counted_each_way_frames_apart() -> None:
    alice, bob = codec(ALICE), codec(BOB)
    datagram = bob.seal(ALICE_AT, b"\x01ping", False)
    frame = bob.seal(ALICE_AT, b"\x01state", True)
    assert bob.bytes_out == len(datagram) + len(frame) and bob.frame_bytes_out == len(frame)
    assert bob.datagrams_with_certificate == 1  # alice's address is no member's yet
    assert alice.open(Incoming(BOB_AT, datagram, False, URGENT)) == b"\x01ping"
    assert alice.last_sender == BOB.node_id
    assert alice.open(Incoming(BOB_AT, b"junk", False, URGENT)) is None
    assert alice.last_sender is None  # a refused packet names nobody
    assert alice.bytes_in == len(datagram) + 4


def test_the_tcp_answer_handler_is_told_the_members_address() -> None:
    answered: list[Address] = []
    alice, bob = codec(ALICE, on_tcp_answer=answered.append), codec(BOB)
    frame = bob.seal(ALICE_AT, b"\x01state", True)
    assert alice.open(Incoming(("10.0.0.2", 40001), frame, True, URGENT)) == b"\x01state"
    assert answered == []  # not a member yet: no address to name
    alice.recipients[BOB_AT] = BOB.node_id
    assert alice.open(Incoming(("10.0.0.2", 40001), frame, True, URGENT)) is None  # replay
    frame = bob.seal(ALICE_AT, b"\x01state2", True)
    assert alice.open(Incoming(("10.0.0.2", 40001), frame, True, URGENT)) == b"\x01state2"
    assert answered == [BOB_AT]


def test_without_handlers_nothing_is_told_and_nothing_fails() -> None:
    alice, bob = codec(ALICE), codec(BOB)
    alice.recipients[BOB_AT] = BOB.node_id
    frame = bob.seal(ALICE_AT, b"\x01state", True)
    assert alice.open(Incoming(BOB_AT, frame, True, URGENT)) == b"\x01state"
