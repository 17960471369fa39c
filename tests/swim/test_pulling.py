"""Lean alive rumors (`AliveRef`) and the pull that fetches a record a receiver lacks."""

from __future__ import annotations

import random

import attrs
import msgpack

from swim import MemberJoined, Membership, MemberState, MemberUpdated, Output, SelfRefuted, Send
from swim.wire import (
    PROTOCOL_VERSION,
    Alive,
    AliveRef,
    Message,
    Pull,
    decode_packet,
    encode,
    meta_digest,
)
from tests.swim.helpers import TEST_CONFIG, Cluster, address_of

RECORD = b"r" * 340
SENDER = ("10.0.0.50", 7946)
OTHER = ("10.0.0.51", 7946)


def core(**config: object) -> Membership:
    return Membership(
        attrs.evolve(TEST_CONFIG, **config),  # type: ignore[arg-type]
        "me",
        address_of(1),
        random.Random(1),
        0.0,
        meta=RECORD,
    )


def sends(outputs: list[Output]) -> list[Send]:
    return [o for o in outputs if isinstance(o, Send)]


def messages_of(outputs: list[Output], kind: type) -> list[tuple[Send, Message]]:
    return [(s, m) for s in sends(outputs) for m in decode_packet(s.payload) if type(m) is kind]


def pulls(outputs: list[Output]) -> list[tuple[Send, Pull]]:
    return messages_of(outputs, Pull)  # type: ignore[return-value]


def lean(name: str, incarnation: int, meta: bytes = RECORD, index: int = 2) -> AliveRef:
    return AliveRef(name, incarnation, address_of(index), meta_digest(meta))


def test_gossip_carries_the_digest_of_large_metadata_and_small_metadata_whole() -> None:
    big = core()
    queued = big._broadcasts.pending("me")
    assert queued is not None
    assert decode_packet(bytes([PROTOCOL_VERSION, 0x91]) + queued) == [
        AliveRef("me", 0, address_of(1), meta_digest(RECORD))
    ]
    assert len(queued) < 60 < len(RECORD)
    small = Membership(TEST_CONFIG, "s", address_of(1), random.Random(1), 0.0, meta=b"m" * 64)
    queued = small._broadcasts.pending("s")
    assert queued is not None
    assert decode_packet(bytes([PROTOCOL_VERSION, 0x91]) + queued) == [
        Alive("s", 0, address_of(1), b"m" * 64)
    ]


def test_a_lean_rumor_about_held_metadata_is_applied_without_a_pull() -> None:
    me = core()
    me.receive(SENDER, encode(Alive("b", 0, address_of(2), RECORD)), 1.0)
    out = me.receive(SENDER, encode(lean("b", 5)), 2.0)
    member = me.member("b")
    assert member is not None and member.incarnation == 5 and member.meta == RECORD
    assert not pulls(out)
    assert not [o for o in out if isinstance(o, MemberUpdated | MemberJoined)]
    assert me.statistics().lean_alives_applied == 1
    # Re-gossiped lean, as received.
    queued = me._broadcasts.pending("b")
    assert queued is not None and len(queued) < 60


def test_an_unknown_member_is_pulled_from_the_sender_and_joins_with_its_record() -> None:
    me = core()
    out = me.receive(SENDER, encode(lean("c", 3)), 1.0)
    assert me.member("c") is None  # nothing applied without the record
    assert not [o for o in out if isinstance(o, MemberJoined)]
    [(send, request)] = pulls(out)
    assert send.destination == SENDER and not send.reliable
    assert request == Pull("me", address_of(1), ("c",))
    # The sender answers with the full alive; the member joins with its record.
    out = me.receive(SENDER, encode(Alive("c", 3, address_of(2), RECORD)), 1.01)
    [joined] = [o for o in out if isinstance(o, MemberJoined)]
    assert joined.member.meta == RECORD and joined.member.incarnation == 3
    stats = me.statistics()
    assert stats.pulls_sent == 1 and stats.pulls_completed == 1
    assert not me._pulls
    assert me.next_deadline() is not None
    # No retry fires later: the pull is over.
    out = me.tick(1.0 + 2 * TEST_CONFIG.pull_timeout)
    assert not pulls(out)


def test_a_newer_incarnation_with_other_metadata_is_pulled_and_held_back() -> None:
    me = core()
    me.receive(SENDER, encode(Alive("b", 0, address_of(2), RECORD)), 1.0)
    out = me.receive(SENDER, encode(lean("b", 1, b"new record" * 10)), 2.0)
    assert [p.names for _, p in pulls(out)] == [("b",)]
    member = me.member("b")
    assert member is not None and member.incarnation == 0 and member.meta == RECORD
    out = me.receive(SENDER, encode(Alive("b", 1, address_of(2), b"new record" * 10)), 2.01)
    [updated] = [o for o in out if isinstance(o, MemberUpdated)]
    assert updated.member.meta == b"new record" * 10


def test_pulls_are_deduplicated_retried_elsewhere_then_given_up() -> None:
    me = core()
    out = me.receive(SENDER, encode(lean("c", 3, index=7), lean("d", 1, index=8)), 1.0)
    # One request for both names, to the sender.
    assert [(s.destination, p.names) for s, p in pulls(out)] == [(SENDER, ("c", "d"))]
    # More copies, from another sender, ask nothing while the pull is outstanding.
    out = me.receive(OTHER, encode(lean("c", 3, index=7)), 1.1)
    assert not pulls(out)
    timeout = TEST_CONFIG.pull_timeout
    # Second try: "c" from the latest other sender, "d" from the member itself.
    out = me.tick(1.0 + timeout)
    asked = {(s.destination, p.names) for s, p in pulls(out)}
    assert asked == {(OTHER, ("c",)), (address_of(8), ("d",))}
    # Third and last try: each from the member itself.
    out = me.tick(1.0 + 2 * timeout)
    asked = {(s.destination, p.names) for s, p in pulls(out)}
    assert asked == {(address_of(7), ("c",)), (address_of(8), ("d",))}
    out = me.tick(1.0 + 3 * timeout)
    assert not pulls(out)
    stats = me.statistics()
    assert stats.pulls_sent == 5 and stats.pulls_given_up == 2
    assert not me._pulls and me.member("c") is None
    # A later copy starts over.
    out = me.receive(SENDER, encode(lean("c", 3, index=7)), 10.0)
    assert [p.names for _, p in pulls(out)] == [("c",)]


def test_a_lean_rumor_over_a_stream_is_pulled_from_the_member_itself() -> None:
    me = core()
    out = me.receive(("10.0.0.50", 51234), encode(lean("c", 3, index=7)), 1.0, reliable=True)
    assert [(s.destination, p.names) for s, p in pulls(out)] == [(address_of(7), ("c",))]


def test_outstanding_pulls_are_bounded() -> None:
    me = core(pull_pending_max=4)
    rumors = [lean(f"n{i}", 1, index=10 + i) for i in range(10)]
    out = me.receive(SENDER, encode(*rumors), 1.0)
    assert sum(len(p.names) for _, p in pulls(out)) == 4
    assert me.statistics().pulls_dropped_full == 6


def held_requester(me: Membership) -> None:
    """Make "x", at SENDER, a member `me` holds: its pulls are answered in full there."""
    me.receive(SENDER, encode(Alive("x", 0, SENDER, b"")), 0.5)


def test_a_pull_is_answered_with_full_records_of_live_members_only() -> None:
    me = core()
    held_requester(me)
    me.receive(SENDER, encode(Alive("b", 2, address_of(2), RECORD)), 1.0)
    me.receive(SENDER, encode(Alive("gone", 0, address_of(3), RECORD)), 1.0)
    me._apply(3, "gone", 0, 1.0, [])  # left (Rumor.LEFT)
    assert me.member("gone") is not None and me.member("gone").state is MemberState.LEFT  # type: ignore[union-attr]
    out = me.receive(SENDER, encode(Pull("x", OTHER, ("b", "me", "gone", "unknown", "b"))), 2.0)
    [send] = sends(out)
    assert send.destination == SENDER and not send.reliable  # never the address it names
    assert decode_packet(send.payload) == [
        Alive("b", 2, address_of(2), RECORD),
        Alive("me", 0, address_of(1), RECORD),
    ]
    assert me.statistics().pulled_records_sent == 2


def test_an_answer_over_the_packet_budget_is_split_into_datagrams() -> None:
    me = core()
    held_requester(me)
    for i in range(8):
        me.receive(SENDER, encode(Alive(f"b{i}", 0, address_of(10 + i), RECORD)), 1.0)
    out = me.receive(SENDER, encode(Pull("x", OTHER, tuple(f"b{i}" for i in range(8)))), 2.0)
    answers = sends(out)
    assert len(answers) == 3 and not any(s.reliable for s in answers)  # 3 records each
    assert all(len(s.payload) <= TEST_CONFIG.packet_budget for s in answers)
    got = [m.name for s in answers for m in decode_packet(s.payload)]  # type: ignore[union-attr]
    assert got == [f"b{i}" for i in range(8)]


def test_a_record_over_the_packet_budget_is_answered_reliably() -> None:
    me = core()
    held_requester(me)
    me.receive(SENDER, encode(Alive("big", 0, address_of(10), b"x" * 2000)), 1.0)
    me.receive(SENDER, encode(Alive("b", 0, address_of(11), RECORD)), 1.0)
    out = me.receive(SENDER, encode(Pull("x", OTHER, ("big", "b"))), 2.0)
    assert [(s.reliable, len(decode_packet(s.payload))) for s in sends(out)] == [
        (True, 1),
        (False, 1),
    ]


def test_a_flood_of_pulls_costs_bounded_output() -> None:
    """An insider asking for every name, over and over: each pull is answered with at
    most `pull_names_max` records, whatever it asked for."""
    most = TEST_CONFIG.pull_names_max
    me = core()
    held_requester(me)
    names = [f"b{i}" for i in range(200)]
    for i, name in enumerate(names):
        me.receive(SENDER, encode(Alive(name, 0, ("10.1.0.1", i), RECORD)), 1.0)
    record_bytes = len(encode(Alive("b199", 0, ("10.1.0.1", 199), RECORD))) - 2
    floods = 100
    sent = 0
    for k in range(floods):
        ask = tuple(names[k % 50 :] + names[: k % 50])
        out = me.receive(SENDER, encode(Pull("x", OTHER, ask)), 2.0 + k * 0.001)
        for send in sends(out):
            sent += len(send.payload)
            assert len(decode_packet(send.payload)) <= most
    assert sent <= floods * (most * record_bytes + 8)
    stats = me.statistics()
    assert stats.pulled_records_sent == floods * most
    assert stats.pull_names_refused == floods * (200 - most)


def test_malformed_lean_rumors_are_dropped_and_counted() -> None:
    me = core()
    bad = bytes([PROTOCOL_VERSION]) + msgpack.packb([[11, "c", 1, ["h", 1], b"short"]])
    assert me.receive(SENDER, bad, 1.0) == []
    assert me.statistics().dropped_malformed == 1
    out_of_range = bytes([PROTOCOL_VERSION]) + msgpack.packb(
        [[11, "c", 2**63, ["h", 1], b"12345678"]]
    )
    assert me.receive(SENDER, out_of_range, 1.0) == []
    assert me.statistics().dropped_out_of_range == 1
    assert me.member("c") is None and not me._pulls


def test_lean_rumors_about_ourselves_refute_only_what_differs() -> None:
    me = core()
    assert not me.receive(SENDER, encode(lean("me", 0, index=1)), 1.0)  # our own echo
    out = me.receive(SENDER, encode(lean("me", 0, b"an older run's record", index=1)), 1.0)
    assert [o for o in out if isinstance(o, SelfRefuted)] == [SelfRefuted(1)]
    out = me.receive(SENDER, encode(lean("me", 5, index=1)), 1.0)
    assert [o for o in out if isinstance(o, SelfRefuted)] == [SelfRefuted(6)]
    out = me.receive(SENDER, encode(lean("me", 6, index=9)), 1.0)  # another address
    assert [o for o in out if isinstance(o, SelfRefuted)] == [SelfRefuted(7)]
    assert not me._pulls


def formed(lean_alive_meta_min: int, seed: int) -> Cluster:
    config = attrs.evolve(TEST_CONFIG, lean_alive_meta_min=lean_alive_meta_min)
    cluster = Cluster(config=config, seed=seed)
    for i in range(24):
        cluster.add(meta=bytes([i]) * 340)
    cluster.join_all()
    cluster.run(30.0)
    return cluster


def test_a_cluster_with_large_records_forms_with_every_record_and_fewer_bytes() -> None:
    lean_run = formed(64, seed=4)
    full_run = formed(TEST_CONFIG.meta_size_max, seed=4)
    for cluster in (lean_run, full_run):
        assert cluster.converged()
        for observer, core_ in cluster.nodes.items():
            for member in core_.members():
                assert member.meta == cluster.nodes[member.name].meta, (observer, member.name)
        # Every join event carried the member's record.
        for _, _, event in cluster.events:
            if isinstance(event, MemberJoined):
                assert len(event.member.meta) == 340
    stats = [c.statistics() for c in lean_run.nodes.values()]
    assert sum(s.pulls_completed for s in stats) > 0
    gossip_bytes = sum(len(s.payload) for _, _, s in lean_run.sent if not s.reliable)
    full_bytes = sum(len(s.payload) for _, _, s in full_run.sent if not s.reliable)
    assert gossip_bytes < 0.6 * full_bytes, (gossip_bytes, full_bytes)
