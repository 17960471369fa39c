"""The daemon's packet codec: our certificate rides only while a peer may not know us,
and a peer that restarts (a new session in its envelopes) is introduced to again."""

from __future__ import annotations

import logging

import pytest

from overlay.inbox import URGENT, Incoming
from overlay.introductions import INTRODUCTION_PACKETS, INTRODUCTION_SECONDS
from populi_p2p.authority import ClusterAuthority
from populi_p2p.envelope_keys import packet_authenticator
from populi_p2p.identity import NodeIdentity
from populi_p2p.node import _AuthCodec

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


def codec(identity: NodeIdentity, clock: Clock) -> _AuthCodec:
    cert = AUTHORITY.enroll(identity.public_key, now=START - 60, serial=1).raw
    auth = packet_authenticator(identity, cert, AUTHORITY.public_key)
    return _AuthCodec(auth, 1 << 20, clock=clock.monotonic, realtime=clock.real)


def send(sender: _AuthCodec, to: tuple[str, int], receiver: _AuthCodec, source: tuple[str, int]):
    """Seal at `sender`, open at `receiver`: the payload, or None if it was refused."""
    sealed = sender.seal(to, b"\x01payload", False)
    return receiver.open(Incoming(source, sealed, False, URGENT))


def lean(sender: _AuthCodec, to: tuple[str, int], receiver: _AuthCodec, source: tuple[str, int]):
    """Whether a packet went without the certificate, and opened."""
    without = sender.datagrams_without_certificate
    opened = send(sender, to, receiver, source)
    return opened == b"\x01payload" and sender.datagrams_without_certificate == without + 1


def drain(alice: _AuthCodec, bob: _AuthCodec) -> None:
    """Use up the packets of any open introduction, both ways."""
    for _ in range(2 * INTRODUCTION_PACKETS):
        assert send(alice, BOB_AT, bob, ALICE_AT) == b"\x01payload"
        assert send(bob, ALICE_AT, alice, BOB_AT) == b"\x01payload"


def test_certificate_only_while_a_peer_may_not_know_us() -> None:
    clock = Clock()
    alice, bob = codec(ALICE, clock), codec(BOB, clock)
    alice.recipients[BOB_AT] = BOB.node_id
    bob.recipients[ALICE_AT] = ALICE.node_id
    # They just met (the node introduces on MemberJoined): both carry the certificate.
    alice.introductions.introduce(BOB.node_id, clock.now)
    bob.introductions.introduce(ALICE.node_id, clock.now)
    for _ in range(INTRODUCTION_PACKETS):
        assert send(alice, BOB_AT, bob, ALICE_AT) == b"\x01payload"
        assert send(bob, ALICE_AT, alice, BOB_AT) == b"\x01payload"
    assert alice.datagrams_with_certificate == INTRODUCTION_PACKETS
    assert alice.datagrams_without_certificate == 0
    # Later, once the introductions ran out (time, and packets: the first packet each
    # heard from the other opened one too), the envelopes go without it, and open.
    clock.now += 3600
    drain(alice, bob)
    assert lean(alice, BOB_AT, bob, ALICE_AT) and lean(bob, ALICE_AT, alice, BOB_AT)

    # Alice restarts: she forgot Bob's certificate. Bob cannot know until he hears from
    # her; a packet of his sent without it now would be refused ...
    clock.now += 2
    alice = codec(ALICE, clock)
    alice.recipients[BOB_AT] = BOB.node_id
    assert send(bob, ALICE_AT, alice, BOB_AT) is None
    assert alice.auth.drops.as_dict()["unknown_sender"] == 1
    # ... but her first packet (without her certificate: he still has it cached) starts
    # a new session, so his next packets carry his certificate again, and open.
    assert lean(alice, BOB_AT, bob, ALICE_AT)
    with_before = bob.datagrams_with_certificate
    assert send(bob, ALICE_AT, alice, BOB_AT) == b"\x01payload"
    assert bob.datagrams_with_certificate == with_before + 1
    # Once the introduction is over, back to lean envelopes.
    clock.now += INTRODUCTION_SECONDS
    drain(alice, bob)
    assert lean(bob, ALICE_AT, alice, BOB_AT)


def test_an_ack_ends_the_introduction_at_once() -> None:
    """A peer that acks our probe read it, so it holds our certificate: stop sending it."""
    from swim import wire

    clock = Clock()
    alice, bob = codec(ALICE, clock), codec(BOB, clock)
    alice.recipients[BOB_AT] = BOB.node_id
    bob.recipients[ALICE_AT] = ALICE.node_id
    alice.introductions.introduce(BOB.node_id, clock.now)
    ping = wire.encode(wire.Ping(1, BOB.node_id, ALICE.node_id, ALICE_AT))
    assert bob.open(Incoming(ALICE_AT, alice.seal(BOB_AT, ping, False), False, URGENT)) == ping
    assert alice.datagrams_with_certificate == 1
    # Not an ack (gossip only): the introduction goes on.
    assert send(bob, ALICE_AT, alice, BOB_AT) == b"\x01payload"
    assert send(alice, BOB_AT, bob, ALICE_AT) == b"\x01payload"
    assert alice.datagrams_with_certificate == 2
    ack = wire.encode(wire.Ack(1), wire.Left("x" * 16, 1))
    assert alice.open(Incoming(BOB_AT, bob.seal(ALICE_AT, ack, False), False, URGENT)) == ack
    assert lean(alice, BOB_AT, bob, ALICE_AT)  # well inside the 5 s and 3 packets


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
    alice, bob = codec(ALICE, Clock()), codec(BOB, bob_clock)
    watch = SkewWatch()
    alice.set_stale_handler(watch.observe)
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
    bob_watch = SkewWatch()
    bob.set_stale_handler(bob_watch.observe)
    assert send(alice, BOB_AT, bob, ALICE_AT) is None
    assert bob_watch.notices() == [
        "packets from 10.0.0.1 are 600 s in the past: check its clock (NTP)"
    ]


def test_skew_within_the_freshness_window_is_not_reported() -> None:
    from populi_p2p.services.clock import SkewWatch

    alice, bob = codec(ALICE, Clock()), codec(BOB, SkewedClock(5.0))
    watch = SkewWatch()
    alice.set_stale_handler(watch.observe)
    assert send(bob, ALICE_AT, alice, BOB_AT) == b"\x01payload"
    assert watch.notices() == []
