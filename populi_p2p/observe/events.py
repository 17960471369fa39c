"""The event service: what just happened in the mesh, as small JSON-able events.

Membership events (and GPU reports, and later task and route events) become plain
dicts ``{"seq", "time", "kind", "message", ...}``: `seq` is a per-node counter so a
reader can tell it missed some, `time` is realtime (for people; nothing orders by it).
The last `capacity` events are kept in a ring for late readers (the dashboard, ``GET
/events``, ``populi-node events``); every subscriber gets each new event through its own
bounded channel. A subscriber that falls `max_buffer` behind loses events (counted in
`dropped`) rather than holding up the node: this is a feed for eyes, not a log.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any, Final

import trio

from swim import (
    Event,
    IncarnationExhausted,
    Member,
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberRecovered,
    MemberSuspected,
    MemberUpdated,
    SelfRefuted,
)

__all__ = ["EVENT_BUFFER", "EVENT_SUBSCRIBER_BUFFER", "EventService", "membership_event"]

#: Recent events kept for a reader that connects later.
EVENT_BUFFER: Final = 256
#: Events one subscriber may fall behind before it starts losing them.
EVENT_SUBSCRIBER_BUFFER: Final = 256

_KINDS: Final[dict[type, tuple[str, str]]] = {
    MemberJoined: ("member.joined", "joined"),
    MemberUpdated: ("member.updated", "updated its record or address"),
    MemberSuspected: ("member.suspect", "is suspected"),
    MemberFailed: ("member.dead", "was declared dead"),
    MemberLeft: ("member.left", "left"),
    MemberRecovered: ("member.recovered", "is alive again"),
}


def membership_event(ev: Event, name_of: Callable[[Member], str]) -> dict[str, Any] | None:
    """The event fields for one membership event, or None for those not shown.

    `name_of` is given the member as the event carries it (its metadata, the signed
    record, included): the feed may read an event before the roster has.
    """
    if isinstance(ev, IncarnationExhausted):
        return {"kind": "self.exhausted", "message": "incarnation exhausted; new session"}
    if isinstance(ev, SelfRefuted):
        return {
            "kind": "self.refuted",
            "message": f"refuted a suspicion of us (incarnation {ev.incarnation})",
            "incarnation": ev.incarnation,
        }
    entry = _KINDS.get(type(ev))
    member = getattr(ev, "member", None)
    if entry is None or member is None:
        return None  # app messages: their own services report them
    kind, verb = entry
    name = name_of(member)
    return {
        "kind": kind,
        "message": f"{name} {verb}",
        "node_id": member.name,
        "name": name,
        "state": member.state.name.lower(),
        "incarnation": member.incarnation,
    }


class EventService:
    """A ring of recent events and a fan-out to subscribers.

    Args:
        capacity: how many recent events `recent` keeps.
        name_of: member -> its display name (the roster's `display_name`).
        clock: realtime, for the events' `time` (injected for tests).
    """

    def __init__(
        self,
        capacity: int = EVENT_BUFFER,
        *,
        name_of: Callable[[Member], str] = lambda member: member.name,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"event capacity must be at least 1, got {capacity}")
        self._ring: collections.deque[dict[str, Any]] = collections.deque(maxlen=capacity)
        self._subscribers: list[trio.MemorySendChannel[dict[str, Any]]] = []
        self._name_of = name_of
        self._clock = clock
        self._seq = 0
        self._closed = False
        #: Events subscribers lost because they fell behind.
        self.dropped = 0
        #: Events published, by kind (read by the metrics collector).
        self.counts: dict[str, int] = {}

    def publish(self, kind: str, message: str, **fields: Any) -> dict[str, Any]:
        """Record one event and hand it to every subscriber; never blocks."""
        self._seq += 1
        event = {"seq": self._seq, "time": round(self._clock(), 3), "kind": kind,
                 "message": message, **fields}  # fmt: skip
        self._ring.append(event)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        for send in list(self._subscribers):
            try:
                send.send_nowait(event)
            except trio.WouldBlock:
                self.dropped += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.remove(send)
        return event

    def recent(self) -> list[dict[str, Any]]:
        """The buffered events, oldest first."""
        return list(self._ring)

    def subscribe(
        self, max_buffer: int = EVENT_SUBSCRIBER_BUFFER
    ) -> tuple[list[dict[str, Any]], trio.MemoryReceiveChannel[dict[str, Any]]]:
        """The buffered events and a channel of every later one (no gap, no repeat).

        Close the channel to unsubscribe.
        """
        send, receive = trio.open_memory_channel[dict[str, Any]](max_buffer)
        if self._closed:
            send.close()  # the reader gets the buffer, then the end
        else:
            self._subscribers.append(send)
        return self.recent(), receive

    def close(self) -> None:
        """End every subscriber's channel (the node is stopping): streams finish cleanly
        instead of being cut when the server's grace period runs out."""
        self._closed = True
        for send in self._subscribers:
            send.close()
        self._subscribers.clear()

    def gpu_report(self, report: Any) -> None:
        """A new GPU report of this node (the GPU service's `on_report`)."""
        devices = list(getattr(getattr(report, "facts", None), "devices", ()))
        health = [str(h.state) for h in getattr(report, "health", ())]
        self.publish(
            "gpu.report",
            f"GPU report: {len(devices)} device(s)"
            + (f", health {', '.join(health)}" if health else ""),
            devices=len(devices),
            health=health,
        )

    async def run(
        self,
        events: trio.MemoryReceiveChannel[Event],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Turn membership events into feed events until the channel closes."""
        task_status.started()
        async with events:
            async for ev in events:
                fields = membership_event(ev, self._name_of)
                if fields is not None:
                    self.publish(**fields)
