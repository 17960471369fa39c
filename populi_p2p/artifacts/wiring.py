"""How the node builds the artifact runner (kept out of `node.py`, which only wires)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..executor.runner import TaskRunner
from .runner import ArtifactRunner

if TYPE_CHECKING:
    from ..blobs.service import BlobService
    from .service import ArtifactService

__all__ = ["artifact_runner"]


def artifact_runner(
    inner: TaskRunner, *, state_dir: Path, me: str, blobs: Callable[[], BlobService | None],
    service: Callable[[], ArtifactService | None], retention: float,
) -> ArtifactRunner:  # fmt: skip
    """The node's task runner: inputs and outputs around `inner`."""

    async def replicate(tid, epoch, spec, outputs):  # type: ignore[no-untyped-def]
        artifacts = service()
        if artifacts is None:
            raise LookupError("the node is still starting")
        return await artifacts.replicate(tid, epoch, spec, outputs)

    return ArtifactRunner(
        inner, tasks_dir=state_dir / "tasks", me=me, blobs=blobs, replicate=replicate,
        retention=retention,
    )  # fmt: skip
