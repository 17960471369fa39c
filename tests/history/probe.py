"""The task probe: run as a task's command, it records each run of the task from outside
the daemon's own tables (docs/leases.md, STYLE.md lesson 21).

    python3 probe.py LOGDIR SECONDS [EXIT]

It reads ``POPULI_TASK_ID`` and ``POPULI_TASK_EPOCH`` (set by the executor), then:

1. takes ``flock(LOCK_EX | LOCK_NB)`` on ``LOGDIR/<task>.lock`` and keeps it while it
   lives (the kernel drops it when the process dies, however it dies). A refusal means
   another run of this task is alive at this instant: it appends an ``overlap`` line
   and carries on (without the lock);
2. appends a ``start`` line, sleeps SECONDS, appends an ``end`` line, exits EXIT.

Lines go to ``LOGDIR/<task>.log``, one JSON object each, written with one ``write`` to
an ``O_APPEND`` descriptor, so the runs of one task never tear each other's lines:
``{"task", "epoch", "event", "time", "pid", "ppid", "node", "seconds", "locked"}``.
``time`` is ``time.time()`` (the harness runs on the same machine, so one clock).
``ppid`` is the daemon that started the run (the parent of the executor's wrapper, which
stays the command's parent);
``node`` is ``POPULI_NODE`` when the executor sets it (it does not yet: the harness maps
``ppid`` to a daemon). Stdlib only: it runs as ``nobody`` under ``python -I``.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time


def _daemon_pid() -> int:
    """The daemon's pid: our parent, or its parent when our parent is the task wrapper."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            if b"executor/_wrapper.py" not in f.read():
                return parent
        with open(f"/proc/{parent}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return parent


def _line(fd: int, event: str, task: str, epoch: int, seconds: float, locked: bool) -> None:
    record = {
        "task": task,
        "epoch": epoch,
        "event": event,
        "time": time.time(),
        "pid": os.getpid(),
        "ppid": _daemon_pid(),
        "node": os.environ.get("POPULI_NODE"),
        "seconds": seconds,
        "locked": locked,
    }
    os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())


def main(argv: list[str]) -> int:
    argv = argv[:4]  # further arguments are padding (a long command line), ignored
    if len(argv) not in (3, 4):
        print("usage: probe.py LOGDIR SECONDS [EXIT]", file=sys.stderr)
        return 2
    logdir, seconds = argv[1], float(argv[2])
    code = int(argv[3]) if len(argv) == 4 else 0
    task = os.environ.get("POPULI_TASK_ID", "unknown")
    epoch = int(os.environ.get("POPULI_TASK_EPOCH", "0"))
    lock = os.open(os.path.join(logdir, f"{task}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    append = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    log = os.open(os.path.join(logdir, f"{task}.log"), append, 0o666)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locked = True
    except BlockingIOError:
        locked = False
        _line(log, "overlap", task, epoch, seconds, locked)
    _line(log, "start", task, epoch, seconds, locked)
    time.sleep(seconds)
    _line(log, "end", task, epoch, seconds, locked)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
