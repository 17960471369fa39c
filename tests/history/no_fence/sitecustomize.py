"""The partition test's control (tests/netns/test_partition.py): a daemon whose
PYTHONPATH starts with this directory never fences its tasks. Python imports this
module at start-up (`site`); the task wrapper runs with ``-I -S`` and an empty
environment, so it never does.

Two fences are switched off, as in tests/leases/test_agent_cluster.py's control: the
agent gives a lapsed lease up but stops nothing, and the wrapper gets a deadline a day
away instead of the lease's.
"""

from __future__ import annotations

import time
from typing import Any

from populi_p2p.leases.agent import LeaseAgent
from populi_p2p.leases.driver.service import LeaseService

_real_stop = LeaseAgent._stop


def _no_fence(self: LeaseAgent, tid: str, o: Any, reason: str) -> list[Any]:
    if reason != "fenced":
        return _real_stop(self, tid, o, reason)
    o.stopping = "ignored"
    return []


def _far(self: LeaseService, deadline: float) -> float:
    return time.monotonic() + 86400.0


LeaseAgent._stop = _no_fence  # type: ignore[method-assign]
LeaseService._monotonic = _far  # type: ignore[method-assign]
