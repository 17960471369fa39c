"""An opt-in trace of a node's lease path: where a task's time goes between submit and start.

``POPULI_LEASE_TRACE=DIR`` in a daemon's environment makes its lease service append one
JSON line per event to ``DIR/<node id prefix>.jsonl``; unset (the default), nothing is
recorded and nothing is decoded twice. Each line holds ``t`` (``time.time()``: every
daemon of a benchmark runs on one machine, so one clock), ``node`` and ``ev``:

* ``in`` / ``out``: an agent message received or sent (``kind``, ``task``, ``epoch``,
  ``peer``; a renewal's ``leases`` count);
* ``submit`` / ``acked``: the API's submit entered the service / its majority answered;
* ``start``: the agent's `StartTask` handed to the executor;
* ``commit``: one group commit of the store (``rows``; ``ms``, in its worker thread);
* ``step``: a driver wake-up that ran late or long (``late_ms``, ``ms``).

``benchmarks/lease_trace.py`` reads the lines of one run back and prints, per stage, how
long the burst's tasks spent there. It is a measuring aid, not a log: the lines are not
rotated, so it belongs in benchmarks, not in production.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Final

from ..agent_wire import GrantAnswer, Renew, RenewAnswer, RenewDigest, decode
from ..wire import DecodeError

__all__ = ["ENV", "LeaseTrace"]

#: The environment variable naming the trace directory.
ENV: Final = "POPULI_LEASE_TRACE"


class LeaseTrace:
    """One node's trace file, or nothing (`enabled` False) when `ENV` is unset."""

    def __init__(self, node: str, directory: str | None = None) -> None:
        directory = directory if directory is not None else os.environ.get(ENV)
        self.node = node[:12]
        self._file = None
        if directory:
            path = Path(directory) / f"{self.node}.jsonl"
            self._file = path.open("a", buffering=1, encoding="utf-8")

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def note(self, ev: str, **fields: Any) -> None:
        if self._file is not None:
            line = {"t": round(time.time(), 6), "node": self.node, "ev": ev, **fields}
            self._file.write(json.dumps(line) + "\n")

    def message(self, ev: str, peer: str, payload: bytes) -> None:
        """An agent message in or out: its kind, task and epoch (not verified)."""
        if self._file is None:
            return
        try:
            msg = decode(payload)
        except DecodeError:
            self.note(ev, peer=peer[:12], kind="junk")
            return
        fields: dict[str, Any] = {"peer": peer[:12], "kind": type(msg).__name__}
        task = getattr(msg, "task_id", None)
        if task is not None:
            fields["task"] = task
            fields["epoch"] = getattr(msg, "epoch", None)
        if isinstance(msg, Renew | RenewDigest | RenewAnswer):
            fields["seq"] = msg.seq
        if isinstance(msg, Renew):
            fields["leases"] = [t for t, _ in msg.leases]
        if isinstance(msg, GrantAnswer):
            fields["refusal"] = msg.refusal
        self.note(ev, **fields)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
