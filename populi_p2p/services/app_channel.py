"""The node's side of the swim application channel: one registry of payload kinds, one
`swim.AppState` delegate that carries every application's push-pull section.

The swim core has one broadcast queue and one `AppState` delegate for the whole node,
but several applications use them (the lease table, its submit acknowledgements, and
next the revocation list). So every broadcast payload starts with a one-byte kind
(`AppKind`, the only registry of kinds: ONLY APPEND, values are on the wire), and the
push-pull section is a msgpack map ``{kind: bytes}`` of each registered section's
digest or state. A kind this node does not know is ignored, so a newer peer may add
kinds. Everything received is hostile: junk is counted in `dropped` and never raises.

Two objects, built on either side of the membership service: `AppSections` (the sync
sections by kind, the core's `AppState` delegate, so built before the core) and
`AppChannel` (routes received payloads to their kind's handler, and sends with the
membership service's `broadcast_app`, so built after it, with the sections).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Final

import msgpack
import trio

from swim import AppMessage, AppState, Event

from .._log import event, get_logger

__all__ = ["AppChannel", "AppKind", "AppSections"]

_log = get_logger("node")

#: Largest number of sections one sync message may carry (one per kind).
SECTIONS_MAX: Final = 16


class AppKind(enum.IntEnum):
    """The first byte of every application payload. ONLY APPEND; values are part of
    the protocol."""

    LEASES = 1  # a lease-table delta (`LeaseTable` wire format)
    LEASE_ACK = 2  # retired (submit acks are now the replicas' `OfferAck`s): never reuse
    REVOCATIONS = 3  # reserved for the revocation list
    LEASE_AGENT = 4  # a `LeaseAgent` message to one member (`leases.agent_wire`)


Handler = Callable[[AppMessage, bytes], Awaitable[None]]
Broadcast = Callable[[str, bytes], Awaitable[None]]


def _decode_sections(payload: bytes) -> dict[int, bytes]:
    """``{kind: bytes}`` from a sync section, or {} for junk."""
    if not payload:
        return {}
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException):
        return {}
    if not isinstance(raw, dict) or len(raw) > SECTIONS_MAX:
        return {}
    return {k: v for k, v in raw.items() if type(k) is int and isinstance(v, bytes)}


def _encode_sections(sections: dict[int, bytes]) -> bytes:
    return msgpack.packb(dict(sorted(sections.items())), use_bin_type=True)  # type: ignore[no-any-return]


class AppSections:
    """Every registered kind's push-pull section, multiplexed in one sync section.

    It is the swim core's `AppState` delegate (pass it to `MembershipService`); the
    `AppChannel` adds a kind's section when the kind registers.
    """

    def __init__(self) -> None:
        self._sections: dict[int, AppState] = {}
        self.dropped = 0  # junk or unknown-kind sync sections received

    def add(self, kind: AppKind, section: AppState) -> None:
        """`section` takes part in push-pull under `kind`."""
        self._sections[int(kind)] = section

    ####################################################################################
    # swim.AppState

    def digest(self) -> bytes:
        return _encode_sections({k: s.digest() for k, s in self._sections.items()})

    def state_for(self, remote_digest: bytes) -> bytes | None:
        remote = _decode_sections(remote_digest)
        out = {}
        for kind, section in self._sections.items():
            state = section.state_for(remote.get(kind, b""))
            if state:
                out[kind] = state
        return _encode_sections(out) if out else None

    def merge(self, payload: bytes) -> None:
        sections = _decode_sections(payload)
        if payload and not sections:
            self.dropped += 1
        for kind, state in sections.items():
            section = self._sections.get(kind)
            if section is None:
                self.dropped += 1
                continue
            section.merge(state)


class AppChannel:
    """Routes application broadcasts by kind, and sends them.

    Args:
        sections: the core's `AppState` delegate, where registered sections go.
        broadcast: ``broadcast(key, payload)`` queues a payload on the swim channel
            (`MembershipService.broadcast_app`).
    """

    def __init__(self, sections: AppSections, broadcast: Broadcast) -> None:
        self.sections = sections
        self._handlers: dict[int, Handler] = {}
        self._broadcast = broadcast
        self.dropped = 0  # junk or unknown-kind payloads received
        #: Broadcasts the swim channel refused (too big), by kind: push-pull carried them.
        self.refused: dict[str, int] = {}

    def register(self, kind: AppKind, handler: Handler, section: AppState | None = None) -> None:
        """Deliver payloads of `kind` to `handler(message, body)`; `section`, if given,
        takes part in push-pull under the same kind."""
        self._handlers[int(kind)] = handler
        if section is not None:
            self.sections.add(kind, section)

    async def broadcast(self, kind: AppKind, key: str, body: bytes) -> bool:
        """Queue `body` under `kind`; False when the channel refused it (too big, left):
        the push-pull section then carries the change."""
        try:
            await self._broadcast(key, bytes([int(kind)]) + body)
        except ValueError as exc:
            # Expected for big changes (a spec near its limits, a long explanation): the
            # kind's push-pull section carries them. Said once per kind, then counted.
            first = kind.name not in self.refused
            self.refused[kind.name] = self.refused.get(kind.name, 0) + 1
            level = 20 if first else 10
            event(_log, level, "app.broadcast_refused", kind=kind.name, reason=str(exc),
                  then="sent by push-pull; later ones counted")  # fmt: skip
            return False
        return True

    async def run(
        self,
        events: trio.MemoryReceiveChannel[Event],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Deliver every `AppMessage` of the membership fan-out to its kind's handler."""
        task_status.started()
        async for ev in events:
            if isinstance(ev, AppMessage):
                await self.deliver(ev)

    async def deliver(self, message: AppMessage) -> None:
        """An `AppMessage` from the core: hand its body to its kind's handler."""
        handler = self._handlers.get(message.payload[0]) if message.payload else None
        if handler is None:
            self.dropped += 1
            return
        await handler(message, message.payload[1:])
