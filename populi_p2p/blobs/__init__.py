"""Content-addressed blobs: model files (and, later, task inputs, outputs and
checkpoints), stored under a quota and fetched in verified chunks from several members
at once. See docs/models.md.

`store` keeps them on disk, `planner` decides which chunk comes from which holder
(sans-IO), `fetcher` drives it with trio, `holders` is the record section that says who
holds what, and `service` serves chunks to members and runs pulls.
"""

from .fetcher import FetchError as FetchError
from .fetcher import FetchProgress as FetchProgress
from .fetcher import fetch_blob as fetch_blob
from .manifest import CHUNK_BYTES as CHUNK_BYTES
from .manifest import Manifest as Manifest
from .planner import ChunkFailure as ChunkFailure
from .planner import FetchPlan as FetchPlan
from .store import BlobEntry as BlobEntry
from .store import BlobStore as BlobStore
from .store import QuotaError as QuotaError

__all__ = [
    "CHUNK_BYTES",
    "BlobEntry",
    "BlobStore",
    "ChunkFailure",
    "FetchError",
    "FetchPlan",
    "FetchProgress",
    "Manifest",
    "QuotaError",
    "fetch_blob",
]
