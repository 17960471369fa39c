"""The daemon's packet codec: our certificate rides only while a peer may not know us,
and a peer that restarts (a new session in its envelopes) is introduced to again."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from overlay.inbox import URGENT, Incoming
from overlay.introductions import INTRODUCTION_PACKETS
from populi_p2p.node import _AuthCodec
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.envelope_keys import packet_authenticator
from populi_p2p.trust.identity import NodeIdentity

AUTHORITY = ClusterAuthority.from_seed(b"A" * 32)
ALICE = NodeIdentity.from_seed(b"a" * 32)
BOB = NodeIdentity.from_seed(b"b" * 32)
ALICE_AT = ("10.0.0.1", 7950)
BOB_AT = ("10.0.0.2", 7950)
START = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def real(self) -> float:
        return START + self.now


def certificate(identity: NodeIdentity) -> bytes:
    return AUTHORITY.enroll(identity.public_key, now=START - 60, serial=1).raw


def codec(identity: NodeIdentity, clock: Clock, **handlers: Any) -> _AuthCodec:
    """`identity`'s codec; `handlers`: its `on_stale` and `on_tcp_answer`."""
    auth = packet_authenticator(identity, certificate(identity), AUTHORITY.public_key)
    return _AuthCodec(auth, 1 << 20, clock=clock.monotonic, realtime=clock.real, **handlers)


def meet(me: _AuthCodec, peer: NodeIdentity, at: tuple[str, int], clock: Clock) -> None:
    """What the node does when `peer` joins with a verified record: it addresses the
    member (links), holds its certificate from the record (roster), and introduces us."""
    me.recipients[at] = peer.node_id
    assert me.learn_certificate(peer.public_key, certificate(peer))
    me.introductions.introduce(peer.node_id, clock.now)


def send(sender: _AuthCodec, to: tuple[str, int], receiver: _AuthCodec, source: tuple[str, int]):
    """Seal at `sender`, open at `receiver`: the payload, or None if it was refused."""
    sealed = sender.seal(to, b"\x01payload", False)
    return receiver.open(Incoming(source, sealed, False, URGENT))


def lean(sender: _AuthCodec, to: tuple[str, int], receiver: _AuthCodec, source: tuple[str, int]):
    """Whether a packet went without the certificate, and opened."""
    without = sender.datagrams_without_certificate
    opened = send(sender, to, receiver, source)
    return opened == b"\x01payload" and sender.datagrams_without_certificate == without + 1


def test_certificate_only_while_a_peer_may_not_know_us() -> None:
    clock = Clock()
    alice, bob = codec(ALICE, clock), codec(BOB, clock)
    # They just met: each holds the other's record, and introduces itself.
    meet(alice, BOB, BOB_AT, clock)
    meet(bob, ALICE, ALICE_AT, clock)
    assert send(alice, BOB_AT, bob, ALICE_AT) == b"\x01payload"
    assert alice.datagrams_with_certificate == 1
    # Her packet was addressed to bob: he holds her record, so she holds his. His
    # introduction ends before his first packet, hers at it; from then on both are lean.
    assert lean(bob, ALICE_AT, alice, BOB_AT)
    clock.now += 3600  # an hour later (so that a restart shows in her counter)
    for _ in range(INTRODUCTION_PACKETS):
        assert lean(alice, BOB_AT, bob, ALICE_AT) and lean(bob, ALICE_AT, alice, BOB_AT)
    assert (alice.datagrams_with_certificate, bob.datagrams_with_certificate) == (1, 0)

    # Alice restarts: she forgot Bob's certificate and does not know him as a member
    # yet. Bob cannot know until he hears from her; a lean packet of his now is refused.
    clock.now += 2
    alice = codec(ALICE, clock)
    assert send(bob, ALICE_AT, alice, BOB_AT) is None
    assert alice.auth.drops.as_dict()["unknown_sender"] == 1
    # Her first packet, to his bare address (a bootstrap ping), starts a new session,
    # and is not addressed: his next packets carry his certificate again, and open.
    assert send(alice, BOB_AT, bob, ALICE_AT) == b"\x01payload"
    with_before = bob.datagrams_with_certificate
    assert send(bob, ALICE_AT, alice, BOB_AT) == b"\x01payload"
    assert send(bob, ALICE_AT, alice, BOB_AT) == b"\x01payload"
    assert bob.datagrams_with_certificate == with_before + 2
    # She learns the members (a push-pull brings his record) and addresses him: his
    # introduction ends at her next packet.
    meet(alice, BOB, BOB_AT, clock)
    assert send(alice, BOB_AT, bob, ALICE_AT) == b"\x01payload"
    assert lean(bob, ALICE_AT, alice, BOB_AT)


def test_an_addressed_packet_ends_the_introduction_at_once() -> None:
    """A peer that binds a packet to our node id holds our record, so our certificate."""
    clock = Clock()
    alice, bob = codec(ALICE, clock), codec(BOB, clock)
    meet(alice, BOB, BOB_AT, clock)
    # Bob does not know alice as a member: he answers her bare address, unaddressed
    # once her reply binding is over. That is no evidence; her introduction goes on.
    assert send(alice, BOB_AT, bob, ALICE_AT) == b"\x01payload"
    clock.now += 60
    assert send(bob, ALICE_AT, alice, BOB_AT) == b"\x01payload"
    assert send(alice, BOB_AT, bob, ALICE_AT) == b"\x01payload"
    assert alice.datagrams_with_certificate == 2
    # Now he knows her (her record reached him) and addresses her: hers ends.
    meet(bob, ALICE, ALICE_AT, clock)
    assert send(bob, ALICE_AT, alice, BOB_AT) == b"\x01payload"  # his introduction
    assert lean(alice, BOB_AT, bob, ALICE_AT)  # well inside her 3 packets
    assert lean(bob, ALICE_AT, alice, BOB_AT)  # and hers to him ended his


def test_an_ack_ends_the_introduction_at_once() -> None:
    """A peer that acks our probe read it, so it holds our certificate: stop sending it,
    even when the ack is not addressed (bob does not know alice as a member)."""
    from overlay.auth import FLAG_ADDRESSED
    from populi_p2p.services.codec import REPLY_BINDING_SECONDS
    from swim import wire

    clock = Clock()
    alice, bob = codec(ALICE, clock), codec(BOB, clock)
    meet(alice, BOB, BOB_AT, clock)
    ping = wire.encode(wire.Ping(1, BOB.node_id, ALICE.node_id, ALICE_AT))
    assert bob.open(Incoming(ALICE_AT, alice.seal(BOB_AT, ping, False), False, URGENT)) == ping
    assert alice.datagrams_with_certificate == 1
    # Not an ack, and not addressed (his reply binding to her is over): it goes on.
    clock.now += REPLY_BINDING_SECONDS
    assert send(bob, ALICE_AT, alice, BOB_AT) == b"\x01payload"
    assert send(alice, BOB_AT, bob, ALICE_AT) == b"\x01payload"
    assert alice.datagrams_with_certificate == 2
    clock.now += REPLY_BINDING_SECONDS
    ack = wire.encode(wire.Ack(1), wire.Left("x" * 16, 1))
    sealed = bob.seal(ALICE_AT, ack, False)
    assert not sealed[1] & FLAG_ADDRESSED
    assert alice.open(Incoming(BOB_AT, sealed, False, URGENT)) == ack
    assert lean(alice, BOB_AT, bob, ALICE_AT)  # one of her 3 packets still to go


def test_unknown_addresses_and_streams_always_get_the_certificate() -> None:
    clock = Clock()
    alice, bob = codec(ALICE, clock), codec(BOB, clock)
    # Bootstrap: a bare address, no node id yet.
    assert send(alice, BOB_AT, bob, ALICE_AT) == b"\x01payload"
    assert alice.datagrams_with_certificate == 1
    alice.recipients[BOB_AT] = BOB.node_id
    frame = alice.seal(BOB_AT, b"\x01state", True)
    assert bob.open(Incoming(ALICE_AT, frame, True, URGENT)) == b"\x01state"
    assert alice.introductions.with_certificate == 2


class SkewedClock(Clock):
    def __init__(self, ahead: float) -> None:
        super().__init__()
        self.ahead = ahead

    def real(self) -> float:
        return START + self.now + self.ahead


def test_a_peer_clock_10_minutes_ahead_is_named_once_with_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from populi_p2p.services.clock import SkewWatch

    caplog.set_level(logging.DEBUG)

    bob_clock = SkewedClock(600.0)
    watch, bob_watch = SkewWatch(), SkewWatch()
    alice = codec(ALICE, Clock(), on_stale=watch.observe)
    bob = codec(BOB, bob_clock, on_stale=bob_watch.observe)
    for _ in range(3):
        assert send(bob, ALICE_AT, alice, BOB_AT) is None  # refused as stale
    assert alice.auth.drops.as_dict()["stale"] == 3
    assert watch.notices() == [
        "packets from 10.0.0.2 are 600 s in the future: check its clock (NTP)"
    ]
    from populi_p2p._log import _FIELDS_ATTR

    logged = [getattr(r, _FIELDS_ATTR) for r in caplog.records if r.getMessage() == "clock.skew"]
    assert len(logged) == 1 and "600 s in the future" in str(logged[0]["message"])
    # And the skewed side says the same of its peers, the other way round.
    assert send(alice, BOB_AT, bob, ALICE_AT) is None
    assert bob_watch.notices() == [
        "packets from 10.0.0.1 are 600 s in the past: check its clock (NTP)"
    ]


def test_skew_within_the_freshness_window_is_not_reported() -> None:
    from populi_p2p.services.clock import SkewWatch

    watch = SkewWatch()
    alice, bob = codec(ALICE, Clock(), on_stale=watch.observe), codec(BOB, SkewedClock(5.0))
    assert send(bob, ALICE_AT, alice, BOB_AT) == b"\x01payload"
    assert watch.notices() == []


CAROL = NodeIdentity.from_seed(b"c" * 32)
CAROL_AT = ("10.0.0.3", 7950)


def test_a_reply_to_a_non_member_is_addressed_to_it_and_cannot_be_replayed() -> None:
    """Found by tests/attacks: alice's reply to a sender that is no member (carol) went
    unaddressed, so carol, or anyone on the path, could replay it to bob, or back to
    alice, and have it accepted once. Now it is bound to carol for a reply's while."""
    from overlay.auth import FLAG_ADDRESSED
    from populi_p2p.services.codec import REPLY_BINDING_SECONDS

    clock = Clock()
    alice, bob, carol = codec(ALICE, clock), codec(BOB, clock), codec(CAROL, clock)
    bob.recipients[ALICE_AT] = ALICE.node_id
    assert send(alice, BOB_AT, bob, ALICE_AT) == b"\x01payload"  # bob knows alice
    assert send(carol, ALICE_AT, alice, CAROL_AT) == b"\x01payload"  # carol pings alice
    reply = alice.seal(CAROL_AT, b"\x01ack", False)
    assert reply[1] & FLAG_ADDRESSED
    assert carol.open(Incoming(ALICE_AT, reply, False, URGENT)) == b"\x01ack"
    # Captured and replayed: to bob, and reflected to alice. Both refuse it.
    assert bob.open(Incoming(CAROL_AT, reply, False, URGENT)) is None
    assert alice.open(Incoming(CAROL_AT, reply, False, URGENT)) is None
    assert bob.auth.drops["bad_signature"] == 1
    assert alice.auth.drops["bad_signature"] == 1
    # The binding is for replies: later, a packet to that bare address is unaddressed
    # again (a new key there would otherwise be refused).
    clock.now += REPLY_BINDING_SECONDS
    assert not alice.seal(CAROL_AT, b"\x01x", False)[1] & FLAG_ADDRESSED


def test_an_authenticated_frame_is_tcp_evidence_for_the_senders_member_address() -> None:
    """A peer answers over the connection it pooled (inbound to us, from an ephemeral port):
    the codec names the member's address once the frame authenticates, so "UDP blocked, TCP
    works" can be said on either side (tests/netns/test_node.py)."""
    clock = Clock()
    answered: list[tuple[str, int]] = []
    alice, bob = codec(ALICE, clock, on_tcp_answer=answered.append), codec(BOB, clock)
    alice.recipients[BOB_AT] = BOB.node_id
    frame = bob.seal(ALICE_AT, b"\x01state", True)
    ephemeral = (BOB_AT[0], 40001)
    assert alice.open(Incoming(ephemeral, frame, True, URGENT)) == b"\x01state"
    assert answered == [BOB_AT]
    # A datagram is no TCP evidence, and a frame that fails authentication names nobody.
    assert alice.open(Incoming(BOB_AT, bob.seal(ALICE_AT, b"\x01d", False), False, URGENT))
    assert alice.open(Incoming(ephemeral, frame[:-1] + b"\x00", True, URGENT)) is None
    assert answered == [BOB_AT]


def test_the_codec_names_who_signed_the_packet_it_opened_last() -> None:
    """The driver hands `last_sender` to the core, which answers a pull only to the
    member that signed it (issue 18, row 4): set on every packet that opens, cleared
    by one that does not."""
    clock = Clock()
    alice, bob = codec(ALICE, clock), codec(BOB, clock)
    assert bob.last_sender is None
    assert send(alice, BOB_AT, bob, ALICE_AT) == b"\x01payload"
    assert bob.last_sender == ALICE.node_id
    sealed = alice.seal(BOB_AT, b"\x01payload", False)
    forged = sealed[:-1] + bytes([sealed[-1] ^ 1])
    assert bob.open(Incoming(ALICE_AT, forged, False, URGENT)) is None
    assert bob.last_sender is None
