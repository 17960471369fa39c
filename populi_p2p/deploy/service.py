"""`DeployService`: ``populi-node deploy``, ``deployments`` and ``undeploy``.

A deployment is N lease tasks, one per replica, submitted on this node: each spec
names the model blob as its signed ``model`` input (name, sha256, size) and carries a
`Deployment` (model id, replica index, count, context length). The lease agent gives
each replica a single owner exactly as it does any task (docs/leases.md), places the
replicas of one deployment on distinct nodes (placement's ``anti_affinity`` gate),
and places a replica again when its owner dies; the owner's `DeploymentRunner`
fetches the blob, starts the engine and advertises the model.

What ``deployments`` shows comes from the lease table every node holds (who owns each
replica, how a failed one ended, why a pending one waits) and from each owner's
record section ``deploys`` (fetching n %, loading, serving). ``undeploy`` cancels the
replicas' tasks: like any cancel, on the node that deployed (or with an operator key).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from ..leases import TaskEntry, TaskPhase
from ..leases._spec import DEPLOY_REPLICAS_MAX, TIMEOUT_MAX, Deployment
from .runner import SECTION

if TYPE_CHECKING:
    from ..blobs.service import BlobService

__all__ = ["DEPLOY_RETRIES", "DeployService", "replica_state"]

#: Failed starts of one replica tolerated (each on another node when one fits).
DEPLOY_RETRIES: Final = 3
#: The placeholder command of a replica's spec: the owner runs its own engine command.
COMMAND: Final = "populi-engine"


def _last_line(tail: bytes) -> str:
    lines = [ln for ln in tail.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1].strip()[:200] if lines else "no output"


def replica_state(
    entry: TaskEntry,
    deploys_of: Callable[[str], Any],
    alive: Callable[[str], bool],
    why: str | None,
) -> str:
    """One replica's state in words: ``pending: WHY``, ``fetching 42%``, ``loading``,
    ``serving``, ``failed: WHY``, ``stopped``."""
    if entry.phase is TaskPhase.CANCELLED:
        return "stopped"
    result = entry.accepted_result
    if entry.finished():
        return f"failed: {_last_line(result.output_tail) if result else 'no result'}"
    cur = entry.current
    if cur is None or entry.needs_owner():
        last = f" (last try failed: {_last_line(result.output_tail)})" if result else ""
        return f"pending: {why or 'being placed'}{last}"
    if not alive(cur.owner):
        return "owner gone: being placed again"
    section = deploys_of(cur.owner)
    mine = section.get(entry.task_id[:16]) if isinstance(section, dict) else None
    if not (isinstance(mine, list) and len(mine) == 2 and isinstance(mine[0], str)):
        return "starting"
    state, percent = mine[0][:16], mine[1]
    if state == "fetching" and isinstance(percent, int | float):
        return f"fetching {percent:.0f}%"
    return state


class DeployService:
    """Args:
    submit, cancel: the lease service's (the API's) submit and cancel.
    entries: the lease table's entries.
    why: why a pending task waits (the agent's last placement here).
    blobs: the blob service, once it runs.
    records: a member's record section by name (``deploys_of(node)``), liveness, name.
    """

    def __init__(
        self,
        *,
        submit: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
        cancel: Callable[[str], Awaitable[dict[str, Any]]],
        entries: Callable[[], Iterable[TaskEntry]],
        why: Callable[[str], str | None],
        blobs: Callable[[], BlobService | None],
        deploys_of: Callable[[str], Any],
        alive: Callable[[str], bool],
        name_of: Callable[[str], str],
    ) -> None:
        self._submit, self._cancel, self._entries, self._why = submit, cancel, entries, why
        self._blobs, self._deploys_of, self._alive, self._name_of = (
            blobs, deploys_of, alive, name_of
        )  # fmt: skip

    def _replicas(self, name: str | None = None) -> list[TaskEntry]:
        out = []
        for e in self._entries():
            d = None if e.spec is None else e.spec.deployment
            if d is not None and (name is None or d.name == name):
                out.append(e)
        return out

    def live(self, name: str) -> list[TaskEntry]:
        """The replicas of `name` that may still serve (not cancelled or failed for good)."""
        return [e for e in self._replicas(name) if not e.finished()]

    def loading(self, model: str) -> bool:
        """Whether `model` is deployed and may serve soon (the router then waits)."""
        return bool(self.live(model))

    async def deploy(self, body: Any) -> dict[str, Any]:
        """``deploy``: N replica tasks of a model blob known to the mesh.

        Raises:
            ValueError: bad arguments, or the model is deployed already (one line).
            LookupError: no such blob here or on the mesh.
        """
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise ValueError("name the model: populi-node deploy NAME (model ls lists them)")
        blobs = self._blobs()
        if blobs is None:
            raise LookupError("the node is still starting; try again in a second")
        replicas, ctx = body.get("replicas", 1), body.get("ctx", 0)
        if type(replicas) is not int or not 0 < replicas <= DEPLOY_REPLICAS_MAX:
            raise ValueError(f"--replicas must be 1..{DEPLOY_REPLICAS_MAX}")
        digest, size, blob_name = blobs.locate(body["model"])
        name = body.get("name") or blob_name
        Deployment(name, 0, replicas, ctx)  # checks the name and ctx (one line)
        if self.live(name):
            raise ValueError(f"{name} is deployed already: populi-node undeploy {name} first")
        ids = []
        for index in range(replicas):
            fields = {
                "kind": "inference", "command": [COMMAND, name],
                "gpus": body.get("gpus", 0), "vram": body.get("vram", 0),
                "timeout": TIMEOUT_MAX, "retries": DEPLOY_RETRIES,
                "inputs": [{"name": "model", "sha256": digest.hex(), "size": size}],
                "deployment": {"name": name, "index": index, "replicas": replicas, "ctx": ctx},
            }  # fmt: skip
            ids.append((await self._submit(fields))["id"])
        return {"name": name, "blob": digest.hex(), "size": size, "tasks": ids}

    async def undeploy(self, body: Any) -> dict[str, Any]:
        """``undeploy``: cancel every replica of a deployment that may still run.

        Raises:
            LookupError: nothing of that name is deployed.
        """
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str):
            raise ValueError("name the deployment: populi-node undeploy NAME")
        live = self.live(name)
        if not live:
            raise LookupError(f"no deployment {name!r} is running (see populi-node deployments)")
        for entry in live:
            await self._cancel(entry.task_id)
        return {"name": name, "cancelled": [e.task_id for e in live]}

    def rows(self, _query: Any = None) -> dict[str, Any]:
        """``deployments``: each replica, its node and its state."""
        out: dict[str, list[dict[str, Any]]] = {}
        for e in self._replicas():
            assert e.spec is not None and e.spec.deployment is not None
            d, owner = e.spec.deployment, e.owner
            state = replica_state(e, self._deploys_of, self._alive, self._why(e.task_id))
            out.setdefault(d.name, []).append({
                "index": d.index, "task": e.task_id, "epoch": e.epoch, "state": state,
                "node": None if owner is None else self._name_of(owner), "node_id": owner,
                "blob": e.spec.inputs[0].sha256 if e.spec.inputs else None,
                "submitted_at": e.spec.submitted_at,
            })  # fmt: skip
        shown = []
        for name, rows in sorted(out.items()):
            if any(r["state"] != "stopped" for r in rows):  # a redeploy hides the old one
                rows = [r for r in rows if r["state"] != "stopped"]
            rows.sort(key=lambda r: (r["index"], -r["submitted_at"]))
            shown.append({"name": name, "replicas": rows})
        return {"deployments": shown}


def deploys_section(record_sections: Any) -> Any:
    """A record's ``deploys`` section (hostile input: anything but a map reads as none)."""
    value = record_sections.get(SECTION) if isinstance(record_sections, dict) else None
    return value if isinstance(value, dict) else None
