"""Run an `ExecutorService` in a test's nursery and wait for one task's end."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from populi_p2p.executor._record import TaskRecord
from populi_p2p.executor.service import ExecutorConfig, ExecutorService, TaskExited
from populi_p2p.leases import Requirements, TaskKind, TaskSpec

PY = sys.executable
#: Longest a test waits for an exit event: far beyond what any task here needs.
EXIT_WAIT = 60.0


def spec(*command: str, timeout: float = 60.0, cpus: float = 0.0, **env: str) -> TaskSpec:
    argv: Any = command  # attrs' `converter=tuple` confuses mypy's inference here
    return TaskSpec(
        kind=TaskKind.BATCH,
        requirements=Requirements(cpu_cores=cpus),
        command=argv,
        env=env,
        timeout=timeout,
        submitted_by="test-node",
    )


def python(code: str, **kw: Any) -> TaskSpec:
    return spec(PY, "-c", code, **kw)


def record(tmp_path: Path, **changes: Any) -> TaskRecord:
    """A `TaskRecord` of task "t", epoch 2, as the service makes one before spawning."""
    fields: dict[str, Any] = {
        "task_id": "t", "epoch": 2, "spec": spec("true"), "gpu_uuids": [],
        "no_network": False, "memory": None, "cpu_time": 60.0, "started_at": 100.0,
        "epoch_dir": tmp_path / "t" / "2",
    }  # fmt: skip
    return TaskRecord(**{**fields, **changes})


@asynccontextmanager
async def executor(tmp_path: Path, **config: Any) -> AsyncIterator[ExecutorService]:
    """A running executor (tasks as root unless the test says otherwise), cancelled after."""
    config.setdefault("task_user", "root")
    config.setdefault("grace_period", 1.0)
    config.setdefault("poll_interval", 0.05)
    service = ExecutorService(ExecutorConfig(tasks_dir=tmp_path / "tasks", **config))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        yield service
        nursery.cancel_scope.cancel()


async def next_exit(service: ExecutorService) -> TaskExited:
    with trio.fail_after(EXIT_WAIT):
        return await service.exits.receive()


async def run_one(service: ExecutorService, task_id: str, task: TaskSpec, **kw: Any) -> TaskExited:
    service.start(task_id, 1, task, kw.pop("gpus", []), **kw)
    ended = await next_exit(service)
    assert ended.task_id == task_id
    return ended


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw.rpartition(b")")[2].split()[0] != b"Z"


def children(pid: int) -> list[int]:
    """`pid`'s child processes (a task's wrapper has one: the command)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
