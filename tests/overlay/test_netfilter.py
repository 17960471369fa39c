"""Pure pieces: AcceptPolicy, PriorityInbox, PathHealth, configs."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.base import format_address
from overlay.inbox import BULK, URGENT, Incoming, LaneLimit, PriorityInbox
from overlay.netfilter import LAN_CIDRS, AcceptPolicy, parse_cidr
from overlay.peerpaths import PathHealth
from overlay.tcp import TcpConfig
from overlay.transport import TransportConfig

################################################################################
# AcceptPolicy
################################################################################


def test_policy_accepts_only_its_ranges_both_families() -> None:
    p = AcceptPolicy.from_cidrs(["10.77.0.0/24", "fd77::/64"])
    assert p.allows("10.77.0.200") and p.allows("fd77::abcd")
    assert not p.allows("10.77.1.1") and not p.allows("fd78::1")
    assert not p.allows("127.0.0.1") and not p.allows("::1")
    assert p.allows("::ffff:10.77.0.5")  # IPv4-mapped is judged as IPv4
    assert not p.allows("not-an-address") and not p.allows("")
    assert p.describe() == "accepting 10.77.0.0/24, fd77::/64"


def test_policy_link_local_scope_and_lan_defaults() -> None:
    lan = AcceptPolicy.from_cidrs(LAN_CIDRS)
    assert lan.allows("fe80::1%eth0") and lan.allows("192.168.1.9") and lan.allows("::1")
    assert not lan.allows("8.8.8.8") and not lan.allows("2001:db8::1")
    assert not lan.allows("100.64.0.1")  # Tailscale's range is not "the LAN"


def test_policy_building() -> None:
    assert AcceptPolicy.from_cidrs(["10.77.0.3/24"]).cidrs == ("10.77.0.0/24",)
    assert AcceptPolicy.from_cidrs(["10.0.0.1"]).cidrs == ("10.0.0.1/32",)
    assert AcceptPolicy.from_cidrs(["fd77::/64", "10.0.0.0/8", "10.0.0.0/8"]).cidrs == (
        "10.0.0.0/8",
        "fd77::/64",
    )
    assert AcceptPolicy.from_cidrs([]).describe() == "accepting nothing"
    assert AcceptPolicy.allow_all().allows("203.0.113.7")
    grown = AcceptPolicy.from_cidrs(["10.0.0.0/8"]).with_cidrs(["192.168.0.0/16"])
    assert grown.allows("192.168.3.3") and grown.allows("10.1.1.1")
    assert AcceptPolicy.from_cidrs(["10.0.0.0/8"]) == AcceptPolicy.from_cidrs(["10.0.0.0/8"])


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "fd77::/129", "ten.zero", "10.0.0.0/8/8", ""])
def test_parse_cidr_rejects_with_one_line(bad) -> None:
    with pytest.raises(ValueError, match="not a CIDR range") as info:
        parse_cidr(bad)
    assert "\n" not in str(info.value)


@settings(max_examples=200, deadline=None)
@given(
    net=st.one_of(
        st.builds(
            lambda a, n: ipaddress.ip_network(f"{a}/{n}", strict=False),
            st.ip_addresses(v=4),
            st.integers(0, 32),
        ),
        st.builds(
            lambda a, n: ipaddress.ip_network(f"{a}/{n}", strict=False),
            st.ip_addresses(v=6),
            st.integers(0, 128),
        ),
    ),
    addr=st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)),
)
def test_policy_agrees_with_ipaddress(net, addr) -> None:
    policy = AcceptPolicy.from_cidrs([str(net)])
    mapped = addr.ipv4_mapped if addr.version == 6 else None
    addr_judged = mapped or addr  # ::ffff:a.b.c.d is judged as a.b.c.d, by design
    expected = addr_judged.version == net.version and addr_judged in net
    assert policy.allows(str(addr)) == expected
    assert policy.allows(str(addr)) == expected  # cached answer is the same


def test_policy_cache_is_bounded() -> None:
    p = AcceptPolicy.from_cidrs(["10.0.0.0/8"])
    for i in range(10_000):
        p.allows(f"192.0.{i // 256 % 256}.{i % 256}")
    assert len(p._cache) <= 4096


################################################################################
# PriorityInbox
################################################################################


def item(payload: bytes, lane: int = BULK) -> Incoming:
    return Incoming(("10.0.0.1", 1), payload, False, lane)


async def test_inbox_priority_fifo_and_close() -> None:
    inbox = PriorityInbox([LaneLimit(10, 1000), LaneLimit(10, 1000)])
    for p, lane in [(b"b1", BULK), (b"u1", URGENT), (b"b2", BULK), (b"u2", URGENT)]:
        assert inbox.offer(item(p, lane))
    assert [(await inbox.receive()).payload for _ in range(3)] == [b"u1", b"u2", b"b1"]
    inbox.close()
    assert not inbox.offer(item(b"late"))
    assert (await inbox.receive()).payload == b"b2"  # drained after close
    with pytest.raises(trio.EndOfChannel):
        await inbox.receive()
    assert [x async for x in inbox] == []
    stats = inbox.statistics()
    assert stats.accepted == (2, 2) and stats.delivered == (2, 2) and stats.queued == (0, 0)


async def test_inbox_wakes_a_waiting_consumer_and_close_wakes_it_too() -> None:
    inbox = PriorityInbox([LaneLimit(4, 100)])
    got: list[bytes] = []

    async def consume() -> None:
        async for x in inbox:
            got.append(x.payload)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        await trio.testing.wait_all_tasks_blocked()
        inbox.offer(item(b"a", 0))
        await trio.testing.wait_all_tasks_blocked()
        assert got == [b"a"]
        inbox.close()  # the consumer's loop ends; the nursery can exit
    assert got == [b"a"]


def test_inbox_limits_by_items_and_bytes() -> None:
    inbox = PriorityInbox([LaneLimit(2, 1000), LaneLimit(100, 10)])
    assert inbox.offer(item(b"x", 0)) and inbox.offer(item(b"y", 0))
    assert not inbox.offer(item(b"z", 0))  # item bound
    assert inbox.offer(item(b"12345", 1)) and inbox.offer(item(b"67890", 1))
    assert not inbox.offer(item(b"!", 1))  # byte bound
    stats = inbox.statistics()
    assert stats.dropped_full == (1, 1) and stats.queued_bytes == (2, 10)
    inbox.receive_nowait()
    assert inbox.offer(item(b"z", 0))  # room again
    with pytest.raises(ValueError, match="lane 2 out of range"):
        inbox.offer(item(b"bad", 2))
    with pytest.raises(ValueError):
        LaneLimit(0, 10)
    with pytest.raises(ValueError):
        PriorityInbox([])


################################################################################
# PathHealth
################################################################################


def test_path_health_is_bounded_and_ignores_strangers() -> None:
    h = PathHealth(max_peers=2)
    h.record_udp_received(("10.0.0.9", 1))  # never sent to: not tracked
    assert len(h) == 0 and h.get(("10.0.0.9", 1)) is None
    for i in range(3):
        h.record_udp_sent((f"10.0.0.{i}", 1), now=float(i))
    assert len(h) == 2 and h.get(("10.0.0.0", 1)) is None  # least recent evicted


def test_path_health_episode() -> None:
    h = PathHealth(udp_silence_threshold=2, udp_silence_min=1.0)
    peer = ("fd77::2", 7950)
    h.record_udp_sent(peer, now=0.0)
    h.record_tcp_connected(peer)
    assert not h.udp_seems_blocked(peer)
    h.record_udp_sent(peer, now=1.0)
    assert h.udp_seems_blocked(peer) and h.warn_udp_blocked_once(peer)
    assert not h.warn_udp_blocked_once(peer)
    h.record_udp_received(peer)  # UDP works again: episode over, warning re-armed
    assert not h.udp_seems_blocked(peer)
    h.record_udp_sent(peer, now=2.0)
    h.record_udp_sent(peer, now=3.0)
    h.record_tcp_failed(peer)
    assert not h.udp_seems_blocked(peer)  # TCP has not worked since
    h.record_tcp_received(peer)  # it answered on our connection
    assert h.warn_udp_blocked_once(peer)
    stats = h.get(peer)
    assert stats is not None and stats.tcp_failed == 1 and stats.udp_received == 1
    assert stats.udp_silent_for == 1.0
    assert h.blocked_peers() == [peer]


def test_cut_off_peer_gets_no_tcp_works_claim() -> None:
    """Issue 7 §7: writes into a pooled connection are not evidence that TCP works."""
    h = PathHealth()
    peer = ("10.0.0.2", 7950)
    h.record_udp_sent(peer, now=0.0)
    h.record_tcp_connected(peer)  # the connection opened while all was well...
    h.record_udp_received(peer)
    for second in range(1, 60):  # ...then everything is dropped, both ways
        h.record_udp_sent(peer, now=float(second))
        h.record_tcp_sent(peer)  # buffered by the kernel, never delivered
        h.record_tcp_failed(peer)  # a fresh connect times out
    assert not h.udp_seems_blocked(peer) and h.blocked_peers() == []


def test_one_slow_probe_is_not_a_blocked_path() -> None:
    """Issue 8: 100 daemons starting on 2 cores answer late; a handshake with a starved
    daemon's kernel plus a few unanswered probes is not "UDP blocked"."""
    h = PathHealth()
    peer = ("10.0.0.3", 7950)
    for second in range(4):  # probes every second, unanswered for 4 s
        h.record_udp_sent(peer, now=float(second))
        h.record_tcp_connected(peer)
    assert not h.udp_seems_blocked(peer)  # 4 datagrams, 3 s: too little
    for second in range(4, 8):
        h.record_udp_sent(peer, now=float(second))
    assert not h.udp_seems_blocked(peer)  # 8 datagrams, but only 7 s of silence
    h.record_udp_received(peer)  # the starved daemon caught up
    for second in range(8, 30):
        h.record_udp_sent(peer, now=float(second))
    assert not h.udp_seems_blocked(peer)  # silence again, but no TCP exchange in it
    h.record_tcp_connected(peer)
    assert h.udp_seems_blocked(peer)  # now the evidence is all there


def test_datagrams_that_expect_no_answer_never_make_udp_seem_blocked() -> None:
    """Issue 8: right after a cluster forms, a member gossips to a peer that by chance
    sends it nothing for half a minute, and a push-pull between them goes over TCP.
    Gossip expects no answer, so that is not "UDP blocked"; unanswered probes are."""
    h = PathHealth()
    peer = ("10.0.0.5", 7950)
    for second in range(60):
        h.record_udp_sent(peer, now=float(second), expects_answer=False)
    h.record_tcp_connected(peer)
    assert h.get(peer).udp_sent == 60  # counted all the same
    assert not h.udp_seems_blocked(peer) and not h.warn_udp_blocked_once(peer)
    for second in range(60, 72):  # now probes, unanswered for 11 s
        h.record_udp_sent(peer, now=float(second))
    h.record_tcp_connected(peer)
    assert h.udp_seems_blocked(peer)


def test_tcp_evidence_before_the_silence_does_not_count() -> None:
    h = PathHealth(udp_silence_threshold=1, udp_silence_min=0.0)
    peer = ("10.0.0.4", 7950)
    h.record_tcp_connected(peer)  # nothing unanswered yet: not part of any silence
    h.record_udp_sent(peer, now=0.0)
    assert not h.udp_seems_blocked(peer)


################################################################################
# Configs and helpers
################################################################################


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: TcpConfig(max_frame_size=0), "max_frame_size"),
        (lambda: TcpConfig(pool_size=0), "pool_size"),
        (lambda: TcpConfig(connect_timeout=0), "connect_timeout"),
        (lambda: TransportConfig(max_datagram_size=70000), "max_datagram_size"),
        (lambda: TransportConfig(bulk_queue_items=0), "queue limits"),
        (
            lambda: TransportConfig(queue_bytes=1000, tcp=TcpConfig(max_frame_size=2000)),
            "at least one frame",
        ),
    ],
)
def test_configs_validate(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_format_address() -> None:
    assert format_address(("10.0.0.1", 7950)) == "10.0.0.1:7950"
    assert format_address(("fd77::1", 7950)) == "[fd77::1]:7950"


def test_classify_and_offer_is_the_one_step_to_the_inbox() -> None:
    """UDP and TCP both go through it (issue 8: the step was written twice)."""
    import overlay.tcp
    import overlay.udp
    from overlay.inbox import LaneLimit, PriorityInbox, classify_and_offer

    inbox = PriorityInbox([LaneLimit(1, 100)])
    source = ("127.0.0.1", 1)
    assert classify_and_offer(inbox, lambda p: 1 // 0, source, b"x", reliable=False) == (
        "unclassified"
    )
    vouched: list[bool] = []
    outcome = classify_and_offer(
        inbox, lambda p: 0, source, b"x", reliable=True, vouch=lambda: vouched.append(True)
    )
    assert outcome == "queued"
    assert classify_and_offer(inbox, lambda p: 0, source, b"y", reliable=False) == "queue_full"
    item = inbox.receive_nowait()
    assert (item.payload, item.reliable, item.lane) == (b"x", True, 0)
    assert item.vouch is not None
    item.vouch()
    assert vouched == [True]
    for module in (overlay.udp, overlay.tcp):
        assert module.classify_and_offer is classify_and_offer
        source_text = Path(str(module.__file__)).read_text()
        assert "Incoming(" not in source_text  # nobody builds its own
