"""`swim._core`: the bottom layer's own upkeep (validation, random choice, the gossip
grid, packets within a budget, where replies go), on a single core."""

from __future__ import annotations

import random
from collections import Counter

import attrs
import pytest

from swim import Member, Membership, MemberState, Send, SharedView
from swim.wire import (
    INCARNATION_MAX,
    Alive,
    Dead,
    Ping,
    Suspect,
    decode_packet,
    encode,
    encode_message,
)

from .helpers import TEST_CONFIG

SOURCE = ("10.9.9.9", 1)


def core(members: int = 0, seed: int = 4, **config: object) -> Membership:
    settings = attrs.evolve(TEST_CONFIG, **config)  # type: ignore[arg-type]
    c = Membership(settings, "me", ("10.0.0.1", 1), random.Random(seed), 0.0)
    if members:
        c.receive(
            SOURCE,
            encode(
                *(Alive(f"m{i}", 0, (f"10.1.{i // 250}.{i % 250}", 1), b"") for i in range(members))
            ),
            0.0,
        )
    return c


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"meta": b"x" * (TEST_CONFIG.meta_size_max + 1)}, "over meta_size_max"),
        ({"incarnation": -1}, "incarnation must be in 0.."),
        ({"incarnation": INCARNATION_MAX + 1}, "incarnation must be in 0.."),
    ],
)
def test_the_constructor_says_what_is_wrong(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Membership(TEST_CONFIG, "me", ("h", 1), random.Random(0), 0.0, **kwargs)  # type: ignore[arg-type]


def test_num_alive_counts_us_alive_and_suspect_only() -> None:
    c = core(members=4)
    c.receive(SOURCE, encode(Suspect("m0", 0, "m1"), Dead("m2", 0, "m1")), 0.0)
    assert c.num_alive() == 1 + 3
    assert c.num_members() == 5


@pytest.mark.parametrize("members", [10, 100])  # the filtering and the sampling path
def test_random_nodes_are_distinct_and_never_us_or_the_excluded(members: int) -> None:
    c = core(members=members)
    c.receive(SOURCE, encode(Dead("m1", 0, "x"), Suspect("m2", 0, "x")), 0.0)
    seen: Counter[str] = Counter()
    for _ in range(200):
        picked = [n.name for n in c._random_nodes(3, "m3", gossip=False)]
        assert len(picked) == len(set(picked)) == 3
        assert not {"me", "m3", "m1", "m2"} & set(picked)  # alive only
        seen.update(picked)
    assert len(seen) > members // 2  # spread, not stuck on a few
    gossip = {n.name for _ in range(400) for n in c._random_nodes(3, None, gossip=True)}
    assert {"m1", "m2"} <= gossip  # gossip also reaches the suspect and the dead
    assert c._random_nodes(0, None, gossip=True) == []


def test_random_nodes_gives_all_when_fewer_than_asked() -> None:
    c = core(members=2)
    assert sorted(n.name for n in c._random_nodes(5, None, gossip=False)) == ["m0", "m1"]


@pytest.mark.parametrize("now", [0.0, 0.01, 0.33, 1.0, 7.77])
def test_the_gossip_grid_is_phase_plus_whole_intervals(now: float) -> None:
    c = core()
    phase, interval = c._gossip_phase, TEST_CONFIG.gossip_interval
    at = c._gossip_time_after(now, strictly=False)
    assert at >= now and at - now < interval + 1e-9
    if now >= phase:
        steps = (at - phase) / interval
        assert abs(steps - round(steps)) < 1e-6
    assert c._gossip_time_after(at, strictly=False) == at
    assert c._gossip_time_after(at, strictly=True) > at


def test_a_packet_piggybacks_queued_updates_up_to_the_budget() -> None:
    c = core(members=30)
    out: list[object] = []
    ping = encode_message(Ping(1, "m0", "me", ("10.0.0.1", 1)))
    size = c._send_packet(("h", 1), ping, out)  # type: ignore[arg-type]
    [send] = out
    assert isinstance(send, Send) and not send.reliable
    assert size == len(send.payload) <= TEST_CONFIG.packet_budget
    messages = list(decode_packet(send.payload))
    assert messages[0] == Ping(1, "m0", "me", ("10.0.0.1", 1))
    assert any(isinstance(m, Alive) for m in messages[1:])  # rumors rode along
    # A budget below the packet's own message: nothing is sent.
    out.clear()
    assert c._send_packet(("h", 1), ping, out, budget=len(ping)) == 0  # type: ignore[arg-type]
    assert out == []
    # A budget just over it: the ping alone (or with what fits), never over.
    budget = len(send.payload) // 2
    c._send_packet(("h", 1), ping, out, budget=budget)  # type: ignore[arg-type]
    assert isinstance(out[0], Send) and 0 < len(out[0].payload) <= budget


def test_a_reply_in_another_members_name_is_refused() -> None:
    c = core(members=1)
    c._sender = "m0"
    assert c._reply_route("m0", ("10.1.0.0", 1)) is not None
    assert c._reply_route("someone-else", ("10.1.0.0", 1)) is None
    assert c.statistics().replies_refused == 1


def test_a_shared_record_is_copied_before_a_change() -> None:
    members = [Member("me", ("10.0.0.1", 1), MemberState.ALIVE, 0, b"", 0.0)] + [
        Member(f"m{i}", ("h", i), MemberState.ALIVE, 0, b"", 0.0) for i in range(3)
    ]
    view = SharedView(members, 0.0)
    c = core()
    c.prime(view, 0.0)
    c.receive(SOURCE, encode(Suspect("m0", 0, "m1")), 0.0)
    assert view.nodes["m0"].state is MemberState.ALIVE  # the shared one is untouched
    assert c.member("m0").state is MemberState.SUSPECT  # type: ignore[union-attr]
    assert c._members["m1"] is view.nodes["m1"]  # the unchanged ones still shared
