"""Digest-first anti-entropy (issue 8, bytes goal): full entries only where a peer lacks them."""

from __future__ import annotations

import random

import attrs
import pytest

from swim import Membership, MemberState, Send
from swim.wire import Alive, Suspect, Sync, decode_packet, encode

from .helpers import TEST_CONFIG, Cluster, Network

META = b"r" * 600  # about a signed NodeRecord


def two_peers_that_agree(n: int) -> tuple[Membership, Membership]:
    a = Membership(TEST_CONFIG, "a", ("10.0.0.1", 1), random.Random(1), 0.0, meta=META)
    b = Membership(TEST_CONFIG, "b", ("10.0.0.2", 1), random.Random(2), 0.0, meta=META)
    others = [Alive(f"member-{i:04d}", 3, (f"10.0.1.{i % 250}", 7946), META) for i in range(n)]
    for core in (a, b):
        for i in range(0, len(others), 50):
            core.receive(("x", 1), encode(*others[i : i + 50]), 0.0)
    a.receive(("x", 1), encode(Alive("b", 0, b.address, META)), 0.0)
    b.receive(("x", 1), encode(Alive("a", 0, a.address, META)), 0.0)
    return a, b


def exchange(a: Membership, b: Membership, now: float) -> list[Send]:
    """One sync opened by a, carried to its end; every Send in order."""
    sends = [o for o in a.join([b.address], now) if isinstance(o, Send)]
    pending = list(sends)
    while pending:
        send = pending.pop(0)
        target, source = (b, a) if send.destination == b.address else (a, b)
        out = target.receive(source.address, send.payload, now, reliable=send.reliable)
        new = [
            o for o in out if isinstance(o, Send) and decode_packet(o.payload)[0].__class__ is Sync
        ]
        sends += new
        pending += new
    return sends


def test_a_sync_between_up_to_date_peers_sends_no_metadata() -> None:
    a, b = two_peers_that_agree(100)
    sends = exchange(a, b, 1.0)
    legs = [decode_packet(s.payload)[0] for s in sends]
    assert [m.leg for m in legs if isinstance(m, Sync)] == [0, 1]  # no closing leg needed
    reply = legs[1]
    assert isinstance(reply, Sync) and reply.members == () and reply.wanted == ()
    total = sum(len(s.payload) for s in sends)
    # The digest: ~17 bytes per member. A full-state push-pull would be ~2 x 102 x 640.
    assert total < 102 * 20 + 1400, total
    assert total < 2 * 102 * len(META) / 30


def test_an_out_of_date_peer_still_gets_the_metadata_both_ways() -> None:
    a, b = two_peers_that_agree(20)
    # b learns a newer record of member-0005; a learns a member b never heard of.
    b.receive(("x", 1), encode(Alive("member-0005", 4, ("10.0.1.5", 7946), b"new")), 0.0)
    a.receive(("x", 1), encode(Alive("late", 0, ("10.0.2.1", 7946), b"late-meta")), 0.0)
    sends = exchange(a, b, 1.0)
    got = a.member("member-0005")
    assert got is not None and got.incarnation == 4 and got.meta == b"new"
    late = b.member("late")
    assert late is not None and late.meta == b"late-meta"
    legs = [decode_packet(s.payload)[0] for s in sends]
    assert [m.leg for m in legs if isinstance(m, Sync)] == [0, 1, 2]
    # Only what was missing travelled in full.
    assert [e[0] for e in legs[1].members] == ["member-0005"]  # type: ignore[union-attr]
    assert [e[0] for e in legs[2].members] == ["late"]  # type: ignore[union-attr]


def test_suspicion_in_a_digest_is_applied_and_refuted_through_sync() -> None:
    """A digest saying we are suspect makes us refute; convergence holds through syncs."""
    cluster = Cluster(5, config=TEST_CONFIG, seed=4, network=Network())
    cluster.join_all()
    cluster.run(3.0)
    core = cluster.nodes["node-3"]
    digest = (("node-3", 0, int(MemberState.SUSPECT), 0),)
    message = Sync(0, False, "node-1", cluster.nodes["node-1"].address, digest, (), (), b"", b"")
    cluster.apply("node-3", core.receive(("x", 1), encode(message), cluster.now))
    assert core.incarnation == 1  # suspected at our own incarnation: refuted
    digest = (("node-3", 2, int(MemberState.ALIVE), 0),)
    message = Sync(0, False, "node-1", cluster.nodes["node-1"].address, digest, (), (), b"", b"")
    cluster.apply("node-3", core.receive(("x", 1), encode(message), cluster.now))
    assert core.incarnation == 3  # an alive above ours is refuted at once
    cluster.run(40.0)
    assert cluster.converged()
    assert all(cluster.member(o, "node-3").incarnation == 3 for o in cluster.live())  # type: ignore[union-attr]


def test_another_record_at_the_same_incarnation_is_refuted_through_the_digest() -> None:
    """A daemon restarted at its stored incarnation publishes a new record: the digest's
    entry hash shows the peer holds another one, and the member refutes above it (the
    table's REFUTE_IF_CHANGED), whichever side opens the sync."""
    for opener in ("old-view", "restarted"):
        a, b = two_peers_that_agree(5)
        restarted = Membership(TEST_CONFIG, "b", b.address, random.Random(9), 0.0, meta=b"new")
        if opener == "old-view":
            exchange(a, restarted, 1.0)
        else:
            exchange(restarted, a, 1.0)
        assert restarted.incarnation == 1, opener
        exchange(restarted, a, 2.0)
        seen = a.member("b")
        assert seen is not None and seen.incarnation == 1 and seen.meta == b"new", opener


def opening_digest(core: Membership) -> tuple[tuple[str, int, int, int], ...]:
    """The digest `core` opens a sync with (it caches it between changes)."""
    sends = [o for o in core.join([("10.9.9.9", 1)], 5.0) if isinstance(o, Send)]
    message = decode_packet(sends[0].payload)[0]
    assert isinstance(message, Sync) and message.leg == 0
    return message.digest


def test_the_cached_digest_follows_every_change() -> None:
    """The view's digest is cached between syncs: each kind of change must show in the
    next one (a stale digest would hide news from peers), and a sync after no change
    is the same digest."""
    a, _ = two_peers_that_agree(10)
    first = opening_digest(a)
    assert opening_digest(a) == first
    changes = [
        encode(Alive("member-0001", 4, ("10.0.1.1", 7946), b"m")),  # newer record
        encode(Alive("newcomer", 0, ("10.0.3.1", 7946), b"")),  # a new member
        encode(Suspect("member-0002", 3, "b")),  # a state change
    ]
    for packet in changes:
        before = opening_digest(a)
        a.receive(("x", 1), packet, 6.0)
        after = opening_digest(a)
        assert after != before
        held = {m.name: (m.incarnation, int(m.state)) for m in a.members()}
        assert {e[0]: (e[1], e[2]) for e in after} == held
    assert dict((e[0], e[1:3]) for e in opening_digest(a))["member-0002"] == (
        3,
        int(MemberState.SUSPECT),
    )


def test_a_digest_naming_a_member_twice_is_read_last_entry_wins() -> None:
    """A hostile digest may repeat a name; the reply compares against the last entry,
    as a dict of the digest always did (a matching first entry must not hide it)."""
    a, b = two_peers_that_agree(5)
    ours = next(e for e in opening_digest(a) if e[0] == "member-0003")
    digest = (ours, ("member-0003", 2, int(MemberState.ALIVE), 0))
    message = Sync(0, False, "b", b.address, digest, (), (), b"", b"")
    out = a.receive(b.address, encode(message), 7.0)
    reply = decode_packet(next(o for o in out if isinstance(o, Send)).payload)[0]
    assert isinstance(reply, Sync) and reply.leg == 1
    assert "member-0003" in [e[0] for e in reply.members]


def test_the_invariants_catch_a_stale_cached_digest() -> None:
    """A change that skips `Membership._changed` leaves the cached digest stale: the
    invariant check (on in every test and simulation) must say so."""
    a, _ = two_peers_that_agree(3)
    opening_digest(a)
    node = a._members["member-0001"]
    node.incarnation += 1
    node.entry = None  # the record's own cache is dropped, the view's is not
    with pytest.raises(AssertionError, match="cached sync digest"):
        a._check_invariants()


def test_an_unchanged_view_opens_with_the_same_bytes() -> None:
    """The opening packet is built once per view: the same object goes to every peer
    (so receivers' decode cache hashes it once), and a change builds a new one."""
    a, _ = two_peers_that_agree(5)

    def opening() -> bytes:
        sends = [o for o in a.join([("10.9.9.9", 1)], 5.0) if isinstance(o, Send)]
        return sends[0].payload

    first = opening()
    assert opening() is first
    a.receive(("x", 1), encode(Suspect("member-0002", 3, "b")), 6.0)
    changed = opening()
    assert changed != first
    assert [e[2] for e in decode_packet(changed)[0].digest if e[0] == "member-0002"] == [1]  # type: ignore[union-attr]


def test_an_opening_after_a_change_of_one_record_carries_the_new_record() -> None:
    """The view's digest is patched in place where records change (issue 8's speed
    work): each opening must still equal one built from scratch, entry for entry."""
    a, b = two_peers_that_agree(40)
    [before] = [o for o in a.join([b.address], 1.0) if isinstance(o, Send)]
    a.receive(("x", 1), encode(Suspect("member-0007", 3, "b")), 1.0)
    a.receive(("x", 1), encode(Alive("member-0009", 5, ("10.0.1.9", 7946), b"v2")), 1.0)
    second = a.join([b.address], 2.0)
    # A core with the same view, built fresh, opens with the same bytes.
    fresh = Membership(TEST_CONFIG, "a", a.address, random.Random(1), 0.0, meta=META)
    fresh.receive(
        ("x", 1),
        encode(*[Alive(m.name, m.incarnation, m.address, m.meta) for m in a.members()]),
        0.0,
    )
    fresh.receive(("x", 1), encode(Suspect("member-0007", 3, "b")), 1.0)
    [opening] = [o for o in second if isinstance(o, Send)]
    [expected] = [o for o in fresh.join([b.address], 2.0) if isinstance(o, Send)]
    assert opening.payload == expected.payload
    assert opening.payload != before.payload
    sync = decode_packet(opening.payload)[0]
    assert isinstance(sync, Sync)
    entries = {entry[0]: entry for entry in sync.digest}
    assert entries["member-0007"][1:3] == (3, MemberState.SUSPECT)
    assert entries["member-0009"][1] == 5


def _syncs_opened_after_a_join(delay: float) -> list[float]:
    """A joiner answered at t=10 by a seed that holds one other member: the times at
    which it opens a sync of its own (leg 0, not a join) up to t=20."""
    config = attrs.evolve(TEST_CONFIG, push_pull_interval=300.0, join_sync_delay=delay)
    seed = Membership(config, "s", ("10.0.0.1", 1), random.Random(1), 0.0, meta=META)
    seed.receive(("x", 1), encode(Alive("b", 1, ("10.0.0.2", 1), META)), 0.0)
    joiner = Membership(config, "j", ("10.0.0.3", 1), random.Random(5), 0.0, meta=META)
    (opening,) = [o for o in joiner.join([seed.address], 10.0) if isinstance(o, Send)]
    for answer in seed.receive(joiner.address, opening.payload, 10.0, reliable=opening.reliable):
        if isinstance(answer, Send) and answer.destination == joiner.address:
            joiner.receive(seed.address, answer.payload, 10.0, reliable=answer.reliable)
    assert joiner.member("b") is not None  # the join's answer told it of b
    opened = []
    now = 10.0
    while (deadline := joiner.next_deadline()) is not None and deadline <= 20.0:
        now = max(now, deadline)
        for out in joiner.tick(now):
            if isinstance(out, Send):
                message = decode_packet(out.payload)[0]
                if isinstance(message, Sync) and message.leg == 0 and not message.join:
                    opened.append(now)
    return opened


def test_a_joiner_catches_up_with_one_sync_join_sync_delay_after_its_answer() -> None:
    """A join's answer is the seed's view as it stood; a member whose record the seed
    was still pulling reaches the joiner only by gossip from members that may not know
    it yet (start storm stragglers waited for the 30 s push-pull). One exchange with a
    random member `join_sync_delay` later catches up, once; 0 turns it off."""
    assert _syncs_opened_after_a_join(2.0) == [pytest.approx(12.0)]
    assert _syncs_opened_after_a_join(0.0) == []
