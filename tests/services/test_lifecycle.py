"""`Lifecycle`: the graceful leave in order, bounded at each step, and the signals."""

from __future__ import annotations

import os
import signal

import trio
import trio.testing

from populi_p2p.services.lifecycle import API_DRAIN_TIMEOUT, LEAVE_TIMEOUT, Lifecycle


class Node:
    """The lifecycle's collaborators, recording the order it calls them in."""

    def __init__(self, *, leave_takes: float = 0.0, api_finishes: bool = True) -> None:
        self.calls: list[tuple[str, float]] = []
        self.leave_takes = leave_takes
        self.api_finishes = api_finishes
        self.api_done = trio.Event()
        self.leave_started = trio.Event()
        self.stopped = trio.Event()
        self.announced = False

    def _note(self, what: str) -> None:
        self.calls.append((what, trio.current_time()))

    async def leave(self) -> None:
        self._note("leave")
        self.leave_started.set()
        await trio.sleep(self.leave_takes)
        self.announced = True

    def flush(self) -> None:
        self._note("flush")

    def stop_api(self) -> None:
        self._note("stop_api")
        if self.api_finishes:
            self.api_done.set()

    def stop_node(self) -> None:
        self._note("stop_node")
        self.stopped.set()

    def lifecycle(self) -> Lifecycle:
        return Lifecycle(
            leave=self.leave, announced=lambda: self.announced, flush=self.flush,
            stop_api=self.stop_api, api_done=self.api_done, stop_node=self.stop_node,
        )  # fmt: skip


async def run_until_stopped(node: Node, lifecycle: Lifecycle) -> float:
    async with trio.open_nursery() as nursery:
        await nursery.start(lifecycle.run)
        start = trio.current_time()
        lifecycle.request_leave()
        await node.stopped.wait()
        nursery.cancel_scope.cancel()
    return start


async def test_a_leave_is_announced_flushed_answered_then_the_node_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    node = Node(leave_takes=0.5)
    lifecycle = node.lifecycle()
    start = await run_until_stopped(node, lifecycle)
    assert [what for what, _ in node.calls] == ["leave", "flush", "stop_api", "stop_node"]
    assert lifecycle.left and node.announced
    assert node.calls[-1][1] - start == 0.5


async def test_a_leave_that_hangs_is_given_up_after_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    node = Node(leave_takes=3600.0)
    lifecycle = node.lifecycle()
    start = await run_until_stopped(node, lifecycle)
    assert [what for what, _ in node.calls] == ["leave", "flush", "stop_api", "stop_node"]
    assert lifecycle.left and not node.announced
    assert node.calls[1][1] - start == LEAVE_TIMEOUT


async def test_an_api_that_never_finishes_does_not_hold_the_stop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    node = Node(api_finishes=False)
    start = await run_until_stopped(node, node.lifecycle())
    assert node.calls[-1] == ("stop_node", start + API_DRAIN_TIMEOUT)


async def test_no_leave_until_asked() -> None:
    node = Node()
    async with trio.open_nursery() as nursery:
        await nursery.start(node.lifecycle().run)
        await trio.testing.wait_all_tasks_blocked()
        assert node.calls == []
        nursery.cancel_scope.cancel()


async def test_the_first_signal_leaves_and_a_second_stops_at_once() -> None:
    node = Node(leave_takes=3600.0)
    lifecycle = node.lifecycle()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(lifecycle.run)
            await trio.testing.wait_all_tasks_blocked()  # the signal receiver is set up
            os.kill(os.getpid(), signal.SIGTERM)
            await node.leave_started.wait()
            os.kill(os.getpid(), signal.SIGINT)
            await node.stopped.wait()
            nursery.cancel_scope.cancel()
    assert [what for what, _ in node.calls] == ["leave", "stop_node"]  # no flush: at once
    assert not lifecycle.left
