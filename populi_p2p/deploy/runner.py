"""`DeploymentRunner`: the node's `TaskRunner`, which runs a deployment's replicas.

The lease service decides that this node owns a replica (a task whose spec has a
`Deployment`) exactly as for any task; this runner then brings it up:

1. **fetching**: the spec's ``model`` input (a blob, by hash) from any holder
   (`BlobService.fetch`, chunks verified, the whole hash checked), then pinned while
   the replica runs (``deploy:<task>``), so no quota eviction takes it;
2. **loading**: the engine (`engine_command`, one place for every kind) is started
   through the executor with the GPUs the lease service allocated, fenced like any
   task; the runner polls the engine's ``/v1/models`` until it lists the model;
3. **serving**: the engine joins the node's `EngineService`, which puts the model in
   the record's ``models`` section, the one the router reads.

Any other spec goes straight to the executor. A stop or a lapsed fence while the
blob is still being fetched ends the replica without a process (``cancelled``), so
the lease service sees exactly one `TaskExited` per `start`, as from the executor.
When the engine exits, it leaves the `EngineService` and the pin is dropped.

Each replica's state here is published in the record's ``deploys`` section
(``{task id[:16]: [state, percent]}``, at most `SECTION_MAX` entries, re-signed at
most every `PUBLISH_EVERY` seconds while a fetch moves), which ``deployments`` reads
on any node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, cast

import attrs
import trio

from .._log import event, get_logger
from ..executor.runner import TaskExited, TaskRunner
from ..leases import TaskSpec
from .engine_command import (
    EngineNotFound,
    engine_command,
    llama_server_binary,
    reachable_by_others,
    resolve_engine,
)

if TYPE_CHECKING:  # imported when a replica first starts: the node answers before
    from ..blobs.fetcher import FetchProgress
    from ..blobs.service import BlobService
    from ..inference.engines import EngineService

__all__ = ["PIN_PREFIX", "SECTION", "DeploymentRunner", "Replica"]

#: The record section that says how each replica here is doing.
SECTION: Final = "deploys"
SECTION_MAX: Final = 16
#: Seconds between re-signed records while only a fetch's percentage moves.
PUBLISH_EVERY: Final = 1.0
#: Pins a replica holds on its model blob: ``deploy:<task id>``.
PIN_PREFIX: Final = "deploy:"
#: Seconds an engine may take to answer with its model before the replica fails.
LOAD_TIMEOUT: Final = 600.0
#: Seconds between polls of a loading engine.
READY_POLL: Final = 0.1
_log = get_logger("deploy")


#: The model's name in the replica's work directory (the engine's working directory).
MODEL_FILE: Final = "model.gguf"
#: The engine binary's name there, when the task user cannot reach the node's copy.
ENGINE_FILE: Final = "llama-server"


class _Executor(TaskRunner, Protocol):
    """The executor as this runner uses it (`ExecutorService`)."""

    def log_path(self, task_id: str, stream: Literal["stdout", "stderr"] = "stdout") -> Path:
        """The latest epoch's stdout here; its directory holds the task's ``work/``."""
        ...


@attrs.define
class Replica:
    """One replica this node owns (what ``deployments`` shows of it)."""

    task_id: str
    epoch: int
    name: str
    state: str = "fetching"  # fetching, loading, serving
    percent: float = 0.0
    url: str | None = None
    digest: bytes = b""
    pinned: bool = False
    link: Path | None = None  # the model's hard link in the engine's work directory
    binary: Path | None = None  # the engine binary to give it there (None: run in place)
    binary_copy: Path | None = None  # that copy, removed with the link
    started: bool = False  # the engine process was handed to the executor
    stop: str | None = None  # why it was stopped before its process started
    deadline: float | None = None  # the fence, time.monotonic()
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    began: float = attrs.field(factory=time.time)


def _give_binary(binary: Path, there: Path) -> Path:
    """`binary` at `there`, runnable by the task user, for an engine binary it cannot
    reach where it is (a ``.venv`` under ``/root``, or under ``/tmp``, which a task
    sees as its own): a hard link when others may run the file (same mode, no bytes
    copied), else, or across file systems, a copy (the node's file keeps its mode)."""
    if os.stat(binary).st_mode & 0o001:  # a link shares the mode, already runnable
        with contextlib.suppress(OSError):
            os.link(binary, there)
            return there
    shutil.copyfile(binary, there)
    os.chmod(there, 0o755)
    return there


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DeploymentRunner:
    """Args:
    executor: runs processes (the node's `ExecutorService`).
    engine: ``up --deploy-engine`` (resolved at each start, so a missing engine is
        the replica's one-line failure, not the daemon's).
    blobs: the blob service, once it runs (None before).
    engines: the node's engine service, once it runs (None before).
    set_section: where the ``deploys`` section goes.
    """

    def __init__(
        self,
        executor: _Executor,
        *,
        engine: str,
        blobs: Callable[[], BlobService | None],
        engines: Callable[[], EngineService | None],
        set_section: Callable[[str, dict[str, Any] | None], Awaitable[None]],
        load_timeout: float = LOAD_TIMEOUT,
    ) -> None:
        self._executor = executor
        self._engine = engine
        self._blobs, self._engines = blobs, engines
        self._set_section = set_section
        self._load_timeout = load_timeout
        self._send, self.exits = trio.open_memory_channel[TaskExited](float("inf"))
        self.replicas: dict[str, Replica] = {}
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()

    ####################################################################################
    # TaskRunner

    def start(
        self, task_id: str, epoch: int, spec: TaskSpec, gpu_uuids: list[str], *,
        deadline: float | None = None,
    ) -> None:  # fmt: skip
        if spec.deployment is None:
            self._executor.start(task_id, epoch, spec, gpu_uuids, deadline=deadline)
            return
        replica = Replica(task_id, epoch, spec.deployment.name, deadline=deadline)
        self.replicas[task_id] = replica
        self._changed.set()
        assert self._nursery is not None, "the deployment runner is not running"
        self._nursery.start_soon(self._bring_up, replica, spec, gpu_uuids)

    def stop(self, task_id: str, reason: str, grace: float | None = None) -> None:
        replica = self.replicas.get(task_id)
        if replica is not None and not replica.started:
            replica.stop = reason
            replica.scope.cancel()
            return
        self._executor.stop(task_id, reason, grace)

    def fence(self, task_id: str, epoch: int, deadline: float) -> None:
        replica = self.replicas.get(task_id)
        if replica is not None and replica.epoch == epoch:
            replica.deadline = deadline
        if replica is None or replica.started:
            self._executor.fence(task_id, epoch, deadline)

    async def reap_leftovers(self) -> list[tuple[str, int]]:
        return await self._executor.reap_leftovers()

    ####################################################################################
    # The service

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._forward)
            nursery.start_soon(self._publish)
            task_status.started()

    def section(self) -> dict[str, Any] | None:
        """The ``deploys`` section: each replica here, its state and fetch percentage."""
        out = {
            tid[:16]: [r.state, round(r.percent, 1)]
            for tid, r in sorted(self.replicas.items())[:SECTION_MAX]
        }
        return out or None

    def loading(self) -> bool:
        return any(r.state != "serving" for r in self.replicas.values())

    async def _publish(self) -> None:
        published: Any = object()
        blobs_seen = False
        while True:
            wait = PUBLISH_EVERY if self.loading() or not blobs_seen else float("inf")
            with trio.move_on_after(wait):
                await self._changed.wait()
            self._changed = trio.Event()
            if not blobs_seen and self._blobs() is not None:
                blobs_seen = True
                self._sweep_pins()
            section = self.section()
            if section != published:
                published = section
                await self._set_section(SECTION, section)
                await trio.sleep(PUBLISH_EVERY / 4)  # a burst of changes, one record

    def _sweep_pins(self) -> None:
        """Pins left by replicas of an earlier run of this daemon (a kill -9)."""
        blobs = self._blobs()
        assert blobs is not None
        for entry in blobs.store.entries():
            for pin in list(entry.pins):
                if pin.startswith(PIN_PREFIX) and pin[len(PIN_PREFIX) :] not in self.replicas:
                    blobs.store.unpin(entry.digest, pin)

    async def _forward(self) -> None:
        """The executor's ends, after a replica's engine leaves the node's engines."""
        async for ended in self._executor.exits:
            replica = self.replicas.get(ended.task_id)
            if replica is not None and replica.epoch == ended.epoch:
                self._retire(replica, f"{ended.reason}: {ended.detail}")
            await self._send.send(ended)

    def _retire(self, replica: Replica, why: str) -> None:
        self.replicas.pop(replica.task_id, None)
        replica.scope.cancel()  # the readiness poll, if still going
        engines, blobs = self._engines(), self._blobs()
        if replica.url is not None and engines is not None:
            engines.remove(replica.url)
        if replica.pinned and blobs is not None:
            blobs.store.unpin(replica.digest, PIN_PREFIX + replica.task_id)
        for made in (replica.link, replica.binary_copy):
            if made is not None:
                with contextlib.suppress(OSError):
                    made.unlink()
        self._changed.set()
        event(_log, 20, "deploy.replica_ended", task=replica.task_id, model=replica.name,
              why=why)  # fmt: skip

    ####################################################################################
    # Bringing a replica up

    async def _bring_up(self, replica: Replica, spec: TaskSpec, gpus: list[str]) -> None:
        from ..blobs.fetcher import FetchError
        from ..blobs.store import QuotaError

        argv: tuple[list[str], dict[str, str]] | None = None
        failure = ""
        with replica.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_fence, replica)
                try:
                    argv = await self._prepare(replica, spec, len(gpus))
                except (FetchError, QuotaError, EngineNotFound, LookupError, OSError,
                        ValueError) as exc:  # fmt: skip
                    failure = str(exc) or type(exc).__name__
                nursery.cancel_scope.cancel()
        if argv is None:
            reason = "cancelled" if replica.stop else "start_failed"
            self._retire(replica, replica.stop or failure)
            now = time.time()
            await self._send.send(TaskExited(
                replica.task_id, replica.epoch, None, reason, b"", failure.encode()[-200:],
                replica.began, now, detail=replica.stop or failure,
            ))  # fmt: skip
            return
        command, env = argv
        replica.state, replica.started = "loading", True
        self._changed.set()
        run_spec = attrs.evolve(spec, command=cast(Any, command), env={**spec.env, **env})
        self._executor.start(replica.task_id, replica.epoch, run_spec, gpus,
                             deadline=replica.deadline)  # fmt: skip
        self._give_model(replica)  # before the executor's supervisor spawns the engine
        replica.scope = trio.CancelScope()
        with replica.scope:
            await self._await_ready(replica)

    def _give_model(self, replica: Replica) -> None:
        """A hard link to the blob in the engine's work directory, readable by the task's
        user (the store is the daemon's alone, 0700): the engine opens ``model.gguf``
        from its working directory. Called right after `start`, which made the
        directory, and before the engine runs (its supervisor starts it at the next
        checkpoint)."""
        blobs = self._blobs()
        blob = None if blobs is None else blobs.store.path(replica.digest)
        try:
            work = self._executor.log_path(replica.task_id).parent / "work"
            if blob is None or not work.is_dir():
                raise FileNotFoundError("no work directory or no blob")
            os.chmod(blob, 0o644)  # the store's directory stays closed to others
            link = work / MODEL_FILE
            os.link(blob, link)
            replica.link = link
            if replica.binary is not None:
                replica.binary_copy = _give_binary(replica.binary, work / ENGINE_FILE)
        except (OSError, ValueError) as exc:
            event(_log, 30, "deploy.model_link_failed", task=replica.task_id, error=str(exc))

    async def _watch_fence(self, replica: Replica) -> None:
        """A lease that lapses while the blob is fetched stops the replica (`fenced`)."""
        while True:
            await trio.sleep(0.2)
            if replica.deadline is not None and time.monotonic() >= replica.deadline:
                replica.stop = "fenced"
                replica.scope.cancel()

    async def _prepare(
        self, replica: Replica, spec: TaskSpec, gpus: int
    ) -> tuple[list[str], dict[str, str]]:
        """Fetch and pin the model, pick a port: the engine's argv and environment."""
        from ..blobs.fetcher import FetchProgress
        from ..blobs.holders import MODEL_KIND

        model = spec.input("model")
        assert model is not None and spec.deployment is not None
        kind = resolve_engine(self._engine)
        blobs = self._blobs()
        while blobs is None:  # the node is still starting
            await trio.sleep(0.1)
            blobs = self._blobs()
        digest = bytes.fromhex(model.sha256)
        replica.digest = digest
        progress = FetchProgress(digest, spec.deployment.name)
        error: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._track, replica, progress)
            try:
                await blobs.fetch(digest, blobs.holders_of(digest), name=spec.deployment.name,
                                  kind=MODEL_KIND, progress=progress)  # fmt: skip
            except Exception as exc:  # raised below, not as a group from this nursery
                error = exc
            nursery.cancel_scope.cancel()
        if error is not None:
            raise error
        blobs.store.pin(digest, PIN_PREFIX + replica.task_id)
        replica.pinned, replica.percent = True, 100.0
        if blobs.store.path(digest) is None:
            raise LookupError(f"blob {model.sha256[:16]} vanished from the store after fetch")
        port = _free_port()
        replica.url = f"http://127.0.0.1:{port}"
        d = spec.deployment
        binary = llama_server_binary() if kind == "llama-server" else None
        if binary is not None and not reachable_by_others(Path(binary)):
            replica.binary, binary = Path(binary), f"./{ENGINE_FILE}"
        return engine_command(kind, Path(MODEL_FILE), d.name, port, ctx=d.ctx, gpus=gpus,
                              binary=binary)  # fmt: skip

    async def _track(self, replica: Replica, progress: FetchProgress) -> None:
        while True:
            if progress.chunks:
                replica.percent = 100.0 * progress.done / progress.chunks
            self._changed.set()
            await trio.sleep(PUBLISH_EVERY / 2)

    async def _await_ready(self, replica: Replica) -> None:
        """Poll the engine until it lists the model, then let the node serve it."""
        import httpx

        from ..inference.engines import parse_models

        assert replica.url is not None
        deadline = trio.current_time() + self._load_timeout
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            while trio.current_time() < deadline:
                try:
                    response = await http.get(replica.url + "/v1/models")
                    _kind, models = parse_models(response.json())
                    if response.status_code == 200 and replica.name in models:
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                await trio.sleep(READY_POLL)
            else:
                self._executor.stop(replica.task_id, "the engine did not load the model"
                                    f" within {self._load_timeout:.0f} s")  # fmt: skip
                return
        engines = self._engines()
        if engines is not None:
            engines.add(replica.url)
        replica.state = "serving"
        self._changed.set()
        event(_log, 20, "deploy.serving", task=replica.task_id, model=replica.name,
              url=replica.url)  # fmt: skip
