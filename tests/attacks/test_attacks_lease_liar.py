"""An insider replica that lies about the epoch it holds (issue 17, "Insider").

A proposer proposes above the highest epoch any replica answered with, so that after a
lost proposal the set's epochs cannot drift apart (docs/leases.md, "Propose"). An
enrolled member in a task's replica set could abuse that: answer every grant request
with a refusal "holding" 2^62 - 2, and every proposal after a lost one would go to the
largest epoch, which each honest granter refuses as too far a jump. The task would never
run again. So a proposer learns only an epoch that liars cannot have made up
(`quorum.epoch_vouched`: with f the replicas beyond a majority, the (f + 1)-th highest
answer), and at most a granter's jump (`EPOCH_STEP_MAX`) above its own record.

These run the real lease agents in the agents' own cluster (`tests/leases/agent_harness`:
virtual time, messages as bytes), with one node's answers to grant requests replaced
by the lie an insider would send; the control shows that with the highest answer
believed (the rule before), the same lie stalls the task for good.
"""

from __future__ import annotations

from typing import Any

import pytest

from populi_p2p.leases import agent as agent_module
from populi_p2p.leases.agent_wire import GrantAnswer, GrantRequest, decode, encode
from populi_p2p.leases.grants import EPOCH_MAX, EPOCH_STEP_MAX, Refusal
from tests.leases.agent_harness import Cluster

#: What the liar says it holds: the largest epoch a proposer would take from it.
LIE = EPOCH_MAX - 1


def _lying_cluster(seed: int, lie: int = LIE) -> tuple[Cluster, str, str, str, list[str]]:
    """Five nodes, one task on all five as replicas; from now on one replica (not the
    owner) does nothing but answer every grant request with a refusal holding `lie`
    (its honest agent is stopped: it neither grants nor proposes). Returns the
    cluster, the task, its first owner, the liar, and whom the liar lied to."""
    c = Cluster(5, seed=seed, drift=0.0)
    tid = c.submit("n0", 120.0)
    c.run_until(2.0)
    owner = c.runs[tid][0].node
    liar = next(n for n in sorted(c.nodes) if n != owner)
    lies: list[str] = []
    event = c._event

    def lying(kind: str, data: Any) -> None:
        if kind == "msg" and data[1] == liar:
            msg = decode(data[2])
            if isinstance(msg, GrantRequest) and msg.task_id == tid:
                told = GrantAnswer(msg.task_id, msg.epoch, msg.owner, Refusal.STALE, lie, 0.0, 0)
                c._push(c.now + 0.001, "msg", (liar, data[0], encode(told)))
                lies.append(data[0])
                return
        event(kind, data)

    c._event = lying  # type: ignore[method-assign]
    c.crash(liar)  # its honest agent: no grants, no proposals; the lies go on
    return c, tid, owner, liar, lies


def _fail_over_past_the_liar(c: Cluster, tid: str, owner: str, liar: str) -> None:
    """Crash the owner and one more honest replica: the two honest left and the liar
    cannot make a majority, so every proposal is lost and learns the lie. Then the
    honest replica comes back, and a majority of honest granters is there again."""
    down = next(n for n in sorted(c.nodes) if n not in (owner, liar))
    c.crash(owner)
    c.crash(down)
    c.run_until(c.now + 40.0)
    c.restart(down)
    c.run_until(c.now + 60.0)


@pytest.mark.parametrize("lie", [LIE, 0], ids=["high", "low"])
def test_an_epoch_a_lying_replica_answers_does_not_stall_the_task(lie: int) -> None:
    """High, the lie moves no epoch; low (0), it can make the vouched epoch the lowest
    honest one, and a proposer there loses, but the next in rank proposes above its
    own record and wins: the task runs later, not never."""
    c, tid, owner, liar, lies = _lying_cluster(seed=3, lie=lie)
    _fail_over_past_the_liar(c, tid, owner, liar)
    assert lies, "the liar was asked and lied"
    runs = c.runs[tid]
    assert len(runs) == 2, f"the task ran again after its owner died: {runs}"
    assert runs[1].epoch <= runs[0].epoch + EPOCH_STEP_MAX, "within one granter's jump"
    assert runs[0].end is not None and runs[1].start >= runs[0].end, "never two at once"


def test_control_with_the_highest_answer_believed_the_same_lie_stalls_the_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule before `epoch_vouched`: the highest epoch any replica answered, bounded
    only by a granter's jump above our own record. Each lost proposal then moves the
    honest granters that granted it a whole jump, the proposer's own record stays
    behind, and soon they are spread wider than a jump: every proposal is refused,
    stale above or too far a jump below, and the task never runs again."""

    def highest(replicas: tuple[str, ...], held: dict[str, int], own: int) -> int:
        return max([own, *held.values()])

    monkeypatch.setattr(agent_module, "epoch_vouched", highest)
    c, tid, owner, liar, lies = _lying_cluster(seed=3)
    _fail_over_past_the_liar(c, tid, owner, liar)
    assert lies
    refused = sum(n.agent.counters.get("grants_refused_epoch_jump", 0) for n in c.nodes.values())
    assert len(c.runs[tid]) == 1 and refused > 0, "stalled: too far a jump, for good"
