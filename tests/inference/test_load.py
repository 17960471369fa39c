"""The accepting node's live count of outstanding requests (`LoadBook`, sans-IO):
its own relays exactly, the others' from the serving node's reported queue, the
record when no report is fresh, and the failure gate's window."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.inference.load import FAILING_SECONDS, MAX_NODES, REPORT_TTL, LoadBook

RECORD = {"inflight": 0}


def test_own_relays_count_at_once_and_end() -> None:
    book = LoadBook()
    book.begin("a", "m")
    book.begin("a", "m")
    book.begin("a", "other")
    assert book.outstanding("m", [("a", RECORD), ("b", RECORD)], 0.0) == {"a": 2, "b": 0}
    book.end("a", "m")
    book.end("a", "m")
    book.end("a", "m")  # one end too many never goes below zero
    assert book.outstanding("m", [("a", RECORD)], 0.0) == {"a": 0}
    assert book.ours("a", "other") == 1


def test_the_reported_queue_adds_the_other_accepting_nodes_requests() -> None:
    book = LoadBook()
    book.begin("a", "m")
    book.reported("a", "m", 5, now=10.0)  # 5 in flight there, 1 of them ours
    assert book.outstanding("m", [("a", RECORD)], 10.0) == {"a": 5}
    book.begin("a", "m")
    assert book.outstanding("m", [("a", RECORD)], 11.0) == {"a": 6}
    # The report goes stale: the record's inflight (less ours) stands in.
    later = 10.0 + REPORT_TTL + 0.1
    assert book.outstanding("m", [("a", {"inflight": 3})], later) == {"a": 3}
    assert book.outstanding("m", [("a", {"inflight": 1})], later) == {"a": 2}
    assert book.outstanding("m", [("a", {"inflight": "x"})], later) == {"a": 2}


def test_a_failed_node_is_failing_for_a_while_or_until_it_serves() -> None:
    book = LoadBook()
    book.outcome("a", False, now=100.0)
    assert book.failing(100.0 + FAILING_SECONDS - 0.01) == {"a"}
    assert book.failing(100.0 + FAILING_SECONDS) == frozenset()
    book.outcome("b", False, now=200.0)
    book.outcome("b", True, now=200.5)
    assert book.failing(200.6) == frozenset()


def test_reports_and_failures_are_bounded() -> None:
    book = LoadBook()
    for i in range(MAX_NODES + 10):
        book.reported(f"n{i}", "m", 1, now=0.0)
        book.outcome(f"n{i}", False, now=0.0)
    assert len(book._theirs) == MAX_NODES and len(book._failed_at) == MAX_NODES


@given(st.lists(st.tuples(st.sampled_from("ab"), st.booleans()), max_size=60))
def test_ours_is_begins_minus_ends(steps: list[tuple[str, bool]]) -> None:
    book = LoadBook()
    live = {"a": 0, "b": 0}
    for node, begin in steps:
        if begin:
            book.begin(node, "m")
            live[node] += 1
        elif live[node]:
            book.end(node, "m")
            live[node] -= 1
    assert book.outstanding("m", [("a", RECORD), ("b", RECORD)], 0.0) == live
