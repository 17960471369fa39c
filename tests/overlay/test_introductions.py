"""When the envelope carries our certificate: only while a peer may not know us."""

from __future__ import annotations

from overlay.introductions import INTRODUCTION_PACKETS, INTRODUCTION_SECONDS, Introductions

P = "p" * 16
Q = "q" * 16


def decisions(intro: Introductions, node_id: str | None, n: int, now: float) -> list[bool]:
    return [intro.include(node_id, False, now) for _ in range(n)]


def test_a_known_peer_gets_no_certificate() -> None:
    intro = Introductions()
    assert decisions(intro, P, 3, 0.0) == [False] * 3
    assert (intro.with_certificate, intro.without_certificate) == (0, 3)


def test_unknown_addresses_and_streams_always_get_it() -> None:
    intro = Introductions()
    assert decisions(intro, None, 3, 0.0) == [True] * 3
    assert intro.include(P, True, 0.0)
    assert not intro.include(P, False, 0.0)


def test_an_introduction_lasts_its_time_and_its_packets() -> None:
    intro = Introductions()
    intro.introduce(P, 100.0)
    # Many packets early on: the time keeps it open.
    assert decisions(intro, P, 10, 100.0) == [True] * 10
    assert not intro.include(Q, False, 100.0)  # only for P
    assert not intro.include(P, False, 100.0 + INTRODUCTION_SECONDS)
    # Nothing sent for a long while: the packet count keeps it open.
    intro.introduce(P, 200.0)
    late = 200.0 + 10 * INTRODUCTION_SECONDS
    assert decisions(intro, P, INTRODUCTION_PACKETS + 1, late) == [True] * (
        INTRODUCTION_PACKETS
    ) + [False]


def test_members_in_doubt_get_it_until_they_are_not() -> None:
    intro = Introductions()
    intro.doubt(P, True)
    assert decisions(intro, P, 3, 0.0) == [True] * 3
    intro.doubt(P, False)
    assert not intro.include(P, False, 0.0)


def test_after_a_refute_everybody_gets_it_for_a_while() -> None:
    intro = Introductions()
    intro.introduce_to_everyone(10.0)
    assert intro.include(P, False, 10.0) and intro.include(Q, False, 14.9)
    assert not intro.include(Q, False, 10.0 + INTRODUCTION_SECONDS)


def test_prune_keeps_state_bounded_by_the_members() -> None:
    intro = Introductions()
    for i in range(100):
        intro.introduce(f"{i:016d}", 0.0)
        intro.doubt(f"{i:016d}", True)
    assert len(intro) == 200
    keep = {f"{i:016d}" for i in range(10)}
    intro.prune(keep, 1.0)
    assert len(intro) == 20
    # Over (time passed, packets sent): gone even for members.
    for node_id in sorted(keep):
        intro.doubt(node_id, False)
        decisions(intro, node_id, INTRODUCTION_PACKETS, 1.0)
    intro.prune(keep, 1.0 + INTRODUCTION_SECONDS)
    assert len(intro) == 0
