"""The lifecycle service: signals and the graceful leave.

Commands in: `request_leave` (API, first SIGINT or SIGTERM). Commands out: the leave is
announced through the membership service, the store is flushed, the API is stopped once
it has answered, then `stop_node` cancels everything. A second signal stops at once.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from typing import Final

import trio

from .._log import event, get_logger

__all__ = ["LEAVE_TIMEOUT", "Lifecycle"]

#: Longest a graceful leave may take before the daemon exits anyway, seconds. It covers
#: both parts of `swim.Membership.leave`: the direct `left` to every live member (one
#: datagram each, sent at once: about 20 us of signing each, `benchmarks/auth_speed.py`,
#: a few ms at N = 100 on a free core) and the rumor's gossip rounds until
#: `leave_announced` (well under a second on a LAN).
LEAVE_TIMEOUT: Final = 3.0
#: Longest the API gets to finish answering after a leave, seconds.
API_DRAIN_TIMEOUT: Final = 2.0

_log = get_logger("node")


class Lifecycle:
    """Args: the leave (returns once announced), whether it was announced, the store
    flush, the API stop and its completion, and the node's cancel."""

    def __init__(
        self,
        *,
        leave: Callable[[], Awaitable[None]],
        announced: Callable[[], bool],
        flush: Callable[[], None],
        stop_api: Callable[[], None],
        api_done: trio.Event,
        stop_node: Callable[[], None],
    ) -> None:
        self._leave = leave
        self._announced = announced
        self._flush = flush
        self._stop_api = stop_api
        self._api_done = api_done
        self._stop_node = stop_node
        self._leaving = trio.Event()
        self.left = False

    def request_leave(self) -> None:
        """Start a graceful leave (API or signal); the node then stops."""
        self._leaving.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._signals)
            task_status.started()
            await self._leave_when_asked()

    async def _leave_when_asked(self) -> None:
        await self._leaving.wait()
        started = trio.current_time()
        event(_log, 20, "node.leaving", timeout=LEAVE_TIMEOUT)
        with trio.move_on_after(LEAVE_TIMEOUT):
            await self._leave()
        self.left = True
        self._flush()
        event(
            _log, 20, "node.left", seconds=round(trio.current_time() - started, 3),
            announced=str(self._announced()).lower(),
        )  # fmt: skip
        # Let the API finish answering (the `leave` request itself) before stopping.
        self._stop_api()
        with trio.move_on_after(API_DRAIN_TIMEOUT):
            await self._api_done.wait()
        self._stop_node()

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if self._leaving.is_set():
                    event(_log, 30, "node.exit_now", signal=signal.Signals(signum).name)
                    self._stop_node()
                    return
                event(_log, 20, "node.signal", signal=signal.Signals(signum).name)
                self.request_leave()
