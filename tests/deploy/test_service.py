"""`replica_state`: a replica's state in words, for `deployments`."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from populi_p2p.deploy.service import replica_state
from populi_p2p.leases import (
    TaskPhase,
    TaskResult,
)

SHA = "cd" * 32


@attrs.frozen
class _Claim:
    owner: str


@attrs.frozen
class _Entry:
    """The part of a `TaskEntry` that `replica_state` reads."""

    phase: TaskPhase
    current: _Claim | None = None
    accepted_result: TaskResult | None = None
    done: bool = False
    task_id: str = "t" * 32

    def finished(self) -> bool:
        return self.done

    def needs_owner(self) -> bool:
        return self.phase in (TaskPhase.PENDING, TaskPhase.FAILED) and not self.done


@pytest.mark.parametrize(
    ("entry", "section", "alive", "expect"),
    [
        (_Entry(TaskPhase.CANCELLED), None, True, "stopped"),
        (_Entry(TaskPhase.PENDING), None, True, "pending: anti_affinity=3"),
        (_Entry(TaskPhase.RUNNING, _Claim("n1")), {"t" * 16: ["fetching", 42.4]}, True,
         "fetching 42%"),
        (_Entry(TaskPhase.RUNNING, _Claim("n1")), {"t" * 16: ["serving", 100]}, True, "serving"),
        (_Entry(TaskPhase.RUNNING, _Claim("n1")), None, True, "starting"),
        (_Entry(TaskPhase.RUNNING, _Claim("n1")), {"t" * 16: "junk"}, True, "starting"),
        (_Entry(TaskPhase.RUNNING, _Claim("n1")), None, False, "owner gone: being placed again"),
        (_Entry(TaskPhase.FAILED, _Claim("n1"), TaskResult(1, b"x\n[populi] exited: boom"), True),
         None, True, "failed: [populi] exited: boom"),
    ],
)  # fmt: skip
def test_replica_state_in_words(entry: Any, section: Any, alive: bool, expect: str) -> None:
    got = replica_state(entry, lambda _n: section, lambda _n: alive, "anti_affinity=3")
    assert got == expect
