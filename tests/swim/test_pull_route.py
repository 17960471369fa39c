"""Where a pull is answered (`swim._pull`): never at the address the request names.

Issue 18, row 4: a pull answered at its `source_address` let any enrolled key aim
6 to 9 bytes of records per byte asked at a victim, and have members open TCP
connections to it. These tests pin the rule that replaced it: the requester's held
address, or the packet's source within the request's size, and never a stream to an
address only a packet names.
"""

from __future__ import annotations

import random

import attrs
from hypothesis import given
from hypothesis import strategies as st

from swim import Address, Membership, Output, Send
from swim._pull import parts_within, pull_answer_route
from swim.wire import Alive, Pull, decode_packet, encode, encode_packet
from tests.swim.helpers import TEST_CONFIG, address_of

RECORD = b"r" * 340
REQUESTER = ("10.0.0.50", 7946)
VICTIM = ("10.0.0.99", 53)


def core(members: int = 6) -> Membership:
    """A core holding "x" at REQUESTER and `members` others with full records."""
    me = Membership(
        attrs.evolve(TEST_CONFIG, lean_alive_meta_min=TEST_CONFIG.meta_size_max),
        "me", address_of(1), random.Random(1), 0.0, meta=RECORD,
    )  # fmt: skip
    me.receive(REQUESTER, encode(Alive("x", 0, REQUESTER, b"")), 0.5)
    for i in range(members):
        me.receive(REQUESTER, encode(Alive(f"b{i}", 0, address_of(10 + i), RECORD)), 0.5)
    return me


def sends(outputs: list[Output]) -> list[Send]:
    return [o for o in outputs if isinstance(o, Send)]


def pull(names: tuple[str, ...], requester: str = "x", named: Address = VICTIM) -> bytes:
    return encode(Pull(requester, named, names))


ALL = (*(f"b{i}" for i in range(6)), "me")
#: Every record, then names nobody holds: a request of about 1,000 bytes, room for two.
PADDED = ALL + tuple(f"nobody-{i:02}-" + "z" * 24 for i in range(24))


def test_the_rule_table() -> None:
    held, elsewhere = ("10.0.0.5", 7946), ("10.0.0.6", 7946)
    ephemeral = ("10.0.0.5", 51234)
    assert pull_answer_route(held, held, False) == (held, False)
    assert pull_answer_route(held, elsewhere, False) == (elsewhere, True)
    assert pull_answer_route(None, elsewhere, False) == (elsewhere, True)
    assert pull_answer_route(held, ephemeral, True) == (held, False)
    assert pull_answer_route(held, ("10.0.0.6", 51234), True) is None
    assert pull_answer_route(None, ephemeral, True) is None


def test_a_held_requester_gets_the_whole_answer_at_its_held_address() -> None:
    me = core()
    request = pull(ALL)
    out = sends(me.receive(REQUESTER, request, 1.0))
    assert out and {s.destination for s in out} == {REQUESTER}
    assert sum(len(decode_packet(s.payload)) for s in out) == len(ALL)
    # What it asked for is what it gets, several times the request: it asked.
    assert sum(len(s.payload) for s in out) > 2 * len(request)


def test_the_same_pull_from_an_address_we_cannot_tie_to_it_is_cut_to_its_size() -> None:
    me = core()
    request = pull(PADDED)
    stranger = ("10.0.0.77", 4000)
    out = sends(me.receive(stranger, request, 1.0))
    assert [s.destination for s in out] == [stranger] and not out[0].reliable
    assert len(out[0].payload) <= len(request)
    stats = me.statistics()
    assert stats.pull_answers_capped == 1
    assert stats.pulled_records_sent == len(decode_packet(out[0].payload)) >= 1
    # A requester nobody holds, from its own address: the same.
    out = sends(me.receive(stranger, pull(PADDED, requester="new", named=stranger), 1.1))
    assert len(out) == 1 and len(out[0].payload) <= len(request)


def test_a_pull_too_small_to_carry_a_record_back_gets_nothing() -> None:
    me = core()
    out = me.receive(("10.0.0.77", 4000), pull(("b0",), named=VICTIM), 1.0)
    assert sends(out) == []
    assert me.statistics().pull_answers_capped == 1


def test_over_a_stream_the_answer_goes_to_the_held_address_from_its_host_only() -> None:
    me = core()
    connection = (REQUESTER[0], 51234)
    out = sends(me.receive(connection, pull(ALL), 1.0, reliable=True))
    assert out and all(s.destination == REQUESTER and s.reliable for s in out)
    # From another host (an insider whose held address is someone else's): refused,
    # and no connection anywhere.
    assert sends(me.receive(("10.0.0.66", 40000), pull(ALL), 1.1, reliable=True)) == []
    # From a requester nobody holds: refused too.
    out = me.receive(("10.0.0.66", 40000), pull(ALL, requester="new"), 1.2, reliable=True)
    assert sends(out) == []
    assert me.statistics().pulls_refused == 2


def test_a_pull_in_another_members_name_is_refused() -> None:
    """The driver says who signed the packet: "b0" cannot ask in "x"'s name, whatever
    address it sends from (here x's own: the spoofed-source case)."""
    me = core()
    assert sends(me.receive(REQUESTER, pull(ALL), 1.0, sender="b0")) == []
    assert me.statistics().pulls_refused == 1
    out = sends(me.receive(REQUESTER, pull(ALL), 1.1, sender="x"))
    assert {s.destination for s in out} == {REQUESTER}


def test_an_authenticated_requester_sending_from_elsewhere_is_cut_to_size() -> None:
    me = core()
    request = pull(PADDED)
    out = sends(me.receive(("10.0.0.5", 9999), request, 1.0, sender="x"))
    assert [s.destination for s in out] == [("10.0.0.5", 9999)]
    assert len(out[0].payload) <= len(request)


ADDRESSES = st.tuples(
    st.sampled_from(["10.0.0.50", "10.0.0.51", "10.0.0.99", "10.0.0.10"]),
    st.sampled_from([7946, 53, 51234]),
)


@given(
    source=ADDRESSES,
    named=ADDRESSES,
    requester=st.sampled_from(["x", "b0", "new", "me"]),
    sender=st.sampled_from([None, "x", "b0"]),
    reliable=st.booleans(),
    names=st.lists(st.sampled_from([*ALL, "x", "nobody"]), max_size=12),
)
def test_no_answer_goes_where_the_request_alone_points(
    source: Address,
    named: Address,
    requester: str,
    sender: str | None,
    reliable: bool,
    names: list[str],
) -> None:
    """Whatever the pull says: an answer goes to the packet's source or to the
    requester's held address (over a stream, only from its host); anything beyond
    the request's size goes only to the authenticated requester's held address,
    which is also where the request came from."""
    me = core()
    request = pull(tuple(names), requester=requester, named=named)
    out = sends(me.receive(source, request, 1.0, reliable=reliable, sender=sender))
    held = me.member(requester)
    held_address = held.address if held is not None and requester != "me" else None
    for send in out:
        assert send.destination in (source, held_address)
        if send.destination != source:  # a stream's answer: to the held address
            assert reliable and held_address is not None and held_address[0] == source[0]
    if sender is not None and sender != requester:
        assert out == []
    if held_address != source and not reliable:
        assert sum(len(s.payload) for s in out) <= len(request)
        assert not any(s.reliable for s in out)


@given(st.lists(st.binary(min_size=1, max_size=600), max_size=8), st.integers(0, 3000))
def test_a_capped_answer_fits_its_budget_and_keeps_the_order(
    parts: list[bytes], budget: int
) -> None:
    kept = parts_within(parts, budget)
    assert kept == parts[: len(kept)]
    if kept:
        assert len(encode_packet(kept)) <= budget
    if len(kept) < len(parts):
        assert len(encode_packet(parts[: len(kept) + 1])) > budget
