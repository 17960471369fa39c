"""The membership service: the swim core, its driver, and the event fan-out.

Every other service that cares about membership calls `subscribe()` and reads its own
channel: the roster, the links, discovery, the store, and next the lease table, the
executor, the inference router and metrics. Each subscriber gets every event, in the
core's order; a subscriber that falls `max_buffer` events behind holds up the fan-out
(events are never dropped), never the receive loop (the driver delivers events from
its own task). Calls into the core go through the commands here, so their outputs are
always applied; the queries are read-only.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Final

import trio

from overlay.base import Address
from swim import AppState, Event, Member, Membership, MembershipStatistics, MemberState, SwimConfig

from .._trace import PacketTrace
from ..driver import Driver, DriverStatistics, PacketCodec, PacketTransport

__all__ = ["SUBSCRIBER_BUFFER", "MembershipService"]

#: Events a subscriber may fall behind before the fan-out waits for it.
SUBSCRIBER_BUFFER: Final = 4096
_LIVE: Final = (MemberState.ALIVE, MemberState.SUSPECT)


class MembershipService:
    """One `swim.Membership` driven over one transport, with subscribers.

    Args:
        config: the swim configuration (packet budget already set).
        node_id, advertise, meta, incarnation: our member as the core starts it.
        transport, codec: see `driver.Driver`.
        max_datagram_size: sealed payloads above this go over TCP.
        now: the core's start time (``trio.current_time()``).
        rng: the core's random source.
        app_state: the application channel's push-pull delegate (`swim.AppState`).
    """

    def __init__(
        self,
        config: SwimConfig,
        node_id: str,
        advertise: Address,
        *,
        meta: bytes,
        incarnation: int,
        transport: PacketTransport,
        codec: PacketCodec,
        max_datagram_size: int,
        now: float,
        rng: random.Random | None = None,
        app_state: AppState | None = None,
    ) -> None:
        self.node_id = node_id
        self._core = Membership(
            config, node_id, advertise, rng if rng is not None else random.Random(), now,
            meta=meta, incarnation=incarnation, app_state=app_state,
        )  # fmt: skip
        self._driver = Driver(
            self._core, transport, codec, self._fan_out, max_datagram_size=max_datagram_size,
            trace=PacketTrace.from_environment(node_id),
        )  # fmt: skip
        self._subscribers: list[trio.MemorySendChannel[Event]] = []

    ####################################################################################
    # Events out

    def subscribe(self, max_buffer: int = SUBSCRIBER_BUFFER) -> trio.MemoryReceiveChannel[Event]:
        """A channel of every membership event from now on, in order.

        Subscribe before `run` starts to miss none. Close the channel to unsubscribe.
        """
        send, receive = trio.open_memory_channel[Event](max_buffer)
        self._subscribers.append(send)
        return receive

    async def _fan_out(self, ev: Event) -> None:
        for send in list(self._subscribers):
            try:
                try:
                    send.send_nowait(ev)
                except trio.WouldBlock:
                    await send.send(ev)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.remove(send)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._driver.run(task_status=task_status)
        finally:
            for send in self._subscribers:
                send.close()

    ####################################################################################
    # Commands

    async def set_meta(self, meta: bytes) -> None:
        """Publish new member metadata (a re-signed record)."""
        core = self._core
        await self._driver.call(lambda now: core.set_meta(meta, now))

    async def broadcast_app(self, key: str, payload: bytes) -> None:
        """Queue an application broadcast (`swim.Membership.broadcast_app`).

        Raises:
            ValueError: the channel is off, we left, or the payload is too big.
        """
        core = self._core
        await self._driver.call(lambda now: core.broadcast_app(key, payload, now))

    async def send_app(self, to: str, key: str, payload: bytes) -> None:
        """Send an application message to one member (`swim.Membership.send_app`).

        Raises:
            ValueError: the channel is off, we left, `to` is unknown or the payload big.
        """
        core = self._core
        await self._driver.call(lambda now: core.send_app(to, key, payload, now))

    async def join(self, seeds: Sequence[Address]) -> None:
        core = self._core
        await self._driver.call(lambda now: core.join(seeds, now))

    async def leave(self) -> None:
        """Announce our leave and return once the core has sent it as often as it wants."""
        core = self._core
        await self._driver.call(core.leave)
        # The driver keeps running (receiving, acking, gossiping) until the core has
        # sent our "left" as many times as its transmit limit asks.
        await self._driver.wait_for(lambda: core.leave_announced)

    ####################################################################################
    # Queries (read-only)

    def members(self) -> list[Member]:
        return list(self._core.members())

    def member(self, node_id: str) -> Member | None:
        return self._core.member(node_id)

    def is_live(self, node_id: str) -> bool:
        """Whether `node_id` is a current member: alive or suspect in our view."""
        member = self._core.member(node_id)
        return member is not None and member.state in _LIVE

    def holds(self) -> Callable[[str], bool]:
        return lambda name: self._core.member(name) is not None

    def num_alive(self) -> int:
        return int(self._core.num_alive())

    @property
    def incarnation(self) -> int:
        return int(self._core.incarnation)

    @property
    def has_left(self) -> bool:
        return bool(self._core.has_left)

    @property
    def leave_announced(self) -> bool:
        return bool(self._core.leave_announced)

    @property
    def awareness(self) -> int:
        return int(self._core.awareness)

    def statistics(self) -> MembershipStatistics:
        return self._core.statistics()

    def driver_statistics(self) -> DriverStatistics:
        return self._driver.statistics()
