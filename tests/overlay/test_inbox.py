"""PriorityInbox: lanes in priority order, FIFO within, bounded by items and bytes; and
`classify_and_offer`, the one step from a socket to it."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from overlay.inbox import BULK, URGENT, Incoming, LaneLimit, PriorityInbox

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


def test_a_lane_that_falls_behind_serves_the_newest_first() -> None:
    """A starved daemon's FIFO answered every ping after its prober gave up, and read
    a suspicion of itself after it had become its death (a seed declared dead by 23
    members in a storm of 100). Behind by more than `newest_first_after`, the lane
    serves the newest packet first; caught up, FIFO again."""
    now = [0.0]
    inbox = PriorityInbox([LaneLimit(10, 1000, newest_first_after=0.2)], clock=lambda: now[0])
    for p in (b"old1", b"old2", b"old3"):
        inbox.offer(item(p, 0))
    now[0] = 0.1  # keeping up: first in, first out
    assert inbox.receive_nowait().payload == b"old1"
    now[0] = 1.0
    inbox.offer(item(b"fresh ping", 0))
    assert inbox.receive_nowait().payload == b"fresh ping"  # behind: newest first
    assert inbox.receive_nowait().payload == b"old3"
    assert inbox.receive_nowait().payload == b"old2"
    inbox.offer(item(b"a", 0))
    inbox.offer(item(b"b", 0))
    assert inbox.receive_nowait().payload == b"a"  # the backlog is gone: FIFO
    stats = inbox.statistics()
    assert stats.newest_first == (3,) and stats.delivered == (5,)


def test_a_full_newest_first_lane_drops_its_oldest_not_the_newcomer() -> None:
    now = [0.0]
    inbox = PriorityInbox(
        [LaneLimit(2, 10, newest_first_after=0.2), LaneLimit(2, 100)], clock=lambda: now[0]
    )
    for p in (b"1", b"2", b"3"):
        assert inbox.offer(item(p, 0))  # the lane holds 2: "1" makes room for "3"
    assert inbox.offer(item(b"0123456789", 0))  # the byte bound: both others go
    assert not inbox.offer(item(b"0123456789a", 0))  # bigger than the lane: refused
    for p in (b"x", b"y", b"z"):
        inbox.offer(item(p, 1))  # a FIFO lane refuses the newcomer, as before
    stats = inbox.statistics()
    assert stats.dropped_full == (4, 1) and stats.queued == (1, 2)
    assert inbox.receive_nowait().payload == b"0123456789"
    assert [inbox.receive_nowait().payload for _ in range(2)] == [b"x", b"y"]
    with pytest.raises(ValueError, match="newest_first_after"):
        LaneLimit(1, 1, newest_first_after=-1.0)


def test_classify_and_offer_is_the_one_step_to_the_inbox() -> None:
    """UDP and TCP both go through it (issue 8: the step was written twice)."""
    import overlay.tcp
    import overlay.udp
    from overlay.inbox import classify_and_offer

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
