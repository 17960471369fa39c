"""Shared fixtures: a deterministic cluster authority, node identities, a fixed clock.

All are immutable values made from fixed seeds, so one per session is safe (and
hypothesis may use them across examples).
"""

from __future__ import annotations

import pytest

from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.identity import NodeIdentity

#: Realtime used by these tests (Unix seconds), fixed so certificates are reproducible.
NOW = 1_700_000_000.0


@pytest.fixture(scope="session")
def authority() -> ClusterAuthority:
    return ClusterAuthority.from_seed(b"A" * 32)


@pytest.fixture(scope="session")
def other_authority() -> ClusterAuthority:
    return ClusterAuthority.from_seed(b"B" * 32)


@pytest.fixture(scope="session")
def node() -> NodeIdentity:
    return NodeIdentity.from_seed(b"n" * 32)


@pytest.fixture(scope="session")
def other_node() -> NodeIdentity:
    return NodeIdentity.from_seed(b"m" * 32)
