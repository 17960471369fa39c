"""The pieces of deployments alone: the engine command (one place for every kind),
a replica's state in words, the runner's one end per start (a stop or a lapsed lease
while the blob is fetched, a fetch that fails), and the wait for a loading model."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from populi_p2p.blobs.fetcher import FetchError
from populi_p2p.config import NodeConfig
from populi_p2p.deploy.engine_command import (
    ENGINE_KINDS,
    EngineNotFound,
    engine_command,
    resolve_engine,
)
from populi_p2p.deploy.runner import DeploymentRunner
from populi_p2p.deploy.service import replica_state
from populi_p2p.executor.runner import TaskExited
from populi_p2p.inference.completions import CompletionHandler
from populi_p2p.inference.request_log import RequestLog
from populi_p2p.inference.route import RouteDecision
from populi_p2p.leases import (
    BlobInput,
    Deployment,
    Requirements,
    TaskKind,
    TaskPhase,
    TaskResult,
    TaskSpec,
)
from populi_p2p.settings import settings_of

SHA = "cd" * 32


def test_engine_command_for_each_kind() -> None:
    model = Path("/state/blobs/" + SHA)
    argv, env = engine_command("llama-server", model, "qwen", 8123, ctx=4096, gpus=1)
    assert argv[1:] == ["-m", str(model), "--alias", "qwen", "--host", "127.0.0.1", "--port",
                        "8123", "-c", "4096", "-ngl", "999"] and env == {}  # fmt: skip
    argv, _ = engine_command("llama-cpp-python", model, "qwen", 8123)
    assert argv[1:4] == ["-m", "llama_cpp.server", "--model"] and "--n_ctx" not in argv
    assert argv[argv.index("--n_gpu_layers") + 1] == "0"
    argv, env = engine_command("standin", model, "qwen", 8123,
                               environ={"POPULI_STANDIN_DELAY": "1", "HOME": "/root"})  # fmt: skip
    assert argv[1:3] == ["-m", "populi_p2p.testing.standin"] and "--model-file" in argv
    assert env == {"POPULI_STANDIN_DELAY": "1"}  # only the stand-in's own settings pass


def test_engine_kinds_match_the_setting_and_unknown_is_one_line() -> None:
    assert settings_of(NodeConfig)["deploy_engine"].choices == ENGINE_KINDS
    assert resolve_engine("standin") == "standin"
    with pytest.raises(EngineNotFound, match="one of auto"):
        resolve_engine("vllm")


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

    def holders_of(self, digest: bytes) -> list[str]:
        return ["n9"]

    async def fetch(self, digest: bytes, holders: list[str], **kw: Any) -> None:
        if self.fail:
            raise FetchError(self.fail)
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
        runner, executor = await _runner(nursery, _Blobs())
        runner.start("t1", 1, _replica_spec(), [])
        await trio.sleep(0.3)
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


class _Relay:
    async def whole(self, order: Any, path: str, request: Any) -> Any:
        return 200, b'{"ok": true}', order[0], []


def _decision(order: tuple[str, ...]) -> RouteDecision:
    return RouteDecision("qwen", order, {n: (0.5, 0.0, None) for n in order}, {}, {})


async def _ask(handler: CompletionHandler) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]})
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body.encode(), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await handler("/v1/chat/completions", True, receive, send, None)
    return sent[0]["status"], json.loads(sent[-1]["body"])


async def test_a_request_waits_for_a_loading_model_within_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ready_at = trio.current_time() + 5.0

    def decide(model: str) -> tuple[RouteDecision, list[Any]]:
        return _decision(("n1",) if trio.current_time() >= ready_at else ()), []

    handler = CompletionHandler(decide, _Relay(), RequestLog(),  # type: ignore[arg-type]
                                loading=lambda m: m == "qwen", load_wait=60.0)  # fmt: skip
    began = trio.current_time()
    status, body = await _ask(handler)
    assert status == 200 and body == {"ok": True}
    assert 5.0 <= trio.current_time() - began < 5.5
    # Past the bound: a 503 that says so, after load_wait and not before.
    never = CompletionHandler(lambda m: (_decision(()), []), _Relay(), RequestLog(),  # type: ignore[arg-type]
                              loading=lambda m: True, load_wait=7.0)  # fmt: skip
    began = trio.current_time()
    status, body = await _ask(never)
    assert status == 503 and "deployed but no replica" in body["error"]["message"]
    assert 7.0 <= trio.current_time() - began < 7.5
    # A model nobody deployed fails at once, as before.
    unknown = CompletionHandler(lambda m: (_decision(()), []), _Relay(), RequestLog(),  # type: ignore[arg-type]
                                loading=lambda m: False)  # fmt: skip
    began = trio.current_time()
    status, _ = await _ask(unknown)
    assert status in (404, 503) and trio.current_time() == began
