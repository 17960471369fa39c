"""The lease table: which node runs each task, agreed with no central server.

A sans-IO package like `swim/`: no trio, sockets, clocks or global randomness. `now`
and a `random.Random` are passed in; everything returns its outputs. See
docs/leases.md.
"""

from ._entry import Cancel as Cancel
from ._entry import Checkpoint as Checkpoint
from ._entry import ClaimRecord as ClaimRecord
from ._entry import Phase as Phase
from ._entry import TaskEntry as TaskEntry
from ._entry import TaskOutput as TaskOutput
from ._entry import TaskPhase as TaskPhase
from ._entry import TaskResult as TaskResult
from ._entry import cancel_refusal as cancel_refusal
from ._entry import merge as merge
from ._events import LeaseEvent as LeaseEvent
from ._events import LeaseExpired as LeaseExpired
from ._events import LeaseStatistics as LeaseStatistics
from ._events import StaleResultRejected as StaleResultRejected
from ._events import TableStalled as TableStalled
from ._events import TaskChanged as TaskChanged
from ._events import TaskCompacted as TaskCompacted
from ._spec import BlobInput as BlobInput
from ._spec import Deployment as Deployment
from ._spec import Requirements as Requirements
from ._spec import Signer as Signer
from ._spec import TaskKind as TaskKind
from ._spec import TaskSpec as TaskSpec
from ._spec import Verifier as Verifier
from ._spec import check_new_requirements as check_new_requirements
from ._table import LeaseError as LeaseError
from ._table import LeaseTable as LeaseTable
from ._table import StateMerge as StateMerge
from .config import LeaseConfig as LeaseConfig
from .wire import DecodeError as DecodeError

__all__ = [
    "BlobInput",
    "Cancel",
    "Checkpoint",
    "ClaimRecord",
    "DecodeError",
    "Deployment",
    "LeaseConfig",
    "LeaseError",
    "LeaseEvent",
    "LeaseExpired",
    "LeaseStatistics",
    "LeaseTable",
    "Phase",
    "Requirements",
    "Signer",
    "StaleResultRejected",
    "StateMerge",
    "TableStalled",
    "TaskChanged",
    "TaskCompacted",
    "TaskEntry",
    "TaskKind",
    "TaskOutput",
    "TaskPhase",
    "TaskResult",
    "TaskSpec",
    "Verifier",
    "cancel_refusal",
    "check_new_requirements",
    "merge",
]
