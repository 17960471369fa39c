"""The packet envelope: forged, replayed, stale, oversized and junk packets are refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import populi_p2p.trust.identity
from overlay.auth import AUTH_REASONS, BASE_OVERHEAD, AuthError, PacketAuthenticator
from populi_p2p.trust.authority import ClusterAuthority, generate_cluster_secret
from populi_p2p.trust.envelope_keys import packet_authenticator
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.revocation import RevocationList

from .auth_cluster import ALICE, AUTHORITY, BOB, CAROL, CERTS, NOW, make_authenticator


def envelope(
    sender: NodeIdentity, cert: bytes | None, payload: bytes, now: float, counter: int
) -> bytes:
    """Build a plain envelope by hand, byte by byte as docs/security.md describes it."""
    flags = 0x01 if cert is not None else 0x00
    body = bytes([0x01, flags]) + sender.public_key
    body += int(now * 1_000_000).to_bytes(8, "big") + counter.to_bytes(8, "big")
    if cert is not None:
        body += len(cert).to_bytes(2, "big") + cert
    body += payload
    return body + sender.sign(b"populi/packet/v1", body)


def test_wire_layout_is_as_documented(alice: PacketAuthenticator) -> None:
    packet = alice.seal(b"payload", NOW)
    assert packet == envelope(ALICE, CERTS[ALICE.node_id], b"payload", NOW, alice.last_counter or 0)
    assert alice.last_counter == int(NOW * 1_000_000)  # the first counter is the clock in us
    second = alice.seal(b"", NOW, include_certificate=False)
    assert second == envelope(ALICE, None, b"", NOW, int(NOW * 1_000_000) + 1)


def refused(auth: PacketAuthenticator, packet: bytes, now: float = NOW, **kw: object) -> str:
    with pytest.raises(AuthError) as info:
        auth.open(packet, now, **kw)  # type: ignore[arg-type]
    return info.value.reason


def test_round_trip(alice: PacketAuthenticator, bob: PacketAuthenticator) -> None:
    packet = alice.seal(b"ping", NOW)
    opened = bob.open(packet, NOW + 0.01)
    assert (opened.sender_node_id, opened.sender_public_key, opened.payload) == (
        ALICE.node_id,
        ALICE.public_key,
        b"ping",
    )
    assert opened.certificate.scope == "member" and not opened.addressed
    assert abs(opened.sent_at - NOW) < 1e-6
    assert len(packet) == 4 + alice.overhead()
    assert bob.drops.total == 0


def test_overheads(alice: PacketAuthenticator) -> None:
    cert_len = len(CERTS[ALICE.node_id])
    assert BASE_OVERHEAD == 114
    assert alice.overhead(include_certificate=False) == 114
    assert alice.overhead() == 114 + 2 + cert_len
    boxed = make_authenticator(ALICE, cluster_secret=b"k" * 32)
    assert boxed.overhead() == 114 + 2 + cert_len + 41
    assert len(boxed.seal(b"x" * 100, NOW)) == 100 + boxed.overhead()
    assert len(alice.seal(b"", NOW, include_certificate=False)) == 114


def test_forged_packets(alice: PacketAuthenticator, bob: PacketAuthenticator) -> None:
    packet = bytearray(alice.seal(b"alive incarnation 3", NOW))
    packet[-70] ^= 1  # change one payload byte
    assert refused(bob, bytes(packet)) == "bad_signature"
    # Carol tries to speak as Alice: Alice's key and certificate, Carol's signature.
    body = bytes(packet[:-64])
    forged = body + CAROL.sign(b"populi/packet/v1", body)
    assert refused(bob, forged) == "bad_signature"
    # Carol presents Alice's certificate with her own key, correctly signed by Carol.
    forged = envelope(CAROL, CERTS[ALICE.node_id], b"x", NOW, 1)
    assert refused(bob, forged) == "bad_certificate"
    assert bob.drops["bad_signature"] == 2 and bob.drops["bad_certificate"] == 1
    # And nothing was remembered: Alice's genuine packets still get through.
    assert bob.open(alice.seal(b"ok", NOW), NOW).payload == b"ok"


def test_replayed_packet(alice: PacketAuthenticator, bob: PacketAuthenticator) -> None:
    packet = alice.seal(b"suspect x", NOW)
    bob.open(packet, NOW)
    assert refused(bob, packet, NOW + 1) == "replayed"
    assert bob.drops["replayed"] == 1


def test_reordering_within_window_is_accepted(
    alice: PacketAuthenticator, bob: PacketAuthenticator
) -> None:
    packets = [alice.seal(bytes([i]), NOW) for i in range(100)]
    for i in [5, 0, 99, 50, 1, 98, 2, 3, 4, *range(6, 50), *range(51, 98)]:
        assert bob.open(packets[i], NOW).payload == bytes([i])
    for p in packets:
        assert refused(bob, p) == "replayed"


def test_outside_window_is_rejected() -> None:
    sender, receiver = make_authenticator(ALICE), make_authenticator(BOB, replay_window=64)
    old = sender.seal(b"old", NOW)
    for _ in range(63):
        sender.seal(b"lost", NOW)
    edge = sender.seal(b"edge", NOW)  # 64 counters above `old`
    receiver.open(edge, NOW)
    assert refused(receiver, old) == "replayed"
    receiver2 = make_authenticator(BOB, replay_window=65)
    receiver2.open(edge, NOW)
    assert receiver2.open(old, NOW).payload == b"old"  # just inside a wider window


def test_stale_and_future_timestamps(alice: PacketAuthenticator) -> None:
    bob = make_authenticator(BOB, freshness=120)
    assert refused(bob, alice.seal(b"x", NOW - 121)) == "stale"
    assert refused(bob, alice.seal(b"x", NOW + 121)) == "stale"
    assert bob.open(alice.seal(b"x", NOW - 119), NOW).payload == b"x"


def test_restarted_sender_is_accepted(bob: PacketAuthenticator) -> None:
    before = make_authenticator(ALICE)
    for i in range(1000):
        bob.open(before.seal(b"%d" % i, NOW), NOW)
    # Same key, new process, one second later: counters reseeded from the clock.
    after = make_authenticator(ALICE)
    assert bob.open(after.seal(b"back", NOW + 1), NOW + 1).payload == b"back"
    # A packet from the earlier run is still a replay.
    assert refused(bob, before.seal(b"late", NOW + 1), NOW + 1) == "replayed"


def test_opened_says_when_a_sender_starts_a_new_session(bob: PacketAuthenticator) -> None:
    # An hour-old run of alice: her counter was seeded from her clock an hour ago.
    old = make_authenticator(ALICE)
    old.seal(b"first of the run", NOW - 3600)
    assert bob.open(old.seal(b"hello", NOW), NOW).new_session  # we never heard of her
    assert not bob.open(old.seal(b"again", NOW + 0.5), NOW + 0.5).new_session
    # Silent for an hour (longer than any replay window lasts): the same session.
    assert not bob.open(old.seal(b"still me", NOW + 3600), NOW + 3600).new_session
    # She restarts (two seconds later): she may have forgotten us, and Opened says so.
    new = make_authenticator(ALICE)
    assert bob.open(new.seal(b"back", NOW + 3602), NOW + 3602).new_session
    assert not bob.open(new.seal(b"steady", NOW + 3603), NOW + 3603).new_session


def test_counter_floor_survives_a_clock_step_back(bob: PacketAuthenticator) -> None:
    before = make_authenticator(ALICE)
    bob.open(before.seal(b"a", NOW), NOW)
    stepped = make_authenticator(ALICE)  # clock now 10 s behind: refused
    assert refused(bob, stepped.seal(b"b", NOW - 10), NOW) == "replayed"
    persisted = make_authenticator(ALICE, counter_floor=before.last_counter + 1)  # type: ignore[operator]
    assert bob.open(persisted.seal(b"c", NOW - 10), NOW).payload == b"c"


def test_too_large(alice: PacketAuthenticator, bob: PacketAuthenticator) -> None:
    packet = alice.seal(b"x" * 1400, NOW)
    assert refused(bob, packet) == "too_large"
    assert bob.open(packet, NOW, max_size=1 << 20).payload == b"x" * 1400  # a TCP frame


def test_unknown_sender_then_cached(alice: PacketAuthenticator, bob: PacketAuthenticator) -> None:
    bare = alice.seal(b"no cert", NOW, include_certificate=False)
    assert refused(bob, bare) == "unknown_sender"
    bob.open(alice.seal(b"with cert", NOW), NOW)
    assert (
        bob.open(alice.seal(b"no cert", NOW, include_certificate=False), NOW).payload == b"no cert"
    )


def test_steady_stream_costs_one_signature_check(
    alice: PacketAuthenticator, bob: PacketAuthenticator, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"packet": 0, "certificate": 0}
    real = populi_p2p.trust.identity.verify_signature

    def counting(kind: str):  # type: ignore[no-untyped-def]
        def verify(*args):  # type: ignore[no-untyped-def]
            calls[kind] += 1
            return real(*args)

        return verify

    monkeypatch.setattr("populi_p2p.trust.envelope_keys.verify_signature", counting("packet"))
    monkeypatch.setattr("populi_p2p.trust.certificate.verify_signature", counting("certificate"))
    for i in range(50):
        bob.open(alice.seal(b"%d" % i, NOW), NOW)
    assert calls == {"packet": 50, "certificate": 1}


def test_wrong_authority_and_revoked(alice: PacketAuthenticator) -> None:
    rogue = ClusterAuthority.from_seed(b"R" * 32)
    outsider = NodeIdentity.from_seed(b"o" * 32)
    rogue_auth = packet_authenticator(
        outsider, rogue.enroll(outsider.public_key, now=NOW).raw, rogue.public_key
    )
    bob = make_authenticator(BOB)
    assert refused(bob, rogue_auth.seal(b"let me in", NOW)) == "bad_certificate"
    bob.open(alice.seal(b"before", NOW), NOW)  # cached
    bob.verifier.update_revocations(  # type: ignore[attr-defined]
        RevocationList().with_revocation(
            AUTHORITY.revoke(now=NOW, node_public_key=ALICE.public_key)
        )
    )
    assert refused(bob, alice.seal(b"after", NOW)) == "revoked"
    assert refused(bob, alice.seal(b"after", NOW, include_certificate=False)) == "revoked"


def test_scope_and_expiry() -> None:
    observer = NodeIdentity.from_seed(b"w" * 32)
    cert = AUTHORITY.enroll(observer.public_key, "observer", 100, now=NOW).raw
    sender = packet_authenticator(observer, cert, AUTHORITY.public_key)
    assert refused(make_authenticator(BOB), sender.seal(b"x", NOW)) == "bad_certificate"
    anyone = make_authenticator(BOB, required_scope=None)
    assert anyone.open(sender.seal(b"x", NOW), NOW).certificate.scope == "observer"
    assert refused(anyone, sender.seal(b"x", NOW + 100), NOW + 100) == "bad_certificate"  # expired


def test_addressed_packets_only_open_at_their_recipient(
    alice: PacketAuthenticator, bob: PacketAuthenticator
) -> None:
    carol = make_authenticator(CAROL)
    packet = alice.seal(b"ping", NOW, recipient=BOB.node_id)
    assert refused(carol, packet) == "bad_signature"  # captured and replayed to Carol
    assert bob.open(packet, NOW).addressed
    with pytest.raises(ValueError):
        alice.seal(b"x", NOW, recipient="not-a-node-id")


def test_encryption() -> None:
    secret = generate_cluster_secret()
    alice = make_authenticator(ALICE, cluster_secret=secret)
    bob = make_authenticator(BOB, cluster_secret=secret)
    packet = alice.seal(b"secret gossip", NOW)
    assert b"secret gossip" not in packet and ALICE.public_key not in packet
    assert packet[0] == 0x02
    assert bob.open(packet, NOW).payload == b"secret gossip"
    # Wrong secret, no secret, and a plain packet into an encrypted cluster.
    assert (
        refused(make_authenticator(BOB, cluster_secret=generate_cluster_secret()), packet)
        == "decrypt_failed"
    )
    assert refused(make_authenticator(BOB), packet) == "decrypt_failed"
    assert refused(bob, make_authenticator(ALICE).seal(b"plain", NOW)) == "decrypt_failed"
    tampered = packet[:-1] + bytes([packet[-1] ^ 1])
    assert refused(make_authenticator(BOB, cluster_secret=secret), tampered) == "decrypt_failed"


def test_bad_version_and_flags(alice: PacketAuthenticator, bob: PacketAuthenticator) -> None:
    packet = alice.seal(b"x", NOW)
    assert refused(bob, b"\x07" + packet[1:]) == "bad_version"
    assert refused(bob, packet[:1] + b"\x80" + packet[2:]) == "malformed"
    assert refused(bob, b"") == "malformed"
    assert refused(bob, packet[:60]) == "malformed"
    # A certificate length that runs past the end.
    assert refused(bob, packet[:50] + struct.pack(">H", 5000) + packet[52:]) == "malformed"


def test_constructor_checks_own_certificate() -> None:
    with pytest.raises(ValueError, match="certificate is for node"):
        packet_authenticator(ALICE, CERTS[BOB.node_id], AUTHORITY.public_key)
    with pytest.raises(ValueError, match="cluster secret"):
        make_authenticator(ALICE, cluster_secret=b"short")


def test_replay_state_is_bounded() -> None:
    receiver = make_authenticator(BOB, max_senders=2, max_certificates=2)
    senders = [make_authenticator(n) for n in (ALICE, CAROL)]
    extra = NodeIdentity.from_seed(b"d" * 32)
    senders.append(
        packet_authenticator(
            extra, AUTHORITY.enroll(extra.public_key, now=NOW).raw, AUTHORITY.public_key
        )
    )
    first = senders[0].seal(b"0", NOW)
    receiver.open(first, NOW)
    for s in senders[1:]:
        receiver.open(s.seal(b"x", NOW), NOW)
    stats = receiver.statistics()
    assert (stats.senders, stats.certificates) == (2, 2)
    assert len(receiver._sessions) == 2  # restart detection state: bounded the same way
    # Alice was evicted, but her old packet is still refused (the eviction floor).
    assert refused(receiver, first) == "replayed"


_RECEIVERS = {
    "plain": make_authenticator(BOB),
    "secret": make_authenticator(BOB, cluster_secret=b"s" * 32),
}
_ANY = st.binary(max_size=1500)


@pytest.mark.parametrize("mode", sorted(_RECEIVERS))
@settings(max_examples=300, deadline=None)
@given(data=st.one_of(_ANY, _ANY.map(lambda b: b"\x01" + b), _ANY.map(lambda b: b"\x02" + b)))
def test_random_bytes_only_raise_auth_error(mode: str, data: bytes) -> None:
    receiver = _RECEIVERS[mode]
    before = receiver.drops.total
    assert refused(receiver, data) in AUTH_REASONS
    assert receiver.drops.total == before + 1


_SAMPLE = make_authenticator(ALICE).seal(b"alive member 7 incarnation 3", NOW)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_packets_only_raise_auth_error(data: st.DataObject) -> None:
    bob = make_authenticator(BOB)
    packet = bytearray(_SAMPLE)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(packet) - 1))
        packet[i] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(packet)))
    try:
        opened = bob.open(bytes(packet[:cut]) if data.draw(st.booleans()) else bytes(packet), NOW)
    except AuthError as exc:
        assert exc.reason in AUTH_REASONS
    else:  # only possible if the mutation hit no signed byte: the signature says so
        assert opened.payload == b"alive member 7 incarnation 3"
