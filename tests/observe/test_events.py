"""`EventService`: the ring is bounded, subscribers get every event once, slow ones lose."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.observe.events import EventService, membership_event
from swim import (
    AppMessage,
    Member,
    MemberFailed,
    MemberJoined,
    MemberState,
    SelfRefuted,
)

ALICE = Member("n-alice", ("127.0.0.1", 7946), MemberState.ALIVE, 3)


@given(capacity=st.integers(1, 50), n=st.integers(0, 120))
def test_ring_keeps_the_last_capacity_events_in_order(capacity: int, n: int) -> None:
    events = EventService(capacity, clock=lambda: 100.0)
    for i in range(n):
        events.publish("test.kind", f"event {i}", i=i)
    recent = events.recent()
    assert [e["i"] for e in recent] == list(range(max(0, n - capacity), n))
    assert [e["seq"] for e in recent] == [i + 1 for i in range(max(0, n - capacity), n)]
    assert events.counts.get("test.kind", 0) == n
    for e in recent:
        json.dumps(e)  # JSON-able


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        EventService(0)


async def test_subscriber_gets_buffered_then_live_without_gap_and_slow_ones_lose() -> None:
    events = EventService(10, clock=lambda: 1.0)
    events.publish("a", "first")
    recent, channel = events.subscribe(max_buffer=2)
    assert [e["message"] for e in recent] == ["first"]
    for i in range(4):
        events.publish("b", f"live {i}")  # never blocks, even with a full subscriber
    got = [channel.receive_nowait()["message"] for _ in range(2)]
    assert got == ["live 0", "live 1"]
    assert events.dropped == 2
    with pytest.raises(trio.WouldBlock):
        channel.receive_nowait()
    # A closed subscriber is forgotten, not an error.
    await channel.aclose()
    events.publish("c", "after close")
    assert events.dropped == 2


def test_membership_events_become_feed_events() -> None:
    joined = membership_event(MemberJoined(ALICE), lambda nid: "alice")
    assert joined == {
        "kind": "member.joined", "message": "alice joined", "node_id": "n-alice",
        "name": "alice", "state": "alive", "incarnation": 3,
    }  # fmt: skip
    dead = membership_event(MemberFailed(ALICE), str)
    assert dead is not None and dead["kind"] == "member.dead"
    refuted = membership_event(SelfRefuted(7), str)
    assert refuted is not None and refuted["incarnation"] == 7
    assert membership_event(AppMessage("x", "k", b""), str) is None


async def test_run_translates_a_membership_channel(nursery: trio.Nursery) -> None:
    events = EventService(10, clock=lambda: 1.0)
    send, receive = trio.open_memory_channel[object](10)
    await nursery.start(events.run, receive)
    await send.send(MemberJoined(ALICE))
    await send.send(AppMessage("x", "k", b""))
    await send.send(MemberFailed(ALICE))
    await send.aclose()
    await trio.testing.wait_all_tasks_blocked()
    assert [e["kind"] for e in events.recent()] == ["member.joined", "member.dead"]


async def test_close_ends_every_subscriber_and_later_ones_get_the_buffer() -> None:
    events = EventService(10, clock=lambda: 1.0)
    events.publish("a", "before")
    _, channel = events.subscribe()
    events.close()
    with pytest.raises(trio.EndOfChannel):
        await channel.receive()
    recent, late = events.subscribe()
    assert [e["message"] for e in recent] == ["before"]
    with pytest.raises(trio.EndOfChannel):
        await late.receive()
    events.publish("b", "after")  # still recorded for the metrics, never an error
    assert events.counts["b"] == 1
