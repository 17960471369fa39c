"""One owner per task, measured from outside on real daemons (issue 17).

Five `populi-node up` daemons on loopback (`--preset local`) run probe tasks
(`probe.py`); the history (each run's start and end, the client's submits and acks,
the final tables, the killed daemon's task groups) goes through `checker.check`, which
must find nothing. Each test also checks that the history is not empty of the thing it
tests, so a probe that never ran cannot pass for a clean history.

The first two failed on the code before issue 17's lease agent (duplicate and
overlapping runs; a killed owner's task ran on); the third (a spec at the limits)
failed to submit at all.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.history.scenario import Lab, poll


@pytest.fixture
def lab() -> Iterator[Lab]:
    lab = Lab(5)
    try:
        yield lab
    finally:
        lab.stop()


@pytest.mark.slow
def test_a_burst_from_three_submitters_runs_each_task_once(lab: Lab) -> None:
    lab.start(timeout=60)
    tids = lab.burst(tasks=10, submitters=3, seconds=1.5)
    assert len(tids) == 10
    settled = lab.settle(tids, timeout=40)
    report = lab.report()
    assert report.ok, "\n".join(report.lines())
    assert settled, "the tasks never finished and agreed everywhere"
    assert report.acknowledged == 10 and report.runs == 10, report.summary()


@pytest.mark.slow
def test_a_killed_owners_task_finishes_elsewhere_and_dies_with_it(lab: Lab) -> None:
    lab.start(timeout=60)
    (tid,) = lab.burst(tasks=1, submitters=1, seconds=8)
    assert lab.wait_running([tid], timeout=20), "the task never started"
    assert lab.kill_owner([tid]) == tid
    (killed,) = lab.killed
    assert killed.gone_at, "the killed owner had no task process to watch"
    settled = lab.settle([tid], timeout=40)
    report = lab.report()
    assert report.ok, "\n".join(report.lines())
    assert settled, "the task never finished and agreed everywhere"
    after = [e for e in lab.events() if e.event == "end" and e.time > killed.killed_at]
    assert [e.node for e in after if e.node == killed.node] == []
    assert len(after) == 1 and report.runs == 2, report.summary()


@pytest.mark.slow
def test_a_spec_at_the_limits_travels_and_runs_once(lab: Lab) -> None:
    """A 4 KiB command and a 4 KiB environment: over a datagram, so the replicas get
    the spec over a stream and the other members by push-pull."""
    lab.start(timeout=60)
    filler = "x" * 3500  # plus the probe's own arguments: about 4 KiB of command
    env = {f"K{i}": "v" * 120 for i in range(30)}  # 30 x 122 bytes: 3.6 KiB
    tid = lab.submit(0, 1.0, command=[*lab.command(1.0), filler], env=env)
    assert tid is not None, "the submit was not acknowledged"
    settled = lab.settle([tid], timeout=60)
    report = lab.report()
    assert report.ok, "\n".join(report.lines())
    assert settled, "the task never finished and agreed everywhere"
    assert report.runs == 1, report.summary()


@pytest.mark.slow
def test_in_a_mesh_of_two_the_others_sleep_stops_nothing() -> None:
    """Two members (a desktop and a laptop): the laptop sleeps (SIGSTOP) for longer than
    the granters' wait, and the task the desktop runs goes on. The node a task is placed
    on is its replica set's primary, which decides alone in a set of two (docs/leases.md,
    "Small meshes"). Before, both had to be up, and the owner fenced its task."""
    lab = Lab(2)
    try:
        lab.start(timeout=60)
        (tid,) = lab.burst(tasks=1, submitters=1, seconds=14)
        assert lab.wait_running([tid], timeout=20), "the task never started"
        (run,) = lab.live_runs([tid])
        other = next(d for name, d in lab.live.items() if name != run.node)
        other.proc.send_signal(signal.SIGSTOP)
        try:
            # 7 s asleep: past lease_ttl * clock_margin (5 s in the local preset).
            died = poll(lambda: not lab.live_runs([tid]), timeout=7.0, interval=0.1)
        finally:
            other.proc.send_signal(signal.SIGCONT)
        assert not died, "the owner stopped its task while the other member slept"
        settled = lab.settle([tid], timeout=60)
        report = lab.report()
        assert report.ok, "\n".join(report.lines())
        assert settled, "the task never finished and agreed everywhere"
        assert report.runs == 1, report.summary()
    finally:
        lab.stop()
