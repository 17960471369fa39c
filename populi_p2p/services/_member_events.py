"""What the services that read membership events share: which events are about another
member, and the loop that reads events beside a periodic check.

`links`, `roster` and `memory` each own a subscription (`MembershipService.subscribe`);
this keeps their common prelude and loop in one place.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from swim import AppMessage, Event, Member, SelfRefuted

__all__ = ["other_member", "serve_events"]


def other_member(ev: Event, node_id: str) -> Member | None:
    """The member `ev` is about, or None when it is about no other member: our own
    refute (`SelfRefuted`), an application message (`AppMessage`), or ourselves."""
    if isinstance(ev, SelfRefuted | AppMessage):
        return None
    return None if ev.member.name == node_id else ev.member


async def serve_events(
    events: trio.MemoryReceiveChannel[Event],
    on_event: Callable[[Event], None],
    *,
    every: float,
    check: Callable[[], None],
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Hand each event to `on_event`, in order, and call `check` every `every` seconds
    until cancelled (the checks go on after the subscription closes). Started once
    both run."""

    async def periodically() -> None:
        while True:
            await trio.sleep(every)
            check()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(periodically)
        task_status.started()
        async for ev in events:
            on_event(ev)
