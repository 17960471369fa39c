"""The lease table: which node runs each task, agreed with no central server.

A sans-IO package like `swim/`: no trio, sockets, clocks or global randomness. `now`
and a `random.Random` are passed in; everything returns its outputs. See
docs/leases.md.
"""

from ._entry import Cancel as Cancel
from ._entry import ClaimRecord as ClaimRecord
from ._entry import Phase as Phase
from ._entry import TaskEntry as TaskEntry
from ._entry import TaskPhase as TaskPhase
from ._entry import TaskResult as TaskResult
from ._entry import merge as merge
from ._spec import Requirements as Requirements
from ._spec import Signer as Signer
from ._spec import TaskKind as TaskKind
from ._spec import TaskSpec as TaskSpec
from ._spec import Verifier as Verifier
from .wire import DecodeError as DecodeError

__all__ = [
    "Cancel",
    "ClaimRecord",
    "DecodeError",
    "Phase",
    "Requirements",
    "Signer",
    "TaskEntry",
    "TaskKind",
    "TaskPhase",
    "TaskResult",
    "TaskSpec",
    "Verifier",
    "merge",
]
