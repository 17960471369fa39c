"""Tasks kept apart (issue 18, row 3), level by level (docs/executor.md, "Isolation"):
a uid per task alone refuses the attack of `tests/attacks/programs.py`; with the
namespaces a task sees only its own processes and its own /tmp, and the wrapper's
guarantees (stop, fence, exit status, nothing left behind) hold through its init."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio

from populi_p2p.executor.service import ExecutorService
from tests.attacks.programs import ATTACKER, SECRET, VICTIM, holding, refusals, state

from .helpers import executor, next_exit, run_one, spec

#: A Python every uid may run (the test's own may sit under a 0700 home).
SYSTEM_PY = "/usr/bin/python3"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a uid per task needs root"),
    pytest.mark.skipif(not os.path.exists(SYSTEM_PY), reason=f"no {SYSTEM_PY} for tasks to run"),
]

#: A range of our own, so that no other executor on this machine hands out the same.
UIDS = (64000, 64015)


def _owned_by(uid: int) -> list[int]:
    """Live processes whose owner is `uid`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and entry.stat().st_uid == uid
                and state(int(entry.name)) != "Z"
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


async def _wait_for_line(ex: ExecutorService, task_id: str, line: bytes) -> None:
    seen = b""
    with trio.fail_after(30):
        async for chunk in ex.follow_log(task_id):
            seen += chunk
            if line in seen:
                return


@pytest.mark.parametrize("namespaces", [False, True], ids=["uids", "full"])
async def test_a_task_cannot_read_or_stop_another(tmp_path: Path, namespaces: bool) -> None:
    async with executor(tmp_path, task_user=None, task_uids=UIDS, namespaces=namespaces) as ex:
        assert ex.isolation is not None
        if namespaces and not ex.isolation.namespaces:
            pytest.skip(f"no namespaces here: {ex.isolation.detail}")
        ex.start("victim", 1, spec(SYSTEM_PY, "-c", VICTIM, timeout=120, POPULI_SECRET=SECRET), [])
        await _wait_for_line(ex, "victim", b"ready\n")
        (pid,) = holding(SECRET)
        secret_file = tmp_path / "tasks" / "victim" / "1" / "work" / "secret"
        attack = spec(SYSTEM_PY, "-c", ATTACKER, str(pid), SECRET, str(secret_file))
        ended = await run_one(ex, "attacker", attack)
        output = (tmp_path / "tasks" / "attacker" / "1" / "stdout").read_text()
        assert ended.succeeded, (ended, output)
        assert state(pid) in ("S", "R")  # not stopped
        ex.stop("victim", "done")
        await next_exit(ex)
    tries = refusals(output)
    assert "LEAK" not in output, output
    if namespaces:  # the victim is nowhere in the attacker's world
        assert {tries[w] for w in ("environ", "cwd-file", "stop")} <= {"ENOENT", "ESRCH"}
    else:  # in sight, but another uid's
        assert (tries["environ"], tries["cwd-file"], tries["stop"]) == ("EACCES",) * 2 + ("EPERM",)
        assert tries["work-file"] == "EACCES"


async def test_an_isolated_task_sees_only_its_own_processes_and_tmp(tmp_path: Path) -> None:
    mark = f"populi-isolation-{os.getpid()}-{time.monotonic_ns()}"
    code = (
        "import os\n"
        f"open('/tmp/{mark}', 'w').write('x')\n"
        "print(os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(sorted(os.listdir('/tmp')), os.listdir('/dev/shm'))\n"
    )
    async with executor(tmp_path, task_user=None, task_uids=UIDS) as ex:
        assert ex.isolation is not None
        if not ex.isolation.namespaces:
            pytest.skip(f"no namespaces here: {ex.isolation.detail}")
        first = await run_one(ex, "first", spec(SYSTEM_PY, "-c", code))
        second = await run_one(
            ex, "second", spec(SYSTEM_PY, "-c", "import os; print(os.listdir('/tmp'))")
        )
    assert first.succeeded and second.succeeded, (first, second)
    pids, listing = first.stdout_tail.decode().splitlines()
    assert pids == "2 [1, 2]"  # its init and itself: nothing of the host's, nor other tasks'
    assert mark in listing and not Path("/tmp", mark).exists()
    assert (tmp_path / "tasks" / "first" / "1" / "tmp" / mark).exists()  # its own tmp, on disk
    assert mark not in second.stdout_tail.decode()


async def test_the_wrappers_guarantees_hold_through_the_tasks_init(tmp_path: Path) -> None:
    async with executor(tmp_path, task_user=None, task_uids=UIDS, grace_period=0.5) as ex:
        assert ex.isolation is not None
        if not ex.isolation.namespaces:
            pytest.skip(f"no namespaces here: {ex.isolation.detail}")
        # The command's own end, exit code or signal, is the task's.
        assert (await run_one(ex, "seven", spec("sh", "-c", "exit 7"))).exit_code == 7
        term = await run_one(ex, "term", spec("sh", "-c", "kill -TERM $$; sleep 5"))
        assert (term.reason, term.exit_code) == ("exited", -15)
        # A stop ends a TERM-ignoring tree, background children included, within grace.
        tree = spec("sh", "-c", "trap '' TERM; sleep 100 & sleep 100 & echo up; wait")
        ex.start("tree", 1, tree, [])
        await _wait_for_line(ex, "tree", b"up\n")
        uid = int(ex.running()["tree"].user.split()[1])
        assert len(_owned_by(uid)) == 3
        ex.stop("tree", "enough")
        stopped = await next_exit(ex)
        assert (stopped.reason, stopped.exit_code) == ("cancelled", -9)
        assert _owned_by(uid) == []
        # The fence kills the tree by itself at its deadline.
        fenced = spec("sh", "-c", "sleep 100 & sleep 100")
        ex.start("fenced", 1, fenced, [], deadline=time.monotonic() + 0.5, fence_grace=0.2)
        ended = await next_exit(ex)
        assert (ended.reason, ended.detail) == ("cancelled", "fenced")
    assert not [p for u in range(UIDS[0], UIDS[1] + 1) for p in _owned_by(u)]
