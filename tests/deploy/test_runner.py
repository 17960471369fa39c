"""`DeploymentRunner`: one end per start (a stop or a lapsed lease while the blob is
fetched, a fetch that fails)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio
import trio.testing

from populi_p2p.blobs.fetcher import FetchError
from populi_p2p.deploy.runner import DeploymentRunner
from populi_p2p.executor.runner import TaskExited
from populi_p2p.leases import (
    BlobInput,
    Deployment,
    Requirements,
    TaskKind,
    TaskSpec,
)

SHA = "cd" * 32


def _replica_spec() -> TaskSpec:
    return TaskSpec(
        TaskKind.INFERENCE, Requirements(), ["populi-engine", "qwen"], submitted_by="n0",
        inputs=[BlobInput("model", SHA, 10)], deployment=Deployment("qwen", 0, 1),
    )  # fmt: skip


class _Executor:
    def __init__(self) -> None:
        self.started: list[tuple[str, TaskSpec]] = []
        self.stopped: list[str] = []
        self._send, self.exits = trio.open_memory_channel[TaskExited](10)

    def start(self, task_id: str, epoch: int, spec: TaskSpec, gpus: list[str], *,
              deadline: float | None = None) -> None:  # fmt: skip
        self.started.append((task_id, spec))

    def stop(self, task_id: str, reason: str, grace: float | None = None) -> None:
        self.stopped.append(task_id)

    def fence(self, task_id: str, epoch: int, deadline: float) -> None:
        pass

    async def reap_leftovers(self) -> list[tuple[str, int]]:
        return []

    def log_path(self, task_id: str, stream: str = "stdout") -> Path:
        raise FileNotFoundError(task_id)


class _Blobs:
    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail
        self.store = self
        self.fetching = trio.Event()  # set once a fetch is under way

    def holders_of(self, digest: bytes) -> list[str]:
        return ["n9"]

    async def fetch(self, digest: bytes, holders: list[str], **kw: Any) -> None:
        if self.fail:
            raise FetchError(self.fail)
        self.fetching.set()
        await trio.sleep_forever()

    def entries(self) -> list[Any]:
        return []


async def _runner(nursery: trio.Nursery, blobs: _Blobs) -> tuple[DeploymentRunner, _Executor]:
    executor = _Executor()

    async def set_section(_name: str, _value: Any) -> None:
        pass

    runner = DeploymentRunner(executor, engine="standin", blobs=lambda: blobs,  # type: ignore[arg-type]
                              engines=lambda: None, set_section=set_section)  # fmt: skip
    await nursery.start(runner.run)
    return runner, executor


async def test_a_stop_while_fetching_ends_the_replica_once_without_a_process() -> None:
    async with trio.open_nursery() as nursery:
        blobs = _Blobs()
        runner, executor = await _runner(nursery, blobs)
        runner.start("t1", 1, _replica_spec(), [])
        await blobs.fetching.wait()
        assert runner.section() == {"t1": ["fetching", 0.0]}
        runner.stop("t1", "cancel")
        ended = await runner.exits.receive()
        assert (ended.task_id, ended.reason, ended.detail) == ("t1", "cancelled", "cancel")
        assert executor.started == [] and runner.replicas == {}
        # A lease that lapses while fetching: released as ``fenced``.
        runner.start("t2", 3, _replica_spec(), [], deadline=time.monotonic() + 0.3)
        ended = await runner.exits.receive()
        assert (ended.task_id, ended.epoch, ended.detail) == ("t2", 3, "fenced")
        nursery.cancel_scope.cancel()


async def test_a_failed_fetch_is_a_failed_start_with_its_reason() -> None:
    async with trio.open_nursery() as nursery:
        runner, executor = await _runner(nursery, _Blobs(fail="no holder could serve it"))
        runner.start("t1", 1, _replica_spec(), [])
        ended = await runner.exits.receive()
        assert ended.reason == "start_failed" and "no holder" in ended.detail
        assert executor.started == []
        # Any other task goes to the executor as it is.
        plain = TaskSpec(TaskKind.BATCH, Requirements(), ["true"], submitted_by="n0")
        runner.start("t2", 1, plain, [])
        assert executor.started == [("t2", plain)]
        nursery.cancel_scope.cancel()
