"""`RequestLog`: the recent routes, bounded, each entry filled in as its request goes."""

from __future__ import annotations

import time

from populi_p2p.inference.request_log import RECENT_ROUTES, RequestLog
from populi_p2p.inference.route import RouteDecision, Score

SCORE = Score(healthy=True, reliability=1.0, outstanding=1, slots=4, cost=0.0, rtt=0.002)


def decision(*order: str) -> RouteDecision:
    return RouteDecision("m", order, {n: SCORE for n in order}, {}, {})


def test_an_entry_names_the_nodes_and_why_the_first_was_chosen() -> None:
    log = RequestLog()
    before = time.time()
    entry = log.open("m", "/v1/chat/completions", True, decision("id-a", "id-b"),
                     {"id-a": "alpha"}, decision_ms=0.12345)  # fmt: skip
    assert before <= entry["at"] <= time.time()
    assert entry["order"] == ["alpha", "id-b"]  # a name where known, else the id
    assert entry["route"] == decision("id-a", "id-b").header()
    assert entry["decision_ms"] == 0.123 and entry["stream"] is True
    entry["node"] = "alpha"  # the caller fills in the outcome later
    assert log.recent()[0]["node"] == "alpha"


def test_the_log_keeps_the_newest_in_order() -> None:
    log = RequestLog(size=3)
    for i in range(5):
        log.open(f"m{i}", "/v1/completions", False, decision(), {}, 0.0)
    assert [e["model"] for e in log.recent()] == ["m2", "m3", "m4"]
    assert log.recent()[0]["route"] == "none"
    assert RequestLog()._recent.maxlen == RECENT_ROUTES
