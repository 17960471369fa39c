"""The link service: what the packet layer needs to know about the members.

Events in: membership events (its own subscription). It keeps the codec's map of
addresses to node ids, decides who must be sent our certificate again (new, back,
restarted, or silent peers: `Introductions`), and warns once per peer when UDP seems
blocked while TCP works. It owns no membership state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, Protocol

import trio

from overlay.base import Address, format_address
from overlay.peerpaths import PathHealth
from swim import (
    Event,
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberRecovered,
    MemberSuspected,
    MemberUpdated,
    SelfRefuted,
)

from .._log import event, get_logger
from ._member_events import other_member, serve_events
from .codec import AuthCodec

__all__ = ["LINK_CHECK_INTERVAL", "LinkService"]

#: How often blocked paths and stale introductions are looked at, seconds.
LINK_CHECK_INTERVAL: Final = 2.0

_log = get_logger("node")


class _Held:
    """`name in _Held(holds)`: whether the core holds that member (any state)."""

    def __init__(self, holds: Callable[[str], bool]) -> None:
        self._holds = holds

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._holds(name)


class HasPaths(Protocol):
    """What the link service needs of the transport: its per-peer path health."""

    @property
    def paths(self) -> PathHealth: ...


class LinkService:
    """Args: our node id, the codec, the transport, and `holds(node_id)` (the core's)."""

    def __init__(
        self,
        node_id: str,
        codec: AuthCodec,
        transport: HasPaths,
        holds: Callable[[str], bool],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._node_id = node_id
        self._codec = codec
        self._transport = transport
        self._held = _Held(holds)
        self._clock = clock
        self._blocked_before: set[Address] = set()

    def on_event(self, ev: Event) -> None:
        introductions = self._codec.introductions
        if isinstance(ev, SelfRefuted):
            # Somebody suspected us: maybe it could not read our packets. Tell everyone.
            introductions.introduce_to_everyone(self._clock())
            event(_log, 30, "self.refuted", incarnation=ev.incarnation)
            return
        member = other_member(ev, self._node_id)
        if member is None:
            return
        self._codec.recipients[member.address] = member.name
        if isinstance(ev, MemberJoined | MemberRecovered | MemberUpdated):
            # New to us, back, or a new record (a restart signs one): it may not know us.
            introductions.introduce(member.name, self._clock())
            introductions.doubt(member.name, False)
        elif isinstance(ev, MemberSuspected | MemberFailed):
            introductions.doubt(member.name, True)  # silent: perhaps it cannot read us
        elif isinstance(ev, MemberLeft):
            introductions.doubt(member.name, False)

    def check(self) -> None:
        """Warn about UDP paths blocked at two checks in a row; drop introductions for
        forgotten members.

        Two in a row: a peer starved of CPU (many daemons starting on few cores) leaves
        a few datagrams unanswered while a TCP fallback gets through, and answers again
        a second later. A firewall that drops UDP is still there at the next check.
        """
        paths = self._transport.paths
        blocked = set(paths.blocked_peers())
        persistent = sorted(blocked & self._blocked_before)
        self._blocked_before = blocked
        for peer in persistent:
            if paths.warn_udp_blocked_once(peer):
                name = self._codec.recipients.get(peer, "?")
                event(
                    _log, 30, "udp.blocked", peer=format_address(peer), id=name,
                    effect="probes fall back to tcp; check the firewall for udp",
                )  # fmt: skip
        self._codec.introductions.prune(self._held, self._clock())

    async def run(
        self,
        events: trio.MemoryReceiveChannel[Event],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await serve_events(
            events, self.on_event, every=LINK_CHECK_INTERVAL, check=self.check,
            task_status=task_status,
        )  # fmt: skip
