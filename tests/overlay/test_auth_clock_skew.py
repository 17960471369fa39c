"""Clock skew is said, not silent (issue 7 §4): signed evidence of a member's offset."""

from __future__ import annotations

from unittest import mock

import pytest

import populi_p2p.trust.identity
from overlay.auth import DEFAULT_FRESHNESS, AuthError, PacketAuthenticator

from .auth_cluster import ALICE, CAROL, NOW, make_authenticator
from .test_auth_gate import forged


def stale(auth: PacketAuthenticator, packet: bytes, now: float = NOW) -> None:
    with pytest.raises(AuthError) as info:
        auth.open(packet, now, source="192.0.2.3")
    assert info.value.reason == "stale"


def test_a_member_ten_minutes_ahead_is_reported(bob: PacketAuthenticator) -> None:
    carol = make_authenticator(CAROL)
    for i in range(3):
        stale(bob, carol.seal(b"ping", NOW + 600 + i), NOW + i)
    (report,) = bob.clock_skews().values()
    assert report.node_id == CAROL.node_id and report.packets == 3
    assert report.offset == pytest.approx(600.0) and report.seen_at == NOW + 2
    assert report.describe() == (
        f"packets from {CAROL.node_id} are 600 s in the future: check its clock (NTP)"
    )
    assert bob.drops["stale"] == 3
    # Its clock is fixed: the next accepted packet clears the evidence.
    bob.open(carol.seal(b"ping", NOW + 3), NOW + 3)
    assert bob.clock_skews() == {}


def test_behind_is_reported_too(bob: PacketAuthenticator) -> None:
    alice = make_authenticator(ALICE)
    stale(bob, alice.seal(b"ping", NOW - 300))
    assert "300 s in the past" in bob.clock_skews()[ALICE.node_id].describe()


def test_forged_timestamps_blame_nobody(bob: PacketAuthenticator) -> None:
    """The timestamp is believed only once the signature verifies."""
    alice = make_authenticator(ALICE)
    bob.open(alice.seal(b"hello", NOW), NOW)
    for i in range(50):
        stale(bob, forged(ALICE, None, 10 + i, NOW + 3600))
    assert bob.clock_skews() == {}


def test_replayed_old_packets_cost_a_bounded_number_of_checks(bob: PacketAuthenticator) -> None:
    alice = make_authenticator(ALICE)
    old = [alice.seal(b"old", NOW - 1000 + i / 1000) for i in range(200)]
    real = populi_p2p.trust.identity.verify_signature
    with mock.patch("populi_p2p.trust.envelope_keys.verify_signature", side_effect=real) as checks:
        for packet in old:
            stale(bob, packet)
    assert checks.call_count <= 21  # the source's burst, then its rate
    assert bob.clock_skews()[ALICE.node_id].packets == checks.call_count


def test_allowed_skew_is_configurable() -> None:
    assert DEFAULT_FRESHNESS == 120.0
    tolerant = make_authenticator(ALICE, freshness=900.0)
    carol = make_authenticator(CAROL)
    assert tolerant.open(carol.seal(b"ping", NOW + 600), NOW).payload == b"ping"
    assert tolerant.clock_skews() == {}
