"""Submit acks come from a few members per task, the same few on every node."""

from __future__ import annotations

from populi_p2p.services.lease_acks import ACKERS_MIN, ackers


def test_a_few_members_ack_each_task_and_every_node_picks_the_same() -> None:
    members = [f"n{i:02d}" for i in range(50)]
    picks = [ackers("t1", order, "n00", ACKERS_MIN) for order in (members, members[::-1])]
    assert picks[0] == picks[1] and len(picks[0]) == ACKERS_MIN
    assert "n00" not in picks[0]  # the submitter does not ack its own task
    # Different tasks spread the work: not always the same three members.
    spread = set().union(*(ackers(f"t{i}", members, "n00", ACKERS_MIN) for i in range(40)))
    assert len(spread) > 3 * ACKERS_MIN
    # A small mesh: everyone but the submitter acks.
    assert ackers("t1", ["a", "b", "c"], "a", ACKERS_MIN) == {"b", "c"}
