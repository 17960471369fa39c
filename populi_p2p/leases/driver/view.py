"""Pure helpers of the lease service: the placement view built from verified records,
and the plain-data views of entries that the API and the CLI show.

Nothing here does I/O or keeps state, so each function is tested on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final, cast

import attrs

from swim import Member

from ...trust.record import NodeRecord, NodeStatus
from .. import (
    BlobInput,
    Deployment,
    LeaseEvent,
    LeaseTable,
    Requirements,
    TaskEntry,
    TaskKind,
    TaskSpec,
    check_new_requirements,
)
from .._spec import check_output_path
from ..placement import Candidate, Gpu

__all__ = [
    "SYNC_DIGEST_BITS",
    "LeaseSection",
    "build_candidates",
    "candidate",
    "entry_detail",
    "entry_row",
    "explain_view",
    "find_entry",
    "fits",
    "gpu_slots",
    "pick_gpus",
    "spec_from",
    "spec_view",
]

#: Digest width in the swim sync: 2**5 buckets x 4 bytes fits its 256-byte digest bound.
SYNC_DIGEST_BITS: Final = 5


class LeaseSection:
    """The lease table's part of the swim sync (`swim.AppState`), digest first: a
    32-bucket digest; a peer whose buckets differ gets those buckets' entries."""

    def __init__(
        self,
        table: LeaseTable,
        on_events: Callable[[list[LeaseEvent]], None],
        clock: Callable[[], float],
        received: Callable[[], AbstractContextManager[None]] = nullcontext,
    ) -> None:
        self._table = table
        self._on_events = on_events
        self._clock = clock
        self._received = received  # around a merge: what it writes came from a peer

    def digest(self) -> bytes:
        return self._table.digest(bits=SYNC_DIGEST_BITS)

    def state_for(self, remote_digest: bytes) -> bytes | None:
        if not remote_digest:
            return None
        return self._table.state_for(remote_digest, direct=True)

    def merge(self, payload: bytes) -> None:
        with self._received():
            merged = self._table.merge_state(payload, self._clock())
        self._on_events(merged.events)


def gpu_slots(gpu_record: Mapping[str, Any] | None) -> list[tuple[str, Gpu]]:
    """(uuid, `Gpu`) for each device of a signed GPU record: Layer B allocatable VRAM
    (the largest placeable unit), Layer A compute capability, and health (an
    unhealthy or disqualified device is not `healthy`, so GPU work avoids it).
    A record that does not parse offers no GPUs."""
    if gpu_record is None:
        return []
    from ...gpu import GpuReport

    try:
        report = GpuReport.from_record(gpu_record)
    except ValueError:
        return []
    out = []
    for device, health, cap in zip(
        report.facts.devices, report.health, report.capacity.devices, strict=True
    ):
        gpu = Gpu(
            vram_allocatable=cap.largest_unit,
            compute_capability=device.compute_capability or (0, 0),
            healthy=health.eligible,
        )
        out.append((device.uuid, gpu))
    return out


def candidate(
    member: Member,
    record: NodeRecord | None,
    reliability: float,
    *,
    draining: bool = False,
    accepting: str = "",
) -> Candidate | None:
    """The placement view of one member; None without a verified record (a node whose
    record we cannot trust is offered no work).

    RTT is "from the accepting node", and every node must rank alike, but only the
    accepting node measures its RTT to each candidate: so the accepting node itself
    counts as 0 s away and every other node as unknown, the same on every replica (a
    node's own probe RTTs would make each node rank the others above itself).
    """
    if record is None:
        return None
    caps = record.capabilities
    labels = frozenset(f"{k}={v}" for k, v in record.labels.items())
    return Candidate(
        node_id=member.name,
        state=member.state.name.lower(),
        draining=draining or record.status is NodeStatus.DRAINING,
        gpus=tuple(g for _, g in gpu_slots(caps.gpu)),
        cpu_cores=float(caps.cpu_cores),
        ram=caps.ram_bytes,
        labels=labels,
        rtt=0.0 if member.name == accepting else None,
        reliability=reliability,
    )


def build_candidates(
    members: Iterable[Member],
    record_of: Callable[[str], NodeRecord | None],
    reliability: Mapping[str, float],
    prior: float,
    *,
    me: str,
    draining: bool,
    accepting: str,
) -> list[Candidate]:
    """Every member with a verified record, as placement sees it (our own draining flag
    is local truth; the others' come from their records)."""
    out = []
    for m in members:
        c = candidate(
            m, record_of(m.name), reliability.get(m.name, prior),
            draining=draining and m.name == me, accepting=accepting,
        )  # fmt: skip
        if c is not None:
            out.append(c)
    return out


def pick_gpus(
    record: NodeRecord | None, busy: Collection[str], req: Requirements
) -> list[tuple[str, int]] | None:
    """(uuid, VRAM) for `req` from our own record's GPUs not `busy` with another task,
    or None when too few fit now."""
    if not req.gpu_count:
        return []
    slots = gpu_slots(record.capabilities.gpu if record is not None else None)
    fit = [(uuid, req.vram_per_gpu) for uuid, g in slots if uuid not in busy and fits(g, req)]
    return fit[: req.gpu_count] if len(fit) >= req.gpu_count else None


def find_entry(entries: Iterable[TaskEntry], task_id: str) -> TaskEntry:
    """The entry with id `task_id`, or the only one it is a prefix of; `KeyError` (one
    line) otherwise."""
    found = [e for e in entries if e.task_id.startswith(task_id)] if task_id else []
    exact = [e for e in found if e.task_id == task_id]
    if exact:
        return exact[0]
    if len(found) != 1:
        raise KeyError(f"no single task matches {task_id!r} (see populi-node tasks)")
    return found[0]


def explain_view(entry: TaskEntry, placement: str | None) -> dict[str, Any]:
    """``populi-node explain``: the claim's own explanation and our last placement."""
    cur = entry.current
    claim = None if cur is None else f"epoch {cur.epoch} -> {cur.owner}: {cur.explanation}"
    return {"id": entry.task_id, "phase": entry.phase.value, "claim": claim, "placement": placement}


def spec_view(spec: TaskSpec) -> dict[str, Any]:
    r = spec.requirements
    return {
        "kind": spec.kind.value,
        "command": list(spec.command),
        "env": dict(spec.env),
        "timeout": spec.timeout,
        "retries": spec.retry_limit,
        "no_network": spec.no_network,
        "submitted_by": spec.submitted_by,
        "submitted_at": spec.submitted_at,
        "replicas": list(spec.replicas),
        "inputs": [
            {"name": i.name, "sha256": i.sha256, "size": i.size, "dir": i.unpack}
            for i in spec.inputs
        ],
        "outputs": list(spec.outputs),
        "checkpoint_every": spec.checkpoint_every,
        "deployment": None if spec.deployment is None else attrs.asdict(spec.deployment),
        "requirements": {
            "gpus": r.gpu_count,
            "vram_per_gpu": r.vram_per_gpu,
            "min_cc": f"{r.compute_capability_min[0]}.{r.compute_capability_min[1]}",
            "cpus": r.cpu_cores,
            "ram": r.ram,
            "labels": sorted(r.labels_required),
            "prefer": sorted(r.labels_preferred),
        },
    }


def entry_row(entry: TaskEntry, why: str | None, now_real: float | None = None) -> dict[str, Any]:
    """One row of ``populi-node tasks``: id, kind, phase, epoch, owner, age (and, for a
    pending task, why nothing runs it)."""
    now_real = time.time() if now_real is None else now_real
    spec = entry.spec
    result = entry.accepted_result
    return {
        "id": entry.task_id,
        "kind": spec.kind.value if spec is not None else None,
        "phase": entry.phase.value,
        "epoch": entry.epoch,
        "owner": entry.owner,
        "age": None if spec is None else round(max(0.0, now_real - spec.submitted_at), 1),
        "exit_code": None if result is None else result.exit_code,
        "finished": entry.finished(),
        "why": why,
    }


def entry_detail(entry: TaskEntry, why: str | None) -> dict[str, Any]:
    """``populi-node task``: the spec, every epoch with its owner and outcome, the
    accepted result."""
    epochs = []
    for c in entry.claims:
        r = c.result
        epochs.append(
            {
                "epoch": c.epoch,
                "owner": c.owner,
                "phase": c.phase.name.lower(),
                "renewals": c.renewals,
                "exit_code": None if r is None else r.exit_code,
                "explanation": c.explanation,
            }
        )
    result = entry.accepted_result
    return {
        **entry_row(entry, why),
        "spec": None if entry.spec is None else spec_view(entry.spec),
        "epochs": epochs,
        "cancelled_by": None if entry.cancel is None else entry.cancel.by,
        "checkpoint": checkpoint_view(entry),
        "result": None
        if result is None
        else {
            "exit_code": result.exit_code,
            "duration": result.duration,
            "node_fault": result.node_fault,
            "final": result.final,
            "output_tail": result.output_tail.decode(errors="replace"),
            "outputs": [
                {"path": o.path, "sha256": o.sha256, "size": o.size, "dir": o.unpack}
                for o in result.outputs
            ],
            "holders": list(result.holders),
        },
    }


def checkpoint_view(entry: TaskEntry) -> dict[str, Any] | None:
    """The latest checkpoint record (None: none yet): the epoch that recorded it, the
    epoch whose run wrote the snapshot, its sha256 and size, and its holders."""
    ck = entry.checkpoint
    if ck is None:
        return None
    return {"epoch": ck.epoch, "seq": ck.seq, "owner": ck.owner, "taken_in": ck.taken_in,
            "sha256": ck.sha256, "size": ck.size, "holders": list(ck.holders)}  # fmt: skip


def fits(g: Gpu, req: Requirements) -> bool:
    return (
        g.healthy
        and g.compute_capability >= req.compute_capability_min
        and g.vram_allocatable >= req.vram_per_gpu
    )


def spec_from(fields: dict[str, Any], me: str, now_real: float) -> TaskSpec:
    """A `TaskSpec` from the API's JSON (hostile input): `ValueError` on anything off."""
    if not isinstance(fields, dict):
        raise ValueError("the task spec must be a JSON object")
    try:
        cc = str(fields.get("min_cc", "0.0")).split(".")
        req = Requirements(
            gpu_count=int(fields.get("gpus", 0)),
            vram_per_gpu=int(fields.get("vram", 0)),
            compute_capability_min=(int(cc[0]), int(cc[1]) if len(cc) > 1 else 0),
            cpu_cores=float(fields.get("cpus", 0.0)),
            ram=int(fields.get("ram", 0)),
            labels_required=[str(x) for x in fields.get("labels", [])],
            labels_preferred=[str(x) for x in fields.get("prefer", [])],
        )
        check_new_requirements(req)
        command: tuple[str, ...] = tuple(str(a) for a in fields.get("command", []))
        env = fields.get("env", {})
        if not isinstance(env, dict):
            raise ValueError("env must be a map of strings")
        no_network = fields.get("no_network", False)
        if not isinstance(no_network, bool):
            raise ValueError("no_network must be true or false")
        return TaskSpec(
            kind=TaskKind(fields.get("kind", "batch")),
            requirements=req,
            command=cast(Any, command),  # attrs types the tuple converter loosely
            env={str(k): str(v) for k, v in env.items()},
            timeout=float(fields.get("timeout", 3600.0)),
            retry_limit=int(fields.get("retries", 2)),
            submitted_by=me,
            submitted_at=now_real,
            no_network=no_network,
            inputs=_inputs_from(fields.get("inputs", [])),
            deployment=_deployment_from(fields.get("deployment")),
            outputs=_outputs_from(fields.get("outputs", [])),
            checkpoint_every=_checkpoint_every_from(fields.get("checkpoint_every")),
        )
    except (TypeError, IndexError) as exc:
        raise ValueError(f"bad task spec: {exc}") from None


def _inputs_from(raw: Any) -> list[BlobInput]:
    """``[{"name", "sha256", "size"}, ...]`` (hostile input): `ValueError` on anything off."""
    if not isinstance(raw, list) or not all(isinstance(i, dict) for i in raw):
        raise ValueError('inputs must be a list of {"name", "sha256", "size"}')
    items = cast(list[dict[str, Any]], raw)  # values checked by BlobInput
    return [
        BlobInput(i.get("name", ""), i.get("sha256", ""), i.get("size", -1), i.get("unpack", False))
        for i in items
    ]


def _outputs_from(raw: Any) -> list[str]:
    """``["path", ...]`` (hostile input): each checked by the spec."""
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise ValueError("outputs must be a list of paths relative to the work dir")
    return [check_output_path(p) for p in raw]


def _checkpoint_every_from(raw: Any) -> float | None:
    """Seconds between checkpoints (None: off; 0: only when the task asks)."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError("checkpoint_every must be a number of seconds (0: on request only)")
    return float(raw)


def _deployment_from(raw: Any) -> Deployment | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError('deployment must be {"name", "index", "replicas", "ctx"}')
    get = cast(Callable[[str, Any], Any], raw.get)  # values checked by Deployment
    return Deployment(get("name", None), get("index", None), get("replicas", None), get("ctx", 0))
