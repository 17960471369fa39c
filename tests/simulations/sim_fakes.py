"""A stand-in membership core for testing the engine on its own.

`PingCore` pings one random peer every second and acks pings; it records everything
it was asked to do, so tests can assert on exactly what the engine delivered and when.
It emits no membership events.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from swim import Address, Output, Send

PING = b"\x01"
ACK = b"\x02"


class PingCore:
    def __init__(
        self,
        name: str,
        address: Address,
        rng: random.Random,
        now: float,
        incarnation: int,
        peers: list[Address],
        *,
        interval: float = 1.0,
        reliable_pings: bool = False,
    ) -> None:
        self.name = name
        self.address = address
        self.incarnation = incarnation
        self.peers = peers
        self.rng = rng
        self.interval = interval
        self.reliable_pings = reliable_pings
        self.next = now + rng.random() * interval
        self.created = now
        self.received: list[tuple[float, Address, bytes, bool]] = []
        self.ticks: list[float] = []
        self.failed: list[tuple[float, Address]] = []
        self.joined: list[Sequence[Address]] = []

    def receive(
        self, source: Address, payload: bytes, now: float, *, reliable: bool = False
    ) -> list[Output]:
        self.received.append((now, source, payload, reliable))
        if payload[:1] == PING:
            return [Send(source, ACK + payload[1:])]
        return []

    def tick(self, now: float) -> list[Output]:
        self.ticks.append(now)
        out: list[Output] = []
        if now >= self.next:
            self.next += self.interval
            others = [p for p in self.peers if p != self.address]
            if others:
                peer = others[self.rng.randrange(len(others))]
                out.append(Send(peer, PING + self.name.encode(), self.reliable_pings))
        return out

    def next_deadline(self) -> float | None:
        return self.next

    def join(self, seeds: Sequence[Address], now: float) -> list[Output]:
        self.joined.append(list(seeds))
        return []

    def leave(self, now: float) -> list[Output]:
        return []

    def set_meta(self, meta: bytes, now: float) -> list[Output]:
        return []

    def send_failed(self, destination: Address, payload: bytes, now: float) -> list[Output]:
        self.failed.append((now, destination))
        return []
