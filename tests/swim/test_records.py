"""`swim._records`: the member record's caches, the name list, the view cache, and
`SharedView`, each on its own (the core's use of them is in test_membership.py)."""

from __future__ import annotations

import zlib

from swim import Member, MemberState
from swim._records import SharedView, _Names, _Node, _ViewCache
from swim.wire import encode_digest_entry, encode_member_entry

ALIVE, SUSPECT, DEAD, LEFT = (
    MemberState.ALIVE,
    MemberState.SUSPECT,
    MemberState.DEAD,
    MemberState.LEFT,
)


def node(name: str, state: MemberState = ALIVE, incarnation: int = 0) -> _Node:
    return _Node(name, (f"10.0.0.{len(name)}", 7946), state, incarnation, b"m", 5.0)


def test_entry_and_digest_are_the_encoded_record_and_its_crc() -> None:
    n = node("a", SUSPECT, 3)
    entry = encode_member_entry(("a", n.address, 3, SUSPECT, b"m"))
    assert n.encoded_entry() == entry
    assert n.digest_entry() == ("a", 3, SUSPECT.value, zlib.crc32(entry))
    assert n.entry_hash() == zlib.crc32(entry)
    assert n.encoded_digest() == encode_digest_entry(n.digest_entry())


def test_clearing_the_entry_redoes_the_digest_from_the_new_record() -> None:
    n = node("a")
    before = n.digest_entry()
    n.incarnation = 7
    assert n.digest_entry() == before  # the cache holds while `entry` is the same object
    n.entry = None  # what `_Core._changed` does on every change
    assert n.digest_entry()[1] == 7
    assert n.encoded_digest() == encode_digest_entry(n.digest_entry())


def test_snapshot_carries_the_record_and_the_rtt() -> None:
    n = node("abc", DEAD, 2)
    assert n.snapshot(0.25) == Member("abc", n.address, DEAD, 2, b"m", 5.0, 0.25)


def test_names_index_the_shared_base_then_our_own() -> None:
    base = ["a", "b"]
    names = _Names(base, ["c"])
    names.append("d")
    assert len(names) == 4
    assert [names[i] for i in range(4)] == ["a", "b", "c", "d"] == list(names)
    assert base == ["a", "b"]  # the shared list is never appended to


def members_of(*nodes: _Node) -> dict[str, _Node]:
    return {n.name: n for n in nodes}


def test_view_digest_patches_a_changed_record_in_place() -> None:
    me, a, b = node("me"), node("a"), node("b")
    view = _ViewCache(members_of(me, a, b), me)
    digest = view.digest()
    assert digest == [n.encoded_digest() for n in (me, a, b)]
    a.incarnation, a.state, a.entry = 4, SUSPECT, None
    view.changed(a)
    patched = view.digest()
    assert patched is digest  # patched, not rebuilt
    assert patched[1] == a.encoded_digest()
    assert view.stale_against(_ViewCache(members_of(me, a, b), me)) is None


def test_view_alive_leaves_out_us_and_the_not_alive() -> None:
    me, a, b = node("me"), node("a"), node("b", DEAD)
    view = _ViewCache(members_of(me, a, b), me)
    assert view.alive() == {a.digest_entry()}
    assert view.tuples() == {n.digest_entry() for n in (me, a, b)}
    assert view.position() == {"me": 0, "a": 1, "b": 2}


def test_a_change_drops_the_sets_and_the_openings() -> None:
    me, a = node("me"), node("a")
    view = _ViewCache(members_of(me, a), me)
    view.tuples()
    view.openings[(True, b"")] = b"packet"
    view.digests_merged = 3
    a.state, a.entry = SUSPECT, None
    view.changed(a)
    assert view.openings == {}
    assert view.digests_merged == 0
    assert a.digest_entry() in view.tuples()
    assert view.alive() == set()


def test_many_changes_drop_the_digest_for_a_rebuild() -> None:
    me = node("me")
    others = [node(f"n{i}") for i in range(10)]
    view = _ViewCache(members_of(me, *others), me)
    first = view.digest()
    for _ in range(64 + 11 // 8 + 1):  # over 64 + n/8 dirty records: rebuild
        others[0].entry = None
        view.changed(others[0])
    rebuilt = view.digest()
    assert rebuilt is not first
    assert rebuilt == [n.encoded_digest() for n in (me, *others)]


def test_stale_against_names_the_part_that_differs() -> None:
    me, a = node("me"), node("a")
    view = _ViewCache(members_of(me, a), me)
    view.digest()
    a.incarnation, a.entry = 9, None  # changed behind the cache's back
    assert view.stale_against(_ViewCache(members_of(me, a), me)) == "digest"


def test_shared_view_loads_suspects_as_alive_and_lists_the_gone() -> None:
    members = [
        Member("a", ("h", 1), ALIVE, 1, b"", 0.0),
        Member("b", ("h", 2), SUSPECT, 2, b"", 0.0),
        Member("c", ("h", 3), DEAD, 3, b"", 0.0),
        Member("d", ("h", 4), LEFT, 4, b"", 0.0),
    ]
    view = SharedView(members, 50.0)
    assert view.names == ["a", "b", "c", "d"]
    assert [view.nodes[n].state for n in view.names] == [ALIVE, ALIVE, DEAD, LEFT]
    assert view.counts == [2, 0, 1, 1]
    assert view.gone == ["c", "d"]
    assert all(n.shared and n.state_since == 50.0 for n in view.nodes.values())
