"""Earned reliability: monotonic in successes, decays toward the prior, new nodes low."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.leases import LeaseConfig, TaskResult
from populi_p2p.leases.reliability import Outcome, earned_reliability, prior_reliability

from .helpers import spec, table

CFG = LeaseConfig()


def test_new_nodes_start_low() -> None:
    assert prior_reliability(CFG) == 0.25
    assert earned_reliability([], 0.0, CFG) == {}


@settings(derandomize=True, max_examples=100)
@given(st.integers(0, 30), st.integers(0, 30))
def test_monotonic_in_successes_and_losses(s: int, f: int) -> None:
    def rel(succ: int, fail: int) -> float:
        obs = [Outcome("n", True, 0.0)] * succ + [Outcome("n", False, 0.0)] * fail
        return earned_reliability(obs, 0.0, CFG).get("n", prior_reliability(CFG))

    assert rel(s + 1, f) > rel(s, f)
    assert rel(s, f + 1) < rel(s, f)


def test_decays_toward_the_prior() -> None:
    obs = [Outcome("n", True, 0.0)] * 20
    h = CFG.reliability_half_life
    fresh, aged, old = (earned_reliability(obs, t, CFG)["n"] for t in (0.0, h, 20 * h))
    assert fresh > aged > old > prior_reliability(CFG)
    assert abs(old - prior_reliability(CFG)) < 1e-3
    # one half-life halves the evidence: 1 + 10 successes over 4 + 10
    assert abs(aged - 11 / 14) < 1e-9


def test_outcomes_come_from_the_lease_table() -> None:
    a = table("a")
    t1, _ = a.submit(spec(1, by="a"), 0.0)
    t2, _ = a.submit(spec(2, by="a"), 0.0)
    t3, _ = a.submit(spec(3, by="a"), 0.0)
    a.claim(t1, 1, 0, "", 1.0)
    a.post_result(t1, TaskResult(0), 2.0)  # success for a
    a.claim(t2, 1, 0, "", 1.0)
    a.post_result(t2, TaskResult(1, node_fault=True), 2.0)  # a's fault
    a.claim(t3, 1, 0, "", 1.0)
    a.post_result(t3, TaskResult(1), 2.0)  # the task's fault: no evidence
    got = sorted((o.node, o.success) for o in a.outcomes())
    assert got == [("a", False), ("a", True)]
    assert earned_reliability(a.outcomes(), 2.0, CFG)["a"] == 2 / 6
