"""`NodeBackend`: the control API's view of the node (`api.ApiBackend`, `api.TaskBackend`).

It only forwards to the node's public queries and commands, so the API app stays
testable without a daemon and the node keeps one place that says what the API shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..api import ConflictError
from ..leases import TaskEntry, cancel_refusal
from ..leases._cancel import OperatorProof
from ..trust.operator import proof_from_json

if TYPE_CHECKING:
    from ..artifacts.service import ArtifactService
    from ..blobs.service import BlobService
    from ..deploy.service import DeployService

__all__ = ["NodeBackend", "NodeView"]


class _Leases(Protocol):
    """The lease service's commands and queries the API calls."""

    async def submit(self, spec_fields: dict[str, Any]) -> dict[str, Any]: ...
    def rows(self) -> list[dict[str, Any]]: ...
    def detail(self, task_id: str) -> dict[str, Any]: ...
    def explain(self, task_id: str) -> dict[str, Any]: ...
    def find(self, task_id: str) -> TaskEntry: ...
    async def cancel(
        self, task_id: str, operator: OperatorProof | None = None
    ) -> dict[str, Any]: ...
    async def drain(self, handoff: bool) -> dict[str, Any]: ...
    async def undrain(self) -> dict[str, Any]: ...


class _TaskLogs(Protocol):
    async def read(self, task_id: str, stream: object, offset: object) -> dict[str, Any]: ...


class _InferenceHost(Protocol):
    def requests(self) -> dict[str, Any]: ...


class NodeView(Protocol):
    """What the backend reads of the node (`populi_p2p.node.Node` is one): typed here,
    not imported, so the node imports this module and not the other way round."""

    def status(self) -> dict[str, Any]: ...
    def member_rows(self) -> list[dict[str, Any]]: ...
    def gpus(self) -> dict[str, Any]: ...
    async def probe_gpus(self) -> dict[str, Any]: ...
    def request_leave(self) -> None: ...
    @property
    def leases(self) -> _Leases: ...
    @property
    def task_logs(self) -> _TaskLogs | None: ...
    @property
    def inference_host(self) -> _InferenceHost | None: ...
    @property
    def blobs(self) -> BlobService | None: ...
    @property
    def deploy(self) -> DeployService | None: ...
    @property
    def artifacts(self) -> ArtifactService | None: ...


class NodeBackend:
    """Forwards each API call to `node` (status, members, GPUs, leave, tasks, logs)."""

    def __init__(self, node: NodeView) -> None:
        self._node = node

    def status(self) -> dict[str, Any]:
        return self._node.status()

    def members(self) -> list[dict[str, Any]]:
        return self._node.member_rows()

    def gpus(self) -> dict[str, Any]:
        return self._node.gpus()

    async def probe_gpus(self) -> dict[str, Any]:
        return await self._node.probe_gpus()

    def request_leave(self) -> None:
        self._node.request_leave()

    # The tasks part of the API (`api.TaskBackend`).

    async def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Submit; with ``input_files``, stored as blobs first (docs/artifacts.md)."""
        if isinstance(spec, dict) and spec.get("input_files"):
            return await self._artifacts().submit(spec)
        return await self._node.leases.submit(spec)

    def tasks(self) -> list[dict[str, Any]]:
        return self._node.leases.rows()

    def task(self, task_id: str) -> dict[str, Any]:
        return self._node.leases.detail(task_id)

    def explain(self, task_id: str) -> dict[str, Any]:
        return self._node.leases.explain(task_id)

    async def cancel(self, task_id: str, operator: object = None) -> dict[str, Any]:
        """Cancel a task that may still run; a finished one is a `ConflictError` (409).
        `operator`: an operator's proof as JSON (`operator.proof_from_json`); a
        malformed one is a `ValueError` (400)."""
        entry = self._node.leases.find(task_id)
        refusal = cancel_refusal(entry)
        if refusal is not None:
            raise ConflictError(refusal)
        proof = None if operator is None else proof_from_json(operator)
        return await self._node.leases.cancel(entry.task_id, proof)

    async def logs(self, task_id: str, stream: object, offset: object) -> dict[str, Any]:
        if self._node.task_logs is None:  # for a moment after the API first answers
            raise LookupError("the node is still starting; try again in a second")
        return await self._node.task_logs.read(task_id, stream, offset)

    async def drain(self, handoff: bool) -> dict[str, Any]:
        return await self._node.leases.drain(handoff)

    async def undrain(self) -> dict[str, Any]:
        return await self._node.leases.undrain()

    def extra_routes(self) -> dict[str, tuple[str, Any]]:
        return {"/v1/inference/requests": ("GET", self._inference_requests)}

    def request_routes(self) -> dict[str, tuple[str, Any]]:
        """The blob routes (``populi-node model ...``) and the deployments
        (``deploy``, ``deployments``, ``undeploy``), docs/models.md."""
        return {
            "/v1/blobs": ("GET", lambda _q: self._blobs().rows()),
            "/v1/blobs/add": ("POST", lambda body: self._blobs().add(body)),
            "/v1/blobs/rm": ("POST", lambda body: self._blobs().remove(body)),
            "/v1/blobs/pin": ("POST", lambda body: self._blobs().pin(body)),
            "/v1/blobs/unpin": ("POST", lambda body: self._blobs().pin(body, pinned=False)),
            "/v1/blobs/pull": ("POST", lambda body: self._blobs().pull(body)),
            "/v1/blobs/progress": ("GET", lambda q: self._blobs().progress(q)),
            "/v1/deployments": ("GET", lambda q: self._deploy().rows(q)),
            "/v1/deploy": ("POST", lambda body: self._deploy().deploy(body)),
            "/v1/undeploy": ("POST", lambda body: self._deploy().undeploy(body)),
            "/v1/artifacts/fetch": ("POST", lambda body: self._artifacts().fetch(body)),
            "/v1/artifacts/holders": ("GET", lambda q: self._artifacts().holders(q)),
        }

    def _artifacts(self) -> ArtifactService:
        if self._node.artifacts is None:  # for a moment after the API first answers
            raise LookupError("the node is still starting; try again in a second")
        return self._node.artifacts

    def _deploy(self) -> DeployService:
        if self._node.deploy is None:  # for a moment after the API first answers
            raise LookupError("the node is still starting; try again in a second")
        return self._node.deploy

    def _blobs(self) -> BlobService:
        if self._node.blobs is None:  # for a moment after the API first answers
            raise LookupError("the node is still starting; try again in a second")
        return self._node.blobs

    def _inference_requests(self) -> dict[str, Any]:
        """The recent routes of this node's inference API, and its engines."""
        host = self._node.inference_host
        if host is None:  # for a moment after the API first answers
            return {"listening": None, "requests": [], "engines": []}
        return host.requests()
