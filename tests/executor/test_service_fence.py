"""One owner per task (issue "One owner per task", sections 3 and 5): a fence deadline
that holds while the daemon's event loop is frozen, a stop with its own grace, and the
leftovers of an earlier daemon killed before its leases are released. Real processes;
every wait is on an exit event, on output, or a poll with a deadline."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import trio

from populi_p2p.executor._leftovers import Leftovers
from populi_p2p.executor.service import ExecutorService

from .helpers import alive, children, executor, next_exit, python

#: A command that says when SIGTERM reached it (CLOCK_MONOTONIC, shared by every
#: process), ignores it, and is up once it printed "up".
_TERM_NOTING = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: print('term', time.monotonic(), flush=True))\n"
    "print('up', flush=True)\n"
    "while True: time.sleep(1)\n"
)


async def _up(ex: ExecutorService, task_id: str) -> int:
    """Wait for the command's "up"; its pid (the wrapper's child)."""
    async for chunk in ex.follow_log(task_id):
        if b"up\n" in chunk:
            break
    wrapper = ex.running()[task_id].pid
    assert wrapper is not None
    (command,) = children(wrapper)
    return command


def _frozen_until_gone(pid: int, limit: float) -> float:
    """Block this thread (and with it the Trio loop: a frozen daemon) until `pid` is
    gone; when it was seen gone."""
    while alive(pid):
        assert time.monotonic() < limit, f"{pid} still alive"
        time.sleep(0.005)
    return time.monotonic()


async def test_a_fence_holds_while_the_event_loop_is_frozen(tmp_path: Path) -> None:
    async with executor(tmp_path, grace_period=30.0) as ex:
        deadline = time.monotonic() + 2.0
        # Fenced from its start: there is no window in which it runs unfenced.
        ex.start("f", 1, python(_TERM_NOTING), [], deadline=deadline, fence_grace=0.5)
        command = await _up(ex, "f")
        gone = _frozen_until_gone(command, deadline + 5.0)
        ended = await next_exit(ex)
    assert deadline <= gone < deadline + 0.3, gone - deadline
    assert ended.reason == "cancelled" and ended.detail == "fenced", ended
    assert ended.exit_code == -9
    # SIGTERM came fence_grace before the deadline, to the command itself.
    term = float(ended.stdout_tail.split(b"term ")[1].split()[0])
    assert deadline - 0.5 <= term < deadline - 0.5 + 0.3, deadline - term


async def test_a_renewed_fence_keeps_the_task_and_a_lapsed_one_stops_it(tmp_path: Path) -> None:
    async with executor(tmp_path, grace_period=30.0) as ex:
        ex.start("r", 2, python(_TERM_NOTING), [], deadline=time.monotonic() + 3.0, fence_grace=0.3)
        command = await _up(ex, "r")
        first = time.monotonic() + 1.0
        ex.fence("r", 2, first)
        ex.fence("r", 1, 0.0)  # another epoch: ignored
        ex.fence("unknown", 2, 0.0)  # an unknown task: ignored
        while time.monotonic() < first + 1.0:  # renew well before each TERM point
            ex.fence("r", 2, time.monotonic() + 1.5)
            await trio.sleep(0.2)
        assert alive(command) and "r" in ex.running()
        last = time.monotonic() + 1.5
        ex.fence("r", 2, last)
        ended = await next_exit(ex)
        at = time.monotonic()
    assert ended.reason == "cancelled" and ended.detail == "fenced", ended
    assert ended.stdout_tail.count(b"term ") == 1  # only the lapsed fence sent one
    assert last <= at < last + 1.0
    assert not alive(command)


async def test_stop_with_a_short_grace(tmp_path: Path) -> None:
    async with executor(tmp_path, grace_period=30.0) as ex:
        ex.start("s", 1, python(_TERM_NOTING), [])
        command = await _up(ex, "s")
        asked = time.monotonic()
        ex.stop("s", "lease lost", grace=0.2)
        ended = await next_exit(ex)
        took = time.monotonic() - asked
    assert ended.reason == "cancelled" and ended.detail == "lease lost"
    assert b"term " in ended.stdout_tail and ended.exit_code == -9
    assert 0.2 <= took < 2.0, took  # not the configured 30 s
    assert not alive(command)


async def test_a_restarted_executor_kills_what_an_earlier_one_left(tmp_path: Path) -> None:
    """`run` reaps before it reports started, and `reap_leftovers` gives the lease
    service the same answer (the cases of reaping: tests/executor/test_leftovers.py)."""
    running = tmp_path / "tasks" / ".running"
    left = subprocess.Popen(
        ["sh", "-c", "sleep 300 & echo $!; wait"], start_new_session=True, stdout=subprocess.PIPE
    )
    assert left.stdout is not None
    grandchild = int(left.stdout.readline())
    Leftovers(running).record("left", 3, left.pid, None)
    try:
        async with executor(tmp_path) as ex:
            assert not alive(left.pid) and not alive(grandchild)
            assert await ex.reap_leftovers() == [("left", 3)]
            assert await ex.reap_leftovers() == [("left", 3)]  # once per service
        assert list(running.iterdir()) == []
        assert left.wait(timeout=10) == -9
    finally:
        left.kill()
        left.wait()


async def test_a_running_task_has_a_record_until_it_ends(tmp_path: Path) -> None:
    running = tmp_path / "tasks" / ".running"
    async with executor(tmp_path) as ex:
        ex.start("rec", 7, python(_TERM_NOTING), [])
        await _up(ex, "rec")
        record = json.loads((running / "rec-7.json").read_text())
        assert (record["task_id"], record["epoch"]) == ("rec", 7)
        assert record["pgid"] == ex.running()["rec"].pid
        ex.stop("rec", "done", grace=0)
        await next_exit(ex)
        assert list(running.iterdir()) == []


async def test_a_deadline_already_past_fences_at_once_and_nonsense_is_refused(
    tmp_path: Path,
) -> None:
    async with executor(tmp_path, grace_period=30.0) as ex:
        ex.start("late", 1, python(_TERM_NOTING), [], deadline=time.monotonic() - 1.0)
        late = await next_exit(ex)
        ex.start("nan", 1, python(_TERM_NOTING), [], deadline=float("nan"))
        nan = await next_exit(ex)
    assert late.reason == "cancelled" and late.detail == "fenced", late
    assert nan.reason == "start_failed" and "finite" in nan.detail, nan


async def test_a_zero_fence_grace_kills_at_the_deadline_without_a_term(tmp_path: Path) -> None:
    async with executor(tmp_path, grace_period=30.0) as ex:
        deadline = time.monotonic() + 1.0
        ex.start("z", 1, python(_TERM_NOTING), [], deadline=deadline, fence_grace=0)
        command = await _up(ex, "z")
        gone = _frozen_until_gone(command, deadline + 5.0)
        ended = await next_exit(ex)
    assert deadline <= gone < deadline + 0.3, gone - deadline
    assert ended.detail == "fenced" and b"term " not in ended.stdout_tail, ended
