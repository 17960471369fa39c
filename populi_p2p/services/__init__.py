"""The node's services: each owns its state and runs in the node's nursery.

See `docs/architecture.md` ("The node as services") for the diagram and for how to add
one. `populi_p2p.node.Node` only composes them.
"""

from __future__ import annotations

from .errors import NodeStartError as NodeStartError
from .membership import MembershipService as MembershipService

__all__ = ["MembershipService", "NodeStartError"]
