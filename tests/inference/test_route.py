"""Route choice, a pure function: filters with reasons, the ranking order, and a
decision that does not depend on the order the view lists members in."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.inference.route import Candidate, choose_route

M = {"tiny": {"kind": "standin", "ctx": 0, "tps": 0.0, "inflight": 0}}


def cand(node: str, **kw: object) -> Candidate:
    base: dict[str, object] = {
        "node_id": node, "name": node, "state": "alive", "draining": False, "models": M,
        "rtt": 0.001,
    }  # fmt: skip
    base.update(kw)
    return Candidate(**base)  # type: ignore[arg-type]


def test_filters_say_why() -> None:
    view = [
        cand("a", state="suspect"),
        cand("b", state="dead"),
        cand("c", draining=True),
        cand("d", models={}),
        cand("e", models={"other": {"inflight": 0}}),
        cand("f"),
    ]
    d = choose_route("tiny", view, {}, 0.25)
    assert d.order == ("f",)
    assert d.ruled_out == {
        "a": "suspect", "b": "dead", "c": "draining", "d": "no healthy engine",
        "e": "does not serve the model",
    }  # fmt: skip


def test_a_suspect_node_gets_no_new_requests() -> None:
    """Even when it is the best by every other measure."""
    view = [cand("best", state="suspect", rtt=0.0001), cand("other", rtt=0.05)]
    assert choose_route("tiny", view, {"best": 0.99, "other": 0.1}, 0.25).order == ("other",)


def test_ranking_order_reliability_then_load_then_rtt() -> None:
    busy = {"tiny": {"inflight": 4}}
    view = [
        cand("fast_unreliable", rtt=0.0001),
        cand("reliable_busy", models=busy, rtt=0.01),
        cand("reliable_idle_far", rtt=0.05),
        cand("reliable_idle_near", rtt=0.001),
    ]
    rel = {"reliable_busy": 0.9, "reliable_idle_far": 0.9, "reliable_idle_near": 0.9}
    d = choose_route("tiny", view, rel, 0.25)
    assert d.order == (
        "reliable_idle_near", "reliable_idle_far", "reliable_busy", "fast_unreliable",
    )  # fmt: skip
    assert d.header().startswith("loaded;reliability=0.900;load=0.00;rtt=1.0ms")


def test_self_counts_as_zero_rtt_and_bounded_list() -> None:
    view = [cand(f"n{i}") for i in range(10)] + [cand("me", rtt=None, is_self=True)]
    d = choose_route("tiny", view, {}, 0.25, max_candidates=3)
    assert d.order[0] == "me" and len(d.order) == 3


def test_nothing_capable_is_an_empty_order() -> None:
    d = choose_route("tiny", [cand("a", state="left")], {}, 0.25)
    assert d.order == () and d.header() == "none"


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["alive", "alive", "suspect", "dead"]),
            st.booleans(),
            st.integers(0, 8),
            st.one_of(st.none(), st.floats(0, 1)),
            st.floats(0, 1),
        ),
        max_size=12,
    ),
    st.randoms(use_true_random=False),
)
def test_decision_ignores_view_order(rows: list[tuple], rnd: random.Random) -> None:
    view = [
        cand(f"n{i}", state=s, draining=dr, models={"tiny": {"inflight": inf}}, rtt=rtt)
        for i, (s, dr, inf, rtt, _) in enumerate(rows)
    ]
    rel = {f"n{i}": r for i, (*_, r) in enumerate(rows)}
    first = choose_route("tiny", view, rel, 0.25)
    rnd.shuffle(view)
    again = choose_route("tiny", view, rel, 0.25)
    assert first.order == again.order
    for node in first.order:
        assert dict(first.ruled_out).get(node) is None


def test_package_exports_exist() -> None:
    import populi_p2p.inference as inference

    for name in inference.__all__:
        assert getattr(inference, name) is not None
