"""A late `Own` of an epoch the owner already ran and ended must not start it again.

Found by the simulator (leases-starved, seed 1): the accepting node, whose table had
not heard of the claim yet, proposed epoch 1 again every second; the granters granted
the same (epoch, owner) again, and an `Own` that arrived after the task had exited
made its owner run the task a second time, after the success was final.
"""

from __future__ import annotations

from populi_p2p.leases.agent_commands import AgentCommand, SendTo, StartTask
from populi_p2p.leases.agent_wire import Own, decode, encode

from .agent_harness import Cluster, Node


def test_an_own_for_an_ended_epoch_starts_nothing() -> None:
    c = Cluster(3, seed=1, drift=0.0)
    owns: list[tuple[str, bytes]] = []
    apply = c._apply

    def spy(node: Node, cmds: list[AgentCommand]) -> None:
        for cmd in cmds:
            if isinstance(cmd, SendTo) and isinstance(decode(cmd.payload), Own):
                owns.append((cmd.node, cmd.payload))
        apply(node, cmds)

    c._apply = spy  # type: ignore[method-assign]
    tid = c.submit("n0", duration=1.0)
    c.run_until(30.0)
    assert [r.end is not None for r in c.runs[tid]] == [True]
    owner_name = c.runs[tid][0].node
    repeats = [payload for to, payload in owns if to == owner_name]
    if not repeats:  # the owner proposed for itself: build the same message
        owner = c.nodes[owner_name]
        known = owner.agent.spec_of(tid)
        assert known is not None

        repeats = [encode(Own(tid, 1, *known, 0))]
    owner = c.nodes[owner_name]
    cmds = owner.agent.receive(repeats[-1], owner.local(c.now), "n0")
    cmds += owner.agent.tick(owner.local(c.now))
    c._apply(owner, cmds)
    c.run_until(c.now + 30.0)
    assert not [cmd for cmd in cmds if isinstance(cmd, StartTask)]
    assert len(c.runs[tid]) == 1
    assert owner.agent.counters.get("owns_stale", 0) == 1
