"""A "training" task for the checkpoint tests: it counts to STEPS and resumes from its
checkpoint (docs/artifacts.md, "Checkpoints"). Stdlib only, run beside `probe.py`.

    python3 trainer.py LOGDIR STEPS STEP_SECONDS

Like `probe.py` it holds ``LOGDIR/<task>.lock`` and appends ``start`` and ``end`` probe
lines to ``LOGDIR/<task>.log`` (the ownership history checker reads them). It also
appends to ``LOGDIR/<task>.steps``, one JSON object a line, written from outside the
daemons' state dirs: a ``resume`` line (the step it found in its checkpoint dir and
``$POPULI_RESUMED_FROM``), then one ``step`` line per step. Each step writes the
count to ``$POPULI_CHECKPOINT_DIR/step`` (a temporary file renamed into place), touches
``.request`` and waits (at most 10 s) until the owner has taken it: the snapshot then
holds that step, and the line follows it.
"""

from __future__ import annotations

import fcntl
import json
import os
import runpy
import sys
import time

#: `probe.py`'s functions: it lies beside this file, not on the task's path.
_PROBE = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe.py"))
_line = _PROBE["_line"]

#: The most a step waits for the owner to take its snapshot.
REQUEST_WAIT_S = 10.0


def _append(path: str, record: dict[str, object]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def _read_step(ckpt: str) -> int:
    try:
        with open(os.path.join(ckpt, "step")) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def _checkpoint(ckpt: str, step: int) -> None:
    tmp = os.path.join(ckpt, "step.tmp")
    with open(tmp, "w") as f:
        f.write(str(step))
    os.rename(tmp, os.path.join(ckpt, "step"))
    request = os.path.join(ckpt, ".request")
    with open(request, "w"):
        pass
    deadline = time.monotonic() + REQUEST_WAIT_S
    while os.path.exists(request) and time.monotonic() < deadline:
        time.sleep(0.01)  # the owner's snapshot, polled with a deadline


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: trainer.py LOGDIR STEPS STEP_SECONDS", file=sys.stderr)
        return 2
    logdir, steps, pause = argv[1], int(argv[2]), float(argv[3])
    task = os.environ.get("POPULI_TASK_ID", "unknown")
    epoch = int(os.environ.get("POPULI_TASK_EPOCH", "0"))
    ckpt = os.environ["POPULI_CHECKPOINT_DIR"]
    lock = os.open(os.path.join(logdir, f"{task}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    log = os.open(os.path.join(logdir, f"{task}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                  0o666)  # fmt: skip
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locked = True
    except BlockingIOError:
        locked = False
        _line(log, "overlap", task, epoch, 600.0, locked)
    _line(log, "start", task, epoch, 600.0, locked)
    start = _read_step(ckpt)
    steps_log = os.path.join(logdir, f"{task}.steps")
    _append(steps_log, {"event": "resume", "epoch": epoch, "from_step": start,
                        "resumed_from": os.environ.get("POPULI_RESUMED_FROM"),
                        "time": time.time()})  # fmt: skip
    for step in range(start + 1, steps + 1):
        time.sleep(pause)
        _checkpoint(ckpt, step)
        _append(steps_log, {"event": "step", "epoch": epoch, "step": step, "time": time.time()})
    _line(log, "end", task, epoch, 600.0, locked)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
