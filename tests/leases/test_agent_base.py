"""`AgentBase`: the agent's output helpers (sends, the echo of gossiped deltas)."""

from __future__ import annotations

import random

import pytest

from populi_p2p.leases._spec import TASK_ID_CHARS
from populi_p2p.leases._table import LeaseTable
from populi_p2p.leases.agent_base import AgentBase
from populi_p2p.leases.agent_commands import Gossip, SendTo
from populi_p2p.leases.agent_wire import GrantRequest, RenewDigest, decode
from populi_p2p.leases.config import LeaseConfig
from tests.leases.agent_harness import sign_as, verify

CONFIG = LeaseConfig.local()
TID = "ab" * (TASK_ID_CHARS // 2)


def make_base(me: str = "a") -> AgentBase:
    table = LeaseTable(CONFIG, me, sign_as(me), verify)
    return AgentBase(
        CONFIG, me, sign_as(me), verify, members=lambda: {me, "b"},
        candidates=lambda spec, rel: [], rng=random.Random(1), table=table,
    )  # fmt: skip


def test_a_message_to_another_node_is_sent_and_signed_by_the_envelope() -> None:
    agent = make_base()
    (cmd,) = agent._to("b", GrantRequest(TID, 1, "a"), 0.0)
    assert isinstance(cmd, SendTo) and cmd.node == "b"
    assert decode(cmd.payload) == GrantRequest(TID, 1, "a")
    assert cmd.after_commit  # a grant request may follow a commit of ours


def test_renewals_do_not_wait_for_a_commit() -> None:
    (cmd,) = make_base()._to("b", RenewDigest(1, 2, b"\0" * 8), 0.0)
    assert isinstance(cmd, SendTo) and not cmd.after_commit


def test_a_message_to_ourselves_is_handled_by_the_protocol_not_sent() -> None:
    with pytest.raises(NotImplementedError):  # the base has no protocol
        make_base()._to("a", GrantRequest(TID, 1, "a"), 0.0)


def test_a_gossiped_delta_is_echoed_each_interval_until_the_ttl() -> None:
    agent = make_base()
    agent.ready = False  # nothing to place: the echo is the only deadline
    assert agent._gossip("k", b"delta", 0.0) == Gossip("k", b"delta")
    step = CONFIG.lease_renew_interval
    echoes, now = 0, 0.0
    while (at := agent.next_deadline()) is not None:
        assert at == pytest.approx(now + step)
        now = at
        echoes += len(agent._echoes(now))
    assert echoes == int(CONFIG.lease_ttl / step) - 1
    assert agent._echoes(now + 100.0) == []
