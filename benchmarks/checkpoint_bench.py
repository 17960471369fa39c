"""Time from kill -9 of a checkpointed task's owner to the resumed start (issue 22).

The ownership lab (`tests/history/scenario.py`): 3 `populi-node up` daemons on loopback,
``--preset local``. Each run starts a fresh lab and submits the "training" task of
`tests/history/trainer.py` (100 steps of 0.05 s, a snapshot asked at each step, k = 2
holders), kills its owner with kill -9 at step 30 (`--kill-at`), and measures, on one
clock (the daemons and the task run on this machine):

* **detected**: kill -> every survivor's SWIM view holds the owner dead;
* **resumed**: kill -> the resumed run's first line (the task's own ``resume`` line,
  written after the snapshot was restored and the process started);
* **restore**: the new owner's fetch and unpack of the snapshot (its
  ``checkpoint.restored`` log line), the snapshot's size, and whether the new owner
  held it already (with 3 daemons and k = 2 every survivor does; `--daemons 5` makes a
  fetch likely);
* the step it resumed from, against the step logged before the kill.

Prints one line per run, then the medians and the load average. Usage::

    python benchmarks/checkpoint_bench.py            # 3 runs
    python benchmarks/checkpoint_bench.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.history import trainer
from tests.history.scenario import Lab, poll, task_python

_RESTORED = re.compile(r"checkpoint\.restored .*size=(\d+) seconds=([0-9.]+) local=(\w+)")


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def _last_step(path: Path) -> int:
    return max((r["step"] for r in _lines(path) if r["event"] == "step"), default=0)


def one_run(kill_at: int, timeout: float, daemons: int = 3) -> dict[str, Any]:
    lab = Lab(daemons)
    try:
        lab.start(timeout=120)
        script = lab.root / "trainer.py"
        shutil.copy(trainer.__file__, script)
        script.chmod(0o644)
        command = [task_python(), str(script), str(lab.logdir), "100", "0.05"]
        tid = lab.submit(0, 0.0, command=command, checkpoint_every=0.0)
        assert tid is not None, "the submit was not acknowledged"
        steps = lab.logdir / f"{tid}.steps"
        if not poll(lambda: _last_step(steps) >= kill_at, timeout, 0.01):
            raise TimeoutError(f"the task never reached step {kill_at}")
        assert lab.kill_owner([tid]) == tid
        killed = lab.killed[0]
        before = _last_step(steps)
        gone = next(d.node_id for d in lab.mesh.daemons if d.name == killed.node)

        def dead_everywhere() -> bool:
            return all(
                any(m["node_id"] == gone and m["state"] in ("dead", "left") for m in d.members())
                for d in lab.live.values()
            )

        poll(dead_everywhere, timeout, 0.01)
        detected = time.time() - killed.killed_at
        resumes = lambda: [r for r in _lines(steps) if r["event"] == "resume"]  # noqa: E731
        if not poll(lambda: len(resumes()) >= 2, timeout, 0.01):
            seen = [r for r in _lines(steps) if r["event"] != "step"]
            raise TimeoutError(f"the task never resumed: {seen}")
        resumed = resumes()[1]
        restore = [m for d in lab.live.values() if (m := _RESTORED.search(d.log()))]
        return {
            "detected": detected,
            "resumed": resumed["time"] - killed.killed_at,
            "restore": float(restore[0].group(2)) if restore else float("nan"),
            "size": int(restore[0].group(1)) if restore else 0,
            "local": restore[0].group(3) == "True" if restore else None,
            "from_step": resumed["from_step"],
            "logged_step": before,
        }
    finally:
        lab.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=30)
    parser.add_argument("--daemons", type=int, default=3, help="3: every survivor holds it")
    parser.add_argument("--timeout", type=float, default=120.0, help="each wait's deadline")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    for run in range(args.runs):
        row = one_run(args.kill_at, args.timeout, args.daemons)
        rows.append(row)
        print(f"run {run}: SWIM detection {row['detected']:.2f} s, resumed start"
              f" {row['resumed']:.2f} s after the kill, restore {row['restore'] * 1000:.0f} ms"
              f" ({row['size']} bytes, {'held already' if row['local'] else 'fetched'}),"
              f" resumed from step {row['from_step']}"
              f" (step {row['logged_step']} logged at the kill)", flush=True)  # fmt: skip
    load_after = os.getloadavg()
    med = {k: statistics.median(r[k] for r in rows) for k in ("detected", "resumed", "restore")}
    print(f"median of {len(rows)}: detection {med['detected']:.2f} s, kill -> resumed start"
          f" {med['resumed']:.2f} s, restore {med['restore'] * 1000:.0f} ms; load average"
          f" {load_before[0]:.2f} -> {load_after[0]:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
