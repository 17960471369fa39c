"""The agent's own records (`agent_state.py`): each instance has its own sets and maps
(a shared default would mix two proposals' votes)."""

from __future__ import annotations

from populi_p2p.leases.agent_state import Owned, Pending, Proposal
from populi_p2p.leases.grants import Ended

from .helpers import spec


def test_each_record_has_its_own_collections() -> None:
    a, b = Proposal(1, "o", ("x", "y", "z"), ""), Proposal(1, "o", ("x", "y", "z"), "")
    a.granted.add("x")
    a.refused["y"] = 6
    assert b.granted == set() and b.refused == {}
    p, q = Pending("offer", 0, Ended.NO, ("x",), 1.0), Pending("offer", 0, Ended.NO, ("x",), 1.0)
    p.acks.add("x")
    assert q.acks == set() and not q.done and q.delta is None and q.operator is None
    o = Owned(1, spec(1, by="a"), "", 0.0)
    assert not o.started and o.stopping == "" and o.lease_until == 0.0
    o.superseded_by.add("x")
    assert Owned(1, spec(1, by="a"), "", 0.0).superseded_by == set()
