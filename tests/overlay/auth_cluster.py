"""A small cluster for the envelope tests (`test_auth_*`): one authority, three enrolled
nodes, a fixed clock. `conftest.py` makes `alice` and `bob` fixtures of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from overlay.auth import PacketAuthenticator
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.envelope_keys import packet_authenticator
from populi_p2p.trust.identity import NodeIdentity

#: Realtime used by these tests (Unix seconds).
NOW = 1_700_000_000.0

AUTHORITY = ClusterAuthority.from_seed(b"A" * 32)
ALICE = NodeIdentity.from_seed(b"a" * 32)
BOB = NodeIdentity.from_seed(b"b" * 32)
CAROL = NodeIdentity.from_seed(b"c" * 32)
CERTS = {
    n.node_id: AUTHORITY.enroll(n.public_key, now=NOW - 60, serial=i).raw
    for i, n in enumerate((ALICE, BOB, CAROL))
}

Factory = Callable[..., PacketAuthenticator]


def make_authenticator(identity: NodeIdentity, **kwargs: Any) -> PacketAuthenticator:
    return packet_authenticator(identity, CERTS[identity.node_id], AUTHORITY.public_key, **kwargs)
