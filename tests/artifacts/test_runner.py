"""`ArtifactRunner`: inputs fetched, pinned and placed before the process can run;
outputs stored and held by k members before the end goes on; a stop meanwhile wins."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from populi_p2p.artifacts.files import OutputError
from populi_p2p.artifacts.runner import ArtifactRunner
from populi_p2p.blobs.store import BlobStore
from populi_p2p.executor.runner import TaskExited
from populi_p2p.leases import BlobInput, Requirements, TaskKind, TaskOutput, TaskSpec


class _Inner:
    """Makes the work dir on start (as the executor does), ends on demand."""

    def __init__(self, tasks_dir: Path) -> None:
        self.tasks_dir = tasks_dir
        self.started: list[TaskSpec] = []
        self.send, self.exits = trio.open_memory_channel[TaskExited](10)

    def start(self, task_id: str, epoch: int, spec: TaskSpec, gpus: list[str], *,
              deadline: float | None = None) -> None:  # fmt: skip
        (self.tasks_dir / task_id / str(epoch) / "work").mkdir(parents=True)
        self.started.append(spec)

    def stop(self, task_id: str, reason: str, grace: float | None = None) -> None:
        pass

    def fence(self, task_id: str, epoch: int, deadline: float) -> None:
        pass

    async def reap_leftovers(self) -> list[tuple[str, int]]:
        return []


class _Blobs:
    """A real store; `fetch` copies from a file the test named as "the mesh's"."""

    def __init__(self, root: Path, mesh: dict[str, Path]) -> None:
        self.store = BlobStore(root, 0)
        self.mesh = mesh

    async def fetch(self, digest: bytes, holders: list[str], **kw: Any) -> None:
        self.store.add_file(self.mesh[digest.hex()], "x", kw["kind"])


def _spec(**kw: Any) -> TaskSpec:
    return TaskSpec(TaskKind.BATCH, Requirements(), ["x"], submitted_by="n0", **kw)


def _exit(tid: str, epoch: int, code: int = 0) -> TaskExited:
    return TaskExited(tid, epoch, code, "exited", b"out", b"", time.time(), time.time())


async def _runner(nursery: trio.Nursery, tmp: Path, replicate: Any, mesh: dict[str, Path]):
    inner = _Inner(tmp / "tasks")
    blobs = _Blobs(tmp / "blobs", mesh)
    runner = ArtifactRunner(inner, tasks_dir=tmp / "tasks", me="me", blobs=lambda: blobs,  # type: ignore[arg-type]
                            replicate=replicate, retention=60.0)  # fmt: skip
    await nursery.start(runner.run)
    return runner, inner, blobs


async def test_an_input_is_in_place_before_the_start_and_pinned_while_it_runs(
    tmp_path: Path,
) -> None:
    src = tmp_path / "data.bin"
    src.write_bytes(b"input bytes")
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    async with trio.open_nursery() as nursery:
        runner, inner, blobs = await _runner(nursery, tmp_path, None, {sha: src})
        runner.start("t1", 2, _spec(inputs=[BlobInput("data.bin", sha, 11)]), [])
        with trio.fail_after(5):
            while not inner.started:
                await trio.sleep(0.01)
        work = tmp_path / "tasks" / "t1" / "2" / "work"
        assert inner.started[0].env["POPULI_INPUT_DIR"] == str(work / "inputs")
        assert (work / "inputs" / "data.bin").read_bytes() == b"input bytes"
        assert blobs.store.get(bytes.fromhex(sha)).pins == ["run:t1"]
        await inner.send.send(_exit("t1", 2))
        ended = await runner.exits.receive()
        assert ended.succeeded and blobs.store.get(bytes.fromhex(sha)).pins == []
        nursery.cancel_scope.cancel()


async def test_outputs_go_on_only_once_held_and_a_stop_meanwhile_wins(tmp_path: Path) -> None:
    asked: list[tuple[str, int, list[TaskOutput]]] = []
    hold = trio.Event()

    async def replicate(tid: str, epoch: int, spec: TaskSpec, outputs: list[TaskOutput]):
        asked.append((tid, epoch, outputs))
        await hold.wait()
        return ["me", "n1", "n2"]

    async with trio.open_nursery() as nursery:
        runner, inner, blobs = await _runner(nursery, tmp_path, replicate, {})
        spec = _spec(outputs=["out.txt", "gone"])
        runner.start("t1", 1, spec, [])
        with trio.fail_after(5):
            while not inner.started:
                await trio.sleep(0.01)
        (tmp_path / "tasks" / "t1" / "1" / "work" / "out.txt").write_text("result")
        await inner.send.send(_exit("t1", 1))
        with trio.fail_after(5):
            while not asked:
                await trio.sleep(0.01)
        with trio.move_on_after(0.2):
            await runner.exits.receive()
            pytest.fail("the end went on before its outputs were held")
        hold.set()
        ended = await runner.exits.receive()
        assert ended.succeeded and ended.holders == ("me", "n1", "n2")
        [out] = ended.outputs
        assert out.path == "out.txt" and out.sha256 == hashlib.sha256(b"result").hexdigest()
        assert b"output gone does not exist" in ended.stdout_tail
        pins = blobs.store.get(bytes.fromhex(out.sha256)).pins
        assert len(pins) == 1 and pins[0].startswith("out:t1:")
        # A second run whose lease is superseded while its outputs are replicated: the
        # end is the stop, with no outputs (the result would be fenced out anyway).
        hold = trio.Event()
        runner.start("t2", 4, spec, [])
        with trio.fail_after(5):
            while len(inner.started) < 2:
                await trio.sleep(0.01)
        (tmp_path / "tasks" / "t2" / "4" / "work" / "out.txt").write_text("late")
        await inner.send.send(_exit("t2", 4))
        with trio.fail_after(5):
            while len(asked) < 2:
                await trio.sleep(0.01)
        runner.stop("t2", "superseded")
        ended = await runner.exits.receive()
        assert (ended.reason, ended.detail, ended.outputs) == ("cancelled", "superseded", ())
        nursery.cancel_scope.cancel()


async def test_outputs_nobody_holds_fail_the_epoch_with_the_reason(tmp_path: Path) -> None:
    async def replicate(*_args: Any) -> list[str]:
        raise OutputError("held by 0 of 2 members (n1: quota)")

    async with trio.open_nursery() as nursery:
        runner, inner, _ = await _runner(nursery, tmp_path, replicate, {})
        runner.start("t1", 1, _spec(outputs=["o"]), [])
        with trio.fail_after(5):
            while not inner.started:
                await trio.sleep(0.01)
        (tmp_path / "tasks" / "t1" / "1" / "work" / "o").write_text("x")
        await inner.send.send(_exit("t1", 1))
        ended = await runner.exits.receive()
        assert ended.reason == "outputs" and ended.exit_code == 1
        assert "held by 0 of 2" in ended.detail
        nursery.cancel_scope.cancel()
