"""`NodeBackend`, the control API's view of the node: each call goes to the service
that answers it, a cancel of a finished task is a 409 before the lease service is
asked, an operator's proof arrives as an `OperatorProof`, and a service that is not up
yet is one clear line, not a crash."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from populi_p2p.api import ConflictError
from populi_p2p.leases import ClaimRecord, Requirements, TaskEntry, TaskKind, TaskResult, TaskSpec
from populi_p2p.leases._cancel import OperatorProof
from populi_p2p.leases._entry import Phase
from populi_p2p.services.api_backend import NodeBackend
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.operator import OperatorKey, proof_to_json

STARTING = "the node is still starting; try again in a second"


def _entry(*claims: ClaimRecord, retries: int = 1) -> TaskEntry:
    spec = TaskSpec(TaskKind.BATCH, Requirements(), ("x",), retry_limit=retries, submitted_by="n")
    return TaskEntry(spec.task_id(), spec, b"sig", claims)


def _claim(epoch: int, phase: Phase, code: int | None = None) -> ClaimRecord:
    result = None if code is None else TaskResult(code, signature=b"r")
    return ClaimRecord(epoch, 0, "owner", b"s", phase=phase, result=result)


def _backend(**node: Any) -> NodeBackend:
    return NodeBackend(cast(Any, SimpleNamespace(**node)))


class _Recorder:
    """Any method call is recorded as (name, args) and answered with `answer`; the
    methods named in `coroutines` are async."""

    def __init__(self, answer: Any = None, coroutines: str = "") -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.answer = answer
        self.coroutines = set(coroutines.split())

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            self.calls.append((name, args + tuple(kw.items())))
            return self.answer

        async def acall(*args: Any, **kw: Any) -> Any:
            return call(*args, **kw)

        return acall if name in self.coroutines else call


async def test_node_backend_refuses_a_finished_cancel_and_forwards_the_rest() -> None:
    done = _entry(_claim(1, Phase.SUCCEEDED, 0))
    running = _entry(_claim(1, Phase.RUNNING), retries=2)
    cancelled: list[str] = []

    class _Leases:
        def find(self, task_id: str) -> TaskEntry:
            return {"d": done, "r": running}[task_id]

        async def cancel(self, task_id: str, operator: object = None) -> dict[str, Any]:
            cancelled.append(task_id)
            return {"id": task_id, "cancelled": True}

    backend = _backend(leases=_Leases())
    with pytest.raises(ConflictError, match="already succeeded at epoch 1"):
        await backend.cancel("d")
    assert cancelled == []
    assert await backend.cancel("r") == {"id": running.task_id, "cancelled": True}
    assert cancelled == [running.task_id]


async def test_the_backend_passes_the_proof_through_and_refuses_a_malformed_one() -> None:
    running = _entry(_claim(1, Phase.RUNNING))
    got: list[tuple[str, OperatorProof | None]] = []

    class _Leases:
        def find(self, task_id: str) -> TaskEntry:
            return running

        async def cancel(self, task_id: str, operator: OperatorProof | None = None) -> Any:
            got.append((task_id, operator))
            return {"id": task_id, "cancelled": True}

    backend = _backend(leases=_Leases())
    key, _ = OperatorKey.create(ClusterAuthority.generate(), now=1e9)
    proof = key.prove_cancel(running.task_id, 1e9)
    await backend.cancel("r", proof_to_json(proof))
    await backend.cancel("r")
    assert got == [(running.task_id, proof), (running.task_id, None)]
    for bad in ("x", {"certificate": "zz", "signed_at": 1, "signature": "00" * 64},
                {**proof_to_json(proof), "signature": "00" * 63},
                {**proof_to_json(proof), "signed_at": "now"}):  # fmt: skip
        with pytest.raises(ValueError, match="operator"):
            await backend.cancel("r", bad)
    assert len(got) == 2


async def test_node_queries_and_commands_go_to_the_node() -> None:
    node = _Recorder({"ok": 1}, coroutines="probe_gpus")
    backend = NodeBackend(cast(Any, node))
    assert backend.status() == {"ok": 1}
    backend.members()
    backend.gpus()
    backend.request_leave()
    assert await backend.probe_gpus() == {"ok": 1}
    assert [name for name, _ in node.calls] == [
        "status", "member_rows", "gpus", "request_leave", "probe_gpus",
    ]  # fmt: skip


async def test_task_calls_go_to_the_lease_service() -> None:
    leases = _Recorder({"rows": []}, coroutines="submit drain undrain")
    backend = _backend(leases=leases)
    await backend.submit({"command": ["x"]})
    await backend.drain(True)
    await backend.undrain()
    leases_sync = _Recorder([{"id": "a"}])
    backend = _backend(leases=leases_sync)
    assert backend.tasks() == [{"id": "a"}]
    backend.task("a")
    backend.explain("a")
    assert leases.calls == [("submit", ({"command": ["x"]},)), ("drain", (True,)), ("undrain", ())]
    assert leases_sync.calls == [("rows", ()), ("detail", ("a",)), ("explain", ("a",))]


async def test_a_submit_with_input_files_stores_them_first() -> None:
    leases, artifacts = _Recorder("lease", "submit"), _Recorder("artifact", "submit")
    backend = _backend(leases=leases, artifacts=artifacts)
    spec = {"command": ["x"], "input_files": ["a.txt"]}
    assert await backend.submit(spec) == "artifact"
    assert await backend.submit({"command": ["x"], "input_files": []}) == "lease"
    assert artifacts.calls == [("submit", (spec,))]
    with pytest.raises(LookupError, match=STARTING):
        await _backend(leases=leases, artifacts=None).submit(spec)


async def test_logs_wait_for_the_task_logs_service() -> None:
    with pytest.raises(LookupError, match=STARTING):
        await _backend(task_logs=None).logs("t", "stdout", 0)
    logs = _Recorder({"data": ""}, coroutines="read")
    assert await _backend(task_logs=logs).logs("t", "stderr", 5) == {"data": ""}
    assert logs.calls == [("read", ("t", "stderr", 5))]


async def test_the_blob_deploy_and_artifact_routes_reach_their_services() -> None:
    blobs, deploy, artifacts = _Recorder("b"), _Recorder("d"), _Recorder("a")
    routes = _backend(blobs=blobs, deploy=deploy, artifacts=artifacts).request_routes()
    body = {"sha256": "ab"}
    for path, (method, handler) in routes.items():
        assert method in ("GET", "POST"), path
        assert handler(body) in ("b", "d", "a"), path
    assert ("pin", (body, ("pinned", False))) in blobs.calls  # unpin is pin(pinned=False)
    assert [name for name, _ in blobs.calls] == [
        "rows", "add", "remove", "pin", "pin", "pull", "progress",
    ]  # fmt: skip
    assert [name for name, _ in deploy.calls] == ["rows", "deploy", "undeploy"]
    assert artifacts.calls == [("fetch", (body,)), ("holders", (body,))]
    starting = _backend(blobs=None, deploy=None, artifacts=None).request_routes()
    for _, handler in starting.values():
        with pytest.raises(LookupError, match=STARTING):
            handler(body)


def test_the_inference_requests_before_and_after_the_host_is_up() -> None:
    backend = _backend(inference_host=None)
    method, handler = backend.extra_routes()["/v1/inference/requests"]
    assert method == "GET"
    assert handler() == {"listening": None, "requests": [], "engines": []}
    host = _Recorder({"listening": 8080})
    _, handler = _backend(inference_host=host).extra_routes()["/v1/inference/requests"]
    assert handler() == {"listening": 8080}
