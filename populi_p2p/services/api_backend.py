"""`NodeBackend`: the control API's view of the node (`api.ApiBackend`, `api.TaskBackend`).

It only forwards to the node's public queries and commands, so the API app stays
testable without a daemon and the node keeps one place that says what the API shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..api import ConflictError
from ..operator import proof_from_json
from .lease_view import cancel_refusal

if TYPE_CHECKING:
    from ..blobs.service import BlobService
    from ..node import Node

__all__ = ["NodeBackend"]


class NodeBackend:
    """Forwards each API call to `node` (status, members, GPUs, leave, tasks, logs)."""

    def __init__(self, node: Node) -> None:
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
        """The blob routes (``populi-node model ...``, docs/models.md)."""
        return {
            "/v1/blobs": ("GET", lambda _q: self._blobs().rows()),
            "/v1/blobs/add": ("POST", lambda body: self._blobs().add(body)),
            "/v1/blobs/rm": ("POST", lambda body: self._blobs().remove(body)),
            "/v1/blobs/pin": ("POST", lambda body: self._blobs().pin(body)),
            "/v1/blobs/unpin": ("POST", lambda body: self._blobs().pin(body, pinned=False)),
            "/v1/blobs/pull": ("POST", lambda body: self._blobs().pull(body)),
            "/v1/blobs/progress": ("GET", lambda q: self._blobs().progress(q)),
        }

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
