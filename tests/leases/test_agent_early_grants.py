"""The first epoch's grant request travels right behind the task's offer (`submit`), so
it may overtake it. A replica holds such a request (bounded, `EARLY_GRANTS_MAX` in all
and `EARLY_GRANTS_PER_SENDER` from one member) and answers it once the offer arrives,
so every replica holds the grant and the owner's renewals find the same set
everywhere."""

from __future__ import annotations

import pytest

from populi_p2p.leases import agent_state
from populi_p2p.leases.agent_commands import SendTo
from populi_p2p.leases.agent_wire import GrantRequest, Renew, RenewAnswer, decode, encode

from .agent_harness import Cluster


def _counter(c: Cluster, name: str) -> int:
    return sum(n.agent.counters.get(name, 0) for n in c.nodes.values())


def test_a_request_that_overtakes_its_offer_is_answered_once_the_offer_arrives() -> None:
    c = Cluster(10, seed=5)  # delays of 1-20 ms: half the requests overtake their offer
    tids = [c.submit(f"n{i % 10}", 30.0) for i in range(40)]
    c.run_until(10.0)
    assert _counter(c, "grants_held_early") > 0, "some requests overtook their offer"
    assert _counter(c, "grants_refused_unknown") == 0
    assert _counter(c, "grants_lost") == 0 and _counter(c, "proposals") == len(tids)
    for tid in tids:
        spec = c.nodes[c.accepted_by[tid]].agent.spec_of(tid)
        assert spec is not None
        epochs = {c.nodes[r].agent.grants[tid].epoch for r in spec[0].replicas}
        assert epochs == {1}, f"every replica granted the first epoch: {epochs}"
    c.run_until(60.0)
    c.heal_and_sync()
    assert c.check() == [] and c.starts() == len(tids)


def test_held_requests_are_bounded_and_refused_as_unknown_beyond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent_state, "EARLY_GRANTS_MAX", 3)
    monkeypatch.setattr(agent_state, "EARLY_GRANTS_PER_SENDER", 2)
    c = Cluster(3, seed=1)
    granter = c.nodes["n1"].agent
    out = []
    requests = [("n0", GrantRequest(f"{k:032x}", 1, "n0")) for k in range(3)]  # 2 held
    requests += [("n2", GrantRequest(f"{k:032x}", 1, "n2")) for k in range(3, 5)]  # 1 held
    requests += [("n2", GrantRequest(f"{5:032x}", 2, "n2"))]  # not a first epoch
    for sender, request in requests:
        out += granter.receive(encode(request), 0.0, sender)
    assert granter.counters.get("grants_held_early") == 3
    assert granter.counters.get("grants_refused_unknown") == 3
    assert all(isinstance(cmd, SendTo) for cmd in out)


def test_only_renewals_and_their_answers_may_leave_before_a_commit() -> None:
    """`SendTo.after_commit`: the driver sends renewals and their answers at once,
    everything else only after the records it follows from are durable."""
    granter = Cluster(3, seed=3).nodes["n1"].agent
    renew = encode(Renew(7, ((f"{1:032x}", 1),)))
    (answer,) = granter.receive(renew, 0.0, "n0")
    assert isinstance(answer, SendTo) and answer.after_commit is False
    assert isinstance(decode(answer.payload), RenewAnswer)
    request = encode(GrantRequest(f"{2:032x}", 1, "n0"))
    (wanted,) = granter.receive(request, 0.0, "n0")  # held early; the spec is asked for
    assert isinstance(wanted, SendTo) and wanted.after_commit is True
