"""How lease deltas travel: broadcast on the app channel, relayed when new, and echoed.

The swim core sends one application broadcast to only `retransmit_mult *
ceil(log10(n+1))` members and never re-gossips it. So a receiver relays each delta that
changed its table (epidemic spread that stops where nothing is new), and the node that
made a delta broadcasts it again every `lease_renew_interval` for `lease_ttl`: a member
that missed a result would otherwise see the lease go silent and run the task again.
"""

from __future__ import annotations

from .app_channel import AppChannel, AppKind

__all__ = ["DeltaGossip"]


class DeltaGossip:
    """Args: the channel, the echo period (`lease_renew_interval`) and span (`lease_ttl`)."""

    def __init__(self, channel: AppChannel, interval: float, span: float) -> None:
        self._channel = channel
        self._interval = interval
        self._span = span
        self._echo: dict[str, tuple[bytes, float]] = {}  # key -> (delta, echo until)
        self.due = 0.0  # when `echo` next has something to send

    @property
    def pending(self) -> bool:
        return bool(self._echo)

    async def send(self, key: str, delta: bytes, now: float) -> None:
        """A local delta: broadcast now, echo until `now + span` (a newer delta under the
        same key replaces it)."""
        self._echo[key] = (delta, now + self._span)
        await self._channel.broadcast(AppKind.LEASES, key, delta)

    async def relay(self, key: str, delta: bytes) -> None:
        """A remote delta that was new to us: pass it on once."""
        await self._channel.broadcast(AppKind.LEASES, key, delta)

    async def echo(self, now: float) -> None:
        if now < self.due:
            return
        self.due = now + self._interval
        for key, (delta, until) in list(self._echo.items()):
            if now >= until:
                del self._echo[key]
            else:
                await self._channel.broadcast(AppKind.LEASES, key, delta)
