"""Task inputs and outputs as blobs: staged before the start, held by k members after
the end, fetched anywhere (docs/artifacts.md). `service` is imported when first used
(it needs the peer API's modules)."""

from .runner import ArtifactRunner as ArtifactRunner

__all__ = ["ArtifactRunner"]
