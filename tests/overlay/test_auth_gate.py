"""Junk forged from a member's address never costs that member its packets (issue 7 §1).

Before the `AdmissionGate`, one bucket per source address was drained by every failed
packet, and a member's valid packets were then refused as `rate_limited` unchecked.
"""

from __future__ import annotations

import os
import random

import pytest

from overlay.admission import AdmissionGate, SourceRateLimiter
from overlay.auth import AuthError, PacketAuthenticator
from populi_p2p.trust.identity import NodeIdentity

from .auth_cluster import ALICE, BOB, CERTS, NOW, make_authenticator

VICTIM_IP = "192.0.2.7"


def forged(identity: NodeIdentity, cert: bytes | None, counter: int, now: float) -> bytes:
    """An envelope that claims `identity` but carries a signature made with another key."""
    flags = 0x01 if cert is not None else 0x00
    body = bytes([0x01, flags]) + identity.public_key
    body += int(now * 1_000_000).to_bytes(8, "big") + counter.to_bytes(8, "big")
    if cert is not None:
        body += len(cert).to_bytes(2, "big") + cert
    body += b"forged"
    return body + NodeIdentity.generate().sign(b"populi/packet/v1", body)


def flood(bob: PacketAuthenticator, packets: list[bytes], now: float) -> None:
    for packet in packets:
        with pytest.raises(AuthError):
            bob.open(packet, now, source=VICTIM_IP)


def test_random_junk_from_a_members_address_never_drops_its_packets(
    alice: PacketAuthenticator, bob: PacketAuthenticator
) -> None:
    bob.open(alice.seal(b"hello", NOW), NOW, source=VICTIM_IP)  # alice is known to bob
    rng = random.Random(7)
    flood(bob, [rng.randbytes(32) for _ in range(5000)], NOW + 0.5)
    assert bob.drops.total == 5000 and bob.drops["rate_limited"] == 0
    opened = bob.open(alice.seal(b"still here", NOW + 0.5), NOW + 0.5, source=VICTIM_IP)
    assert opened.payload == b"still here"


def test_forgeries_from_a_members_address_never_drop_its_packets(
    alice: PacketAuthenticator, bob: PacketAuthenticator
) -> None:
    """Forged certificates and signatures from the victim's address, even ones that claim
    the victim's own key: its next real packet still gets through."""
    bob.open(alice.seal(b"hello", NOW), NOW, source=VICTIM_IP)
    stranger = NodeIdentity.generate()
    junk = []
    for i in range(300):
        junk.append(forged(stranger, CERTS[ALICE.node_id], 1 + i, NOW))  # not its cert
        junk.append(forged(ALICE, None, 10**6 + i, NOW))  # claims alice, far off-window
        junk.append(forged(ALICE, None, (alice.last_counter or 0) + 1 + i, NOW))  # in window
    flood(bob, junk, NOW + 0.5)
    assert bob.drops["rate_limited"] > 0  # the cost of the junk was bounded
    assert bob.drops["bad_signature"] + bob.drops["bad_certificate"] > 0
    for step in range(3):
        packet = alice.seal(b"alive", NOW + 0.5 + step, recipient=BOB.node_id)
        assert bob.open(packet, NOW + 0.5 + step, source=VICTIM_IP).payload == b"alive"


def test_unknown_senders_are_limited_by_source_address(bob: PacketAuthenticator) -> None:
    """A stranger's forged certificates drain only its source's bucket, not a member's."""
    stranger = NodeIdentity.generate()
    packets = [forged(stranger, CERTS[ALICE.node_id], 1 + i, NOW) for i in range(100)]
    flood(bob, packets, NOW)
    limited = bob.drops["rate_limited"]
    assert limited >= 100 - 20 - 1  # the default burst is 20
    # A new member from another address is served at once.
    alice = make_authenticator(ALICE)
    assert bob.open(alice.seal(b"hi", NOW), NOW, source="192.0.2.99").payload == b"hi"


def test_a_known_senders_restart_gets_through_when_nobody_forges_it(
    bob: PacketAuthenticator,
) -> None:
    first = make_authenticator(ALICE)
    bob.open(first.seal(b"one", NOW), NOW, source=VICTIM_IP)
    restarted = make_authenticator(ALICE)  # its counter leaps to the clock 60 s later
    opened = bob.open(restarted.seal(b"two", NOW + 60), NOW + 60, source=VICTIM_IP)
    assert opened.payload == b"two"  # off-window, so it spent the (full) claimed budget


def test_gate_tiers() -> None:
    gate = AdmissionGate(unauthenticated=SourceRateLimiter(rate=1, burst=1), claimed_burst=1)
    key = os.urandom(32)
    assert gate.admit("ip", key, known=False, continues=False, now=0)
    gate.failed("ip", key, known=False, now=0)
    assert not gate.admit("ip", key, known=False, continues=False, now=0)
    assert gate.admit("ip", key, known=True, continues=False, now=0)  # other budget
    gate.failed("ip", key, known=True, now=0)
    assert not gate.admit("ip", key, known=True, continues=False, now=0)
    assert gate.admit("ip", key, known=True, continues=True, now=0)  # never refused
    assert gate.admit(None, key, known=False, continues=False, now=0)
