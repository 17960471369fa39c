"""The store service: what the node remembers across restarts.

Commands in: `remember` (a member worth retrying after a restart), `forget` (it left).
Events in: `SelfRefuted` on its own subscription (the new incarnation is saved at once).
Every `FLUSH_INTERVAL` the batch is written, with the current incarnation, so a restart
starts above any incarnation this run used. A store that cannot be opened or written is
logged and the node carries on without memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

import trio

from swim import Event, IncarnationExhausted, SelfRefuted

from .._log import event, get_logger
from ..store import KnownMember, MemberStore, StoreError
from ._member_events import serve_events

__all__ = ["FLUSH_INTERVAL", "StoreService", "open_store"]

#: How often remembered members and the incarnation are written, seconds.
FLUSH_INTERVAL: Final = 2.0

_log = get_logger("node")


def open_store(
    path: Path, clock: Callable[[], float] = time.time
) -> tuple[MemberStore | None, int]:
    """The member store (None when it cannot be opened: the node carries on without
    memory) and the incarnation to start with."""
    try:
        store = MemberStore(path)
        return store, store.start_incarnation()
    except StoreError as exc:
        event(_log, 30, "store.unusable", reason=str(exc), effect="starting without memory")
        return None, int(clock())  # still above anything a previous run used


class Incarnated(Protocol):
    """Where the current incarnation is read at each flush (the membership service)."""

    @property
    def incarnation(self) -> int: ...


class StoreService:
    """Batches member memory into the `MemberStore`; None store: remembers nothing.

    Args:
        store: from `open_store`.
        membership: its incarnation is saved at each flush.
    """

    def __init__(self, store: MemberStore | None, membership: Incarnated) -> None:
        self._store = store
        self._membership = membership
        self._dirty: dict[str, KnownMember] = {}
        self._forget: set[str] = set()

    def remember(self, member: KnownMember) -> None:
        self._forget.discard(member.node_id)
        self._dirty[member.node_id] = member

    def forget(self, node_id: str) -> None:
        self._dirty.pop(node_id, None)
        self._forget.add(node_id)

    def known_members(self) -> list[KnownMember]:
        return [] if self._store is None else list(self._store.known_members())

    def flush(self) -> None:
        if self._store is None:
            self._dirty.clear()
            self._forget.clear()
            return
        try:
            if self._dirty:
                self._store.remember(self._dirty.values())
            if self._forget:
                self._store.forget(self._forget)
            self._store.save_incarnation(self._membership.incarnation)
        except StoreError as exc:
            event(_log, 30, "store.write_failed", reason=str(exc))
        self._dirty.clear()
        self._forget.clear()

    def close(self) -> None:
        self.flush()
        if self._store is not None:
            self._store.close()

    async def run(
        self,
        events: trio.MemoryReceiveChannel[Event],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await serve_events(
            events, self._on_event, every=FLUSH_INTERVAL, check=self.flush,
            task_status=task_status,
        )  # fmt: skip

    def _on_event(self, ev: Event) -> None:
        if isinstance(ev, SelfRefuted) and self._store is not None:
            try:
                if isinstance(ev, IncarnationExhausted):
                    self._store.reset_incarnation(ev.incarnation)  # a new session
                else:
                    self._store.save_incarnation(ev.incarnation)
            except StoreError as exc:
                event(_log, 30, "store.write_failed", reason=str(exc))
