"""`LinkService`: the codec's map of member addresses, who is sent our certificate
again, and the warning when UDP seems blocked while TCP works."""

from __future__ import annotations

import logging

import pytest

from overlay.base import Address
from overlay.peerpaths import PathHealth
from populi_p2p.services.codec import AuthCodec
from populi_p2p.services.links import LinkService
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.envelope_keys import packet_authenticator
from populi_p2p.trust.identity import NodeIdentity
from swim import (
    AppMessage,
    Member,
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberState,
    MemberSuspected,
    MemberUpdated,
    SelfRefuted,
)

B: Address = ("10.0.0.2", 7946)
PEER = Member("peer", B, MemberState.ALIVE, 1)
ME = Member("me", ("10.0.0.1", 7946), MemberState.ALIVE, 1)


class Paths:
    """The transport as the link service sees it: its path health."""

    def __init__(self) -> None:
        self.paths = PathHealth()


def blocked_warnings(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if r.getMessage() == "udp.blocked")


def starve(paths: Paths, peer: Address) -> None:
    """Datagrams unanswered for 10 s while a TCP frame came back: "UDP seems blocked"."""
    for second in range(11):
        paths.paths.record_udp_sent(peer, float(second))
    paths.paths.record_tcp_received(peer)


def test_udp_blocked_is_warned_only_when_it_lasts_two_checks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    transport = Paths()
    links = LinkService("me", _codec(), transport, lambda _n: True)
    starve(transport, B)
    links.check()
    assert blocked_warnings(caplog) == 0  # one check: maybe a starved peer
    transport.paths.record_udp_received(B)  # it answered: it was
    links.check()
    starve(transport, B)
    links.check()
    assert blocked_warnings(caplog) == 0
    links.check()  # still blocked a check later: a firewall
    assert blocked_warnings(caplog) == 1
    links.check()
    assert blocked_warnings(caplog) == 1  # once per episode


def _codec() -> AuthCodec:
    authority = ClusterAuthority.from_seed(b"A" * 32)
    identity = NodeIdentity.from_seed(b"m" * 32)
    cert = authority.enroll(identity.public_key, now=1_700_000_000.0, serial=1).raw
    return AuthCodec(packet_authenticator(identity, cert, authority.public_key), 1 << 20)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def links_with(codec: AuthCodec, clock: Clock, held: set[str]) -> LinkService:
    return LinkService("me", codec, Paths(), held.__contains__, clock=clock)


def include(codec: AuthCodec, node: str, now: float) -> bool:
    return codec.introductions.include(node, False, now)


def test_a_member_event_maps_its_address_to_its_node_id() -> None:
    codec = _codec()
    links = links_with(codec, Clock(), {"peer"})
    links.on_event(MemberJoined(PEER))
    assert codec.recipients == {B: "peer"}
    moved = Member("peer", ("10.0.0.3", 7946), MemberState.ALIVE, 2)
    links.on_event(MemberUpdated(moved))
    assert codec.recipients[moved.address] == "peer"


def test_our_own_events_and_app_messages_change_nothing() -> None:
    codec = _codec()
    links = links_with(codec, Clock(), {"me"})
    links.on_event(MemberJoined(ME))
    links.on_event(AppMessage("peer", "k", b"v"))
    assert codec.recipients == {} and len(codec.introductions) == 0


@pytest.mark.parametrize("event", [MemberJoined, MemberUpdated])
def test_a_new_or_changed_member_is_introduced_to_us(event: type) -> None:
    codec = _codec()
    clock = Clock()
    links = links_with(codec, clock, {"peer"})
    links.on_event(event(PEER))
    assert include(codec, "peer", clock.now)  # our certificate rides along again
    codec.introductions.acknowledged("peer")
    assert not include(codec, "peer", clock.now)


def test_a_silent_member_gets_our_certificate_until_it_is_back_or_gone() -> None:
    codec = _codec()
    clock = Clock()
    links = links_with(codec, clock, {"peer"})
    for silent, then in ((MemberSuspected, MemberJoined), (MemberFailed, MemberLeft)):
        links.on_event(silent(PEER))
        assert include(codec, "peer", clock.now) and include(codec, "peer", clock.now)
        links.on_event(then(PEER))
        codec.introductions.acknowledged("peer")
        assert not include(codec, "peer", clock.now)


def test_a_refute_introduces_us_to_everyone(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    codec = _codec()
    clock = Clock()
    links = links_with(codec, clock, set())
    assert not include(codec, "anyone", clock.now)
    links.on_event(SelfRefuted(7))
    assert include(codec, "anyone", clock.now)
    assert [r.getMessage() for r in caplog.records] == ["self.refuted"]


def test_the_check_drops_introductions_of_forgotten_members() -> None:
    codec = _codec()
    clock = Clock()
    held = {"peer"}
    links = links_with(codec, clock, held)
    links.on_event(MemberSuspected(PEER))
    links.check()
    assert len(codec.introductions) == 1
    held.clear()  # the core forgot it
    links.check()
    assert len(codec.introductions) == 0
