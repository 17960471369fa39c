"""Which peers this node failed to reach, and why: warnings an operator can act on.

A bootstrap address where nothing listens used to fail in silence: the driver logged
the refused connection at debug level and the core moved on. `PeerReachability` sits
between the driver and the transport (`watch`), notes every send that fails with the
transport's reason (``tcp connect to 10.0.0.7:7950 failed: connection refused``), and
clears it when that address answers (a packet from it, or a frame sent). Each address
is logged once per failure streak, as ``peer.unreachable`` at warning level, and
``peer.reachable`` when it comes back; `warnings` gives `status` one line per address
failing now.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Final

import attrs
import trio

from overlay.base import Address, TransportError, format_address
from overlay.inbox import Incoming

from .._log import event, get_logger
from ..driver import PacketTransport

__all__ = [
    "DIAGNOSE_TIMEOUT",
    "UNREACHABLE_SHOWN_FOR",
    "UNREACHABLE_WARNINGS_MAX",
    "PeerReachability",
]

#: `status` shows an address whose last failure is at most this old, seconds.
UNREACHABLE_SHOWN_FOR: Final = 600.0
#: `status` names this many unreachable addresses, then counts the rest.
UNREACHABLE_WARNINGS_MAX: Final = 5
#: Longest the TCP connect of `diagnose` waits, seconds.
DIAGNOSE_TIMEOUT: Final = 3.0
#: Addresses tracked at most (the oldest failure is forgotten first).
_TRACKED_MAX: Final = 1024

_log = get_logger("node")


@attrs.define
class _Failing:
    reason: str
    first: float
    last: float
    tries: int = 1


class PeerReachability:
    """Failure streaks by address.

    Args:
        clock: monotonic seconds (``trio.current_time`` in the daemon).
        describe: an address -> what it is to us (``bootstrap peer``, a member's name),
            or None; set by the node once it knows.
    """

    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self._failing: dict[Address, _Failing] = {}
        self.describe: Callable[[Address], str | None] = lambda _a: None

    def watch(self, transport: PacketTransport) -> _Watched:
        """`transport` with its sends and receives reported here (for the driver)."""
        return _Watched(transport, self)

    def failed(self, address: Address, reason: str) -> None:
        now = self._clock()
        streak = self._failing.get(address)
        if streak is not None:
            streak.tries += 1
            streak.last = now
            if streak.reason == reason:
                return
            streak.reason = reason
        else:
            self._failing[address] = _Failing(reason, now, now)
            while len(self._failing) > _TRACKED_MAX:
                self._failing.pop(next(iter(self._failing)))
        event(_log, 30, "peer.unreachable", addr=format_address(address),
              peer=self.describe(address), reason=reason)  # fmt: skip

    async def diagnose(self, address: Address, *, waited: float) -> None:
        """Find out why `address` gave no answer to a join sent over UDP (which fails
        in silence), by connecting to its TCP port, and note it as a failure.

        Refused or unreachable: nothing listens there. Timed out: no host, or a
        firewall. Connected: something listens but did not let us in.
        """
        streak = self._failing.get(address)
        if streak is not None:  # why is known: one more failed try
            self.failed(address, streak.reason)
            return
        host, port = address
        sock = trio.socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            with trio.fail_after(DIAGNOSE_TIMEOUT):
                await sock.connect((host, port))
        except trio.TooSlowError:
            reason = (
                f"no answer in {waited:g} s, and a TCP connect timed out after"
                f" {DIAGNOSE_TIMEOUT:g} s (no host there, or a firewall drops it)"
            )
        except OSError as exc:
            why = os.strerror(exc.errno).lower() if exc.errno else str(exc)
            reason = f"no answer in {waited:g} s; TCP connect: {why}"
        else:
            reason = (
                f"no answer in {waited:g} s, though its TCP port accepts connections"
                " (not a populi node, another cluster's authority.pub, or it refused"
                " this node: see its log)"
            )
        finally:
            sock.close()
        self.failed(address, reason)

    def reached(self, address: Address) -> None:
        streak = self._failing.pop(address, None)
        if streak is not None:
            event(_log, 20, "peer.reachable", addr=format_address(address),
                  peer=self.describe(address), failed_tries=streak.tries)  # fmt: skip

    def reason(self, address: Address) -> str | None:
        """Why the last send to `address` failed, while it has not answered since."""
        streak = self._failing.get(address)
        return None if streak is None else streak.reason

    def warnings(self) -> list[str]:
        """One line per address that failed within `UNREACHABLE_SHOWN_FOR`, newest first."""
        now = self._clock()
        recent = sorted(
            ((a, s) for a, s in self._failing.items() if now - s.last <= UNREACHABLE_SHOWN_FOR),
            key=lambda item: -item[1].last,
        )
        lines = []
        for address, streak in recent[:UNREACHABLE_WARNINGS_MAX]:
            what = self.describe(address)
            who = f"{format_address(address)}" + (f" ({what})" if what else "")
            tries = "once" if streak.tries == 1 else f"{streak.tries} times"
            lines.append(
                f"cannot reach {who}: {streak.reason}; failed {tries} over"
                f" {now - streak.first:.0f} s, last {now - streak.last:.0f} s ago"
            )
        if len(recent) > UNREACHABLE_WARNINGS_MAX:
            lines.append(f"... and {len(recent) - UNREACHABLE_WARNINGS_MAX} more unreachable")
        return lines


class _Watched:
    """A transport whose failures and answers `PeerReachability` hears of."""

    def __init__(self, inner: PacketTransport, watch: PeerReachability) -> None:
        self._inner = inner
        self._watch = watch

    async def receive(self) -> Incoming:
        return self._saw(await self._inner.receive())

    def receive_nowait(self) -> Incoming:
        return self._saw(self._inner.receive_nowait())

    def _saw(self, incoming: Incoming) -> Incoming:
        if self._watch._failing:  # nothing to clear, nothing to do (the common case)
            self._watch.reached(incoming.source)
        return incoming

    async def send_datagram(
        self, address: Address, payload: bytes, *, expects_answer: bool = True
    ) -> None:
        try:
            await self._inner.send_datagram(address, payload, expects_answer=expects_answer)
        except TransportError as exc:
            self._watch.failed(address, str(exc))
            raise

    async def send_frame(self, address: Address, payload: bytes) -> None:
        try:
            await self._inner.send_frame(address, payload)
        except TransportError as exc:
            self._watch.failed(address, str(exc))
            raise
        if self._watch._failing:
            self._watch.reached(address)
