"""PathHealth: a blocked path is an episode of silence, judged only on traffic that
expects an answer."""

from __future__ import annotations

from overlay.peerpaths import PathHealth

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
