"""`group_usage`: a process group's live members, summed RSS and CPU time, from /proc.

Against a fake /proc for the parsing (a command name with spaces and ')', zombies,
malformed lines, other groups, skipped pids), and against real processes for what the
kernel writes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from populi_p2p.executor import _proc
from populi_p2p.executor._proc import GroupUsage, SharedScan, group_usage

PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def _stat(
    pid: int, comm: str, state: str, pgrp: int, times: tuple[object, ...], rss: object
) -> str:
    """A /proc/PID/stat line: fields 14-17 are utime, stime, cutime, cstime; 24 is RSS."""
    fields = [state, "1", str(pgrp), "0", "0", "0", "0", "0", "0", "0", "0"]
    fields += [str(t) for t in times] + ["20", "0", "1", "0", "0", "0", str(rss), "0"]
    return f"{pid} ({comm}) " + " ".join(fields)


@pytest.fixture
def fake_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(_proc, "_PROC", tmp_path)
    return tmp_path


def _process(proc: Path, pid: int | str, line: str) -> None:
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "stat").write_text(line)


def test_the_group_is_summed_over_its_live_members(fake_proc: Path) -> None:
    _process(fake_proc, 10, _stat(10, "wrapper", "S", 10, (1, 1, 0, 0), 100))
    _process(fake_proc, 11, _stat(11, "a ) tricky (name", "R", 10, (2 * TICKS, TICKS, 0, 0), 5))
    _process(fake_proc, 12, _stat(12, "child", "S", 10, (0, 0, TICKS, TICKS), 7))
    _process(fake_proc, 13, _stat(13, "zombie", "Z", 10, (TICKS, 0, 0, 0), 0))
    _process(fake_proc, 14, _stat(14, "other", "R", 99, (TICKS, 0, 0, 0), 50))
    _process(fake_proc, 15, "15 (short) S 1 10 0")  # too few fields
    _process(fake_proc, 16, _stat(16, "bad", "S", 10, ("x", 1, 1, 1), 1))
    _process(fake_proc, 17, _stat(17, "bad", "S", 10, (1, 1, 1, 1), "nope"))
    (fake_proc / "self").mkdir()  # not a pid
    (fake_proc / "18").mkdir()  # gone mid-read: no stat
    usage = group_usage(10, skip=[10, None])
    assert usage == GroupUsage(members=2, rss=12 * PAGE, cpu_time=5.0)
    everyone = group_usage(10)
    assert everyone.members == 3 and everyone.rss == 112 * PAGE


def test_no_proc_means_nothing_to_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_proc, "_PROC", tmp_path / "missing")
    assert group_usage(1) == GroupUsage(0, 0, 0.0)


def _wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + 30.0
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_real_group_with_a_child_and_then_as_zombies() -> None:
    """A leader and its child in a group of their own; once both have exited (the
    leader not yet reaped), the group has no live member left."""
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 300 & echo $!; read line; kill $!"],
        start_new_session=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert leader.stdout is not None and leader.stdin is not None
        child = int(leader.stdout.readline())
        usage = group_usage(leader.pid)
        assert usage.members == 2 and usage.rss > 0
        assert group_usage(leader.pid, skip=[leader.pid, child]).members == 0
        leader.stdin.write(b"done\n")
        leader.stdin.close()
        stat = Path(f"/proc/{leader.pid}/stat")
        _wait_for(lambda: stat.read_bytes().rpartition(b")")[2].split()[0] == b"Z", "no zombie")
        _wait_for(lambda: group_usage(leader.pid).members == 0, "the child lives on")
    finally:
        leader.kill()
        leader.wait()


def test_cpu_time_counts_what_the_group_burnt() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    worker = subprocess.Popen(
        [sys.executable, "-c", burn + "input()"], start_new_session=True, stdin=subprocess.PIPE
    )
    try:
        _wait_for(lambda: group_usage(worker.pid).cpu_time >= 0.3, "no CPU time counted")
    finally:
        worker.kill()
        worker.wait()


def test_one_scan_serves_every_task_until_the_next_is_due(fake_proc: Path) -> None:
    _process(fake_proc, 10, _stat(10, "a", "S", 10, (TICKS, 0, 0, 0), 1))
    _process(fake_proc, 20, _stat(20, "b", "S", 20, (TICKS, 0, 0, 0), 1))
    now = [0.0]
    scan = SharedScan(1.0, clock=lambda: now[0])
    assert scan.usage(10).members == 1 and scan.usage(20).members == 1
    _process(fake_proc, 11, _stat(11, "a2", "S", 10, (TICKS, 0, 0, 0), 1))
    now[0] = 0.9
    assert scan.usage(10).members == 1, "the same scan, not read again"
    assert scan.usage(10, not_before=0.5).members == 2, "unless it predates not_before"
    assert scan.usage(10, not_before=0.5).members == 2  # (this one does not)
    _process(fake_proc, 12, _stat(12, "a3", "S", 10, (TICKS, 0, 0, 0), 1))
    now[0] = 1.0
    assert scan.usage(10).members == 2, "the fresh scan at 0.9 holds until 1.9"
    now[0] = 1.9
    assert scan.usage(10).members == 3 and scan.usage(10, skip=[11]).members == 2


def test_a_slow_scan_is_taken_less_often(fake_proc: Path) -> None:
    """A scan costs what the machine's process count makes it: its interval grows so
    that scanning takes at most `budget` of the time."""
    _process(fake_proc, 10, _stat(10, "a", "S", 10, (TICKS, 0, 0, 0), 1))
    ticks = iter([0.0, 0.1, 0.5, 4.9, 5.0, 5.1])  # each scan takes 0.1 s
    scan = SharedScan(0.25, budget=0.02, clock=lambda: next(ticks))
    scan.usage(10)  # scanned at 0.0 (took 0.1 s): the next is due at 5.0
    _process(fake_proc, 11, _stat(11, "a2", "S", 10, (TICKS, 0, 0, 0), 1))
    assert scan.usage(10).members == 1  # at 0.5
    assert scan.usage(10).members == 1  # at 4.9
    assert scan.usage(10).members == 2  # at 5.0: scanned again
