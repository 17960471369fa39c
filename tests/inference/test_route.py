"""Route choice, a pure function: filters with reasons, the gate, least outstanding
requests weighted by capacity (load before reliability between healthy nodes), and a
decision that does not depend on the order the view lists members in."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.inference.route import (
    DEFAULT_CAPACITY,
    MAX_CAPACITY,
    RELIABILITY_WEIGHT,
    Candidate,
    choose_route,
    slots_of,
)

M = {"tiny": {"kind": "standin", "ctx": 0, "tps": 0.0, "inflight": 0}}


def cand(node: str, **kw: object) -> Candidate:
    base: dict[str, object] = {
        "node_id": node, "name": node, "state": "alive", "draining": False, "models": M,
        "rtt": 0.001,
    }  # fmt: skip
    base.update(kw)
    return Candidate(**base)  # type: ignore[arg-type]


def slots(n: int) -> dict[str, dict[str, object]]:
    return {"tiny": {"inflight": 0, "slots": n}}


def test_filters_say_why() -> None:
    view = [
        cand("a", state="suspect"),
        cand("b", state="dead"),
        cand("c", draining=True),
        cand("d", models={}),
        cand("e", models={"other": {"inflight": 0}}),
        cand("f"),
        cand("g"),
    ]
    d = choose_route("tiny", view, {}, 0.25, exclude=["g"])
    assert d.order == ("f", "a")  # the suspect one last
    assert d.ruled_out == {
        "b": "dead", "c": "draining", "d": "no healthy engine",
        "e": "does not serve the model", "g": "already tried",
    }  # fmt: skip


def test_a_suspect_node_gets_no_new_request_while_an_alive_one_can_serve() -> None:
    """Even when it is the best by every other measure, and the alive one is gated as
    failing: a suspect node is the last resort, tried before a request is refused or a
    stream lost (a suspicion is often a node busy for a moment, one just restarted)."""
    view = [cand("best", state="suspect", rtt=0.0001), cand("other", rtt=0.05)]
    assert choose_route("tiny", view, {"best": 0.99, "other": 0.1}, 0.25).order == (
        "other", "best",
    )  # fmt: skip
    gated = choose_route("tiny", view, {"best": 0.99, "other": 0.01}, 0.25, failing=["other"])
    assert gated.order == ("other", "best")
    alone = choose_route("tiny", view, {"best": 0.99}, 0.25, exclude=["other"])
    assert alone.order == ("best",) and alone.header().startswith("suspect;reliability=0.990")


def test_load_ranks_before_reliability_then_rtt() -> None:
    """The issue's bug: reliability ranked above load, so a proven node drew every
    request. Now a newcomer with one request fewer goes first; at equal load the proven
    node does; then the nearer."""
    view = [
        cand("proven_busy", rtt=0.0001),
        cand("newcomer_idle_far", rtt=0.05),
        cand("newcomer_idle_near", rtt=0.001),
        cand("proven_idle", rtt=0.01),
    ]
    rel = {"proven_busy": 0.99, "proven_idle": 0.99}
    out = {"proven_busy": 1}
    d = choose_route("tiny", view, rel, 0.25, outstanding=out)
    assert d.order == ("proven_idle", "newcomer_idle_near", "newcomer_idle_far", "proven_busy")
    assert d.header().startswith("loaded;reliability=0.990;load=0.00;outstanding=0/4;rtt=10.0ms")


def test_the_record_counts_when_no_live_count_is_given() -> None:
    view = [cand("a", models={"tiny": {"inflight": 3}}), cand("b", rtt=0.5)]
    assert choose_route("tiny", view, {}, 0.25).order == ("b", "a")
    assert choose_route("tiny", view, {}, 0.25, outstanding={"a": 0}).order == ("a", "b")


def test_the_gate_failing_and_unreliable_nodes_serve_only_when_nothing_healthy_is_left() -> None:
    view = [cand("failed_just_now"), cand("unreliable"), cand("busy")]
    rel = {"unreliable": 0.1, "busy": 0.25}
    out = {"busy": 20}
    d = choose_route("tiny", view, rel, 0.25, outstanding=out, failing={"failed_just_now"})
    assert d.order[0] == "busy"
    assert set(d.order[1:]) == {"failed_just_now", "unreliable"}
    alone = choose_route("tiny", [cand("unreliable")], rel, 0.25)
    assert alone.order == ("unreliable",) and alone.header().startswith("failing;")


def test_capacity_weights_the_load() -> None:
    """12 requests, one after the other, none finished: 8 slots take 8, 4 take 4."""
    view = [cand("big", models=slots(8)), cand("small", models=slots(4))]
    out = {"big": 0, "small": 0}
    for _ in range(12):
        out[choose_route("tiny", view, {}, 0.25, outstanding=out).order[0]] += 1
    assert out == {"big": 8, "small": 4}


def test_equal_nodes_alternate_and_the_tie_break_depends_on_the_accepting_node() -> None:
    view = [cand("a"), cand("b")]
    firsts = {choose_route("tiny", view, {}, 0.25, salt=f"front{i}").order[0] for i in range(20)}
    assert firsts == {"a", "b"}  # accepting nodes do not all pick the same node
    out = {"a": 0, "b": 0}
    for _ in range(16):
        out[choose_route("tiny", view, {}, 0.25, outstanding=out, salt="f").order[0]] += 1
    assert out == {"a": 8, "b": 8}


def test_self_counts_as_zero_rtt_and_bounded_list() -> None:
    view = [cand(f"n{i}") for i in range(10)] + [cand("me", rtt=None, is_self=True)]
    d = choose_route("tiny", view, {}, 0.25, max_candidates=3)
    assert d.order[0] == "me" and len(d.order) == 3


def test_nothing_capable_is_an_empty_order() -> None:
    d = choose_route("tiny", [cand("a", state="left")], {}, 0.25)
    assert d.order == () and d.header() == "none"


def test_slots_from_the_record() -> None:
    assert slots_of({"slots": 8}) == 8
    assert slots_of({"slots": 10**9}) == MAX_CAPACITY
    for bad in (None, 0, -3, True, "8", 2.5):
        assert slots_of({"slots": bad}) == DEFAULT_CAPACITY


ROWS = st.lists(
    st.tuples(
        st.sampled_from(["alive", "alive", "suspect", "dead"]),
        st.booleans(),
        st.integers(0, 8),
        st.one_of(st.none(), st.floats(0, 1)),
        st.floats(0, 1),
    ),
    max_size=12,
)


@given(ROWS, st.randoms(use_true_random=False))
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
    states = [next(c.state for c in view if c.node_id == n) for n in first.order]
    assert states == sorted(states)  # every alive node before any suspect one
    assert "dead" not in states


@given(
    st.lists(st.integers(1, 16), min_size=2, max_size=6),
    st.floats(0.15, 1),
    st.integers(1, 200),
)
def test_arrivals_fill_nodes_in_proportion_to_their_capacity(
    capacities: list[int], rel: float, arrivals: int
) -> None:
    """Any number of requests arriving one by one (none finished) over healthy nodes of
    the same reliability: no node is more than one request past its share of
    capacity, measured against any other: (o_i + k) / s_i <= (o_j + 1 + k) / s_j, with
    k the reliability's weight (the same for all here)."""
    view = [cand(f"n{i}", models=slots(c)) for i, c in enumerate(capacities)]
    out = {c.node_id: 0 for c in view}
    rels = dict.fromkeys(out, rel)
    for _ in range(arrivals):
        out[choose_route("tiny", view, rels, 0.25, outstanding=out).order[0]] += 1
    k = RELIABILITY_WEIGHT * (1 - rel)
    for i, si in enumerate(capacities):
        for j, sj in enumerate(capacities):
            if out[f"n{i}"]:  # its last request cost it no more than j would have
                assert (out[f"n{i}"] + k) / si <= (out[f"n{j}"] + 1 + k) / sj + 1e-9


@given(st.integers(0, 50), st.integers(1, 5), st.floats(0.15, 1), st.floats(0.15, 1))
def test_reliability_never_outranks_a_whole_request_between_healthy_nodes(
    busy: int, more: int, rel_light: float, rel_heavy: float
) -> None:
    view = [cand("light", rtt=0.5), cand("heavy", rtt=0.0001)]
    out = {"light": busy, "heavy": busy + more}
    d = choose_route("tiny", view, {"light": rel_light, "heavy": rel_heavy}, 0.25,
                     outstanding=out)  # fmt: skip
    assert d.order == ("light", "heavy")


def test_package_exports_exist() -> None:
    import populi_p2p.inference as inference

    for name in inference.__all__:
        assert getattr(inference, name) is not None
