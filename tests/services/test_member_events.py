"""`services._member_events`: which events are about another member, and the loop that
reads events beside a periodic check."""

from __future__ import annotations

import functools

import trio
import trio.testing

from populi_p2p.services._member_events import other_member, serve_events
from swim import AppMessage, Event, Member, MemberFailed, MemberJoined, MemberState, SelfRefuted

ME = Member("me", ("10.0.0.1", 7946), MemberState.ALIVE, 1)
PEER = Member("peer", ("10.0.0.2", 7946), MemberState.ALIVE, 1)


def test_other_member_is_none_for_our_own_events_and_app_messages() -> None:
    assert other_member(MemberJoined(PEER), "me") is PEER
    assert other_member(MemberFailed(PEER), "me") is PEER
    assert other_member(MemberJoined(ME), "me") is None
    assert other_member(SelfRefuted(2), "me") is None
    assert other_member(AppMessage("peer", "k", b"v"), "me") is None


async def test_events_in_order_and_checks_on_schedule(
    autojump_clock: trio.testing.MockClock,
) -> None:
    send, receive = trio.open_memory_channel[Event](10)
    seen: list[Event] = []
    checks: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(
            functools.partial(
                serve_events, receive, seen.append, every=5.0,
                check=lambda: checks.append(trio.current_time()),
            )
        )  # fmt: skip
        start = trio.current_time()
        await send.send(MemberJoined(PEER))
        await send.send(MemberFailed(PEER))
        await trio.sleep(12.0)
        assert seen == [MemberJoined(PEER), MemberFailed(PEER)]
        assert [t - start for t in checks] == [5.0, 10.0]
        await send.aclose()  # the subscription closes: the checks go on
        await trio.sleep(10.0)
        assert [t - start for t in checks] == [5.0, 10.0, 15.0, 20.0]
        nursery.cancel_scope.cancel()
