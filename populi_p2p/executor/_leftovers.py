"""`Leftovers`: a file per running task, so a restarted daemon can kill what outlived it.

A task's processes normally die with the daemon (the wrapper sees its control pipe
close and kills the tree; the command has ``PR_SET_PDEATHSIG``). This is the backstop
for when that chain broke (the wrapper was killed too, or stopped): while a task runs,
``tasks_dir/.running/<task_id>-<epoch>.json`` names its process group (the wrapper's
pid), the wrapper's start time from ``/proc/PID/stat`` (clock ticks since boot), the
boot id and the cgroup. Task ids never hold a dot, so ``.running`` is no task's
directory.

On start-up `reap` kills each recorded group that still has members, with care for pid
reuse: a live process with the group's pid but another start time means the group is
long gone (Linux does not hand out a pid that still names a process group), so nothing
is killed; a record from another boot is simply stale.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any, Final

import trio

from .._log import event, get_logger

__all__ = ["Leftovers", "start_time"]

#: How long `reap` waits for a killed group to be gone before it gives up on it.
REAP_WAIT: Final = 5.0
_POLL: Final = 0.02

_log = get_logger("executor")


def _stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (None: no such process)."""
    fields = _stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _members(pgid: int, since: int) -> list[int]:
    """Live processes in group `pgid` that started no earlier than `since`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat(int(name))
        if fields is None or len(fields) < 20 or fields[0] == b"Z":
            continue
        with contextlib.suppress(ValueError):
            if int(fields[2]) == pgid and int(fields[19]) >= since:
                found.append(int(name))
    return found


class Leftovers:
    """The records of running tasks in `directory`, and the reaping of stale ones."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, task_id: str, epoch: int) -> Path:
        return self.directory / f"{task_id}-{epoch}.json"

    def record(self, task_id: str, epoch: int, pgid: int, cgroup: Path | None) -> None:
        """Write a task's record once its wrapper (pid `pgid`, leading the task's group)
        runs; best effort: a lost record only loses the backstop, never the task."""
        record = {
            "task_id": task_id,
            "epoch": epoch,
            "pgid": pgid,
            "start_time": start_time(pgid),
            "boot_id": _boot_id(),
            "cgroup": str(cgroup) if cgroup is not None else None,
        }
        path = self._path(task_id, epoch)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.with_suffix(".tmp").write_text(json.dumps(record))
            path.with_suffix(".tmp").replace(path)
        except OSError as exc:
            event(_log, 30, "executor.record_failed", task=task_id, error=exc.strerror)

    def forget(self, task_id: str, epoch: int) -> None:
        with contextlib.suppress(OSError):
            self._path(task_id, epoch).unlink(missing_ok=True)

    async def reap(self) -> list[tuple[str, int]]:
        """Kill every recorded task's leftovers and drop its record.

        Returns:
            (task_id, epoch) of each record whose processes are now verified gone
            (killed here, or dead already); a group that would not die keeps its
            record and is left out.
        """
        gone: list[tuple[str, int]] = []
        with contextlib.suppress(FileNotFoundError):
            paths = sorted(self.directory.glob("*.json"))
            for path in paths:
                try:
                    record: dict[str, Any] = json.loads(path.read_text())
                    key = (str(record["task_id"]), int(record["epoch"]))
                except (OSError, ValueError, KeyError, TypeError):
                    path.unlink(missing_ok=True)  # not ours to act on
                    continue
                if await self._kill(record):
                    path.unlink(missing_ok=True)
                    gone.append(key)
        return gone

    async def _kill(self, record: dict[str, Any]) -> bool:
        """SIGKILL the record's group (and cgroup); True once nothing of it is left."""
        if record.get("boot_id") != _boot_id():
            return True  # another boot: nothing of it runs
        pgid, since = int(record["pgid"]), int(record.get("start_time") or 0)
        leader = start_time(pgid)
        if leader is not None and leader != since:
            return True  # the pid names another process now: our group is gone
        cgroup = Path(record["cgroup"]) if record.get("cgroup") else None
        first = True
        with trio.move_on_after(REAP_WAIT):
            while True:
                members = _members(pgid, since)
                procs = b""
                if cgroup is not None:
                    with contextlib.suppress(OSError):
                        (cgroup / "cgroup.kill").write_text("1")
                        procs = (cgroup / "cgroup.procs").read_bytes().strip()
                if not members and not procs:
                    if cgroup is not None:
                        with contextlib.suppress(OSError):
                            cgroup.rmdir()
                    return True
                if first:
                    event(_log, 30, "executor.leftover", task=record["task_id"], pids=members)
                    first = False
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                await trio.sleep(_POLL)
        event(_log, 40, "executor.leftover_survived", task=record["task_id"], pgid=pgid)
        return False
