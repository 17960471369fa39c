"""The roster alone: records verified or not, names, clashes and the member rows.

A real `RecordBook` (pure: signatures and certificates, no I/O) under a fake membership
service that answers `member` and `members` from a dict, a fixed realtime clock, and
Trio's mock clock where a row needs `trio.current_time`. No sockets, no daemon.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing

from populi_p2p._log import _FIELDS_ATTR
from populi_p2p.gpu import build_report
from populi_p2p.gpu._facts import GpuDevice, HardwareFacts, Source, Vendor
from populi_p2p.services.publisher import OwnRecord
from populi_p2p.services.roster import REVALIDATE_INTERVAL, Roster
from populi_p2p.store import KnownMember
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.record import Capabilities, NodeRecord, NodeStatus
from populi_p2p.trust.record_book import RecordBook
from populi_p2p.trust.revocation import RevocationList
from swim import (
    AppMessage,
    Event,
    Member,
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberRecovered,
    MemberState,
    MemberSuspected,
    MemberUpdated,
    SelfRefuted,
)

#: Realtime of the fake clock (Unix seconds).
NOW = 1_700_000_000.0
AUTHORITY = ClusterAuthority.from_seed(b"A" * 32)
STRANGER = ClusterAuthority.from_seed(b"B" * 32)  # another cluster's authority
ME = NodeIdentity.from_seed(b"0" * 32)
A = NodeIdentity.from_seed(b"a" * 32)
B = NodeIdentity.from_seed(b"b" * 32)
C = NodeIdentity.from_seed(b"c" * 32)


@functools.cache
def cert(
    node: NodeIdentity, *, authority: ClusterAuthority = AUTHORITY, days: float = 365
) -> bytes:
    """`node`'s certificate (one per arguments: a serial is random, so it is made once)."""
    return authority.enroll(node.public_key, now=NOW, expires_in=days * 86400).raw


def signed_record(
    node: NodeIdentity,
    name: str,
    *,
    sequence: int = 1,
    certificate: bytes | None = None,
    gpu: dict[str, Any] | None = None,
) -> bytes:
    """`node`'s record, signed by `node`, with a certificate of this cluster by default."""
    record = NodeRecord(
        node_id=node.node_id,
        public_key=node.public_key,
        name=name,
        address="10.0.0.5",
        port=7946,
        software_version="0.1.0",
        protocol_version=1,
        started_at=NOW,
        sequence=sequence,
        status=NodeStatus.AVAILABLE,
        capabilities=Capabilities(cpu_cores=8, ram_bytes=32 << 30, gpu=gpu),
        labels={"rack": "b2"},
        certificate=cert(node) if certificate is None else certificate,
    )
    return record.sign(node).raw


def member(
    node: NodeIdentity,
    meta: bytes = b"",
    *,
    state: MemberState = MemberState.ALIVE,
    address: tuple[str, int] = ("10.0.0.5", 7946),
    incarnation: int = 1,
    rtt: float | None = None,
    state_since: float = 0.0,
) -> Member:
    return Member(node.node_id, address, state, incarnation, meta, state_since, rtt)


class FakeMembership:
    """The two queries the roster asks of the membership service, from a dict."""

    def __init__(self) -> None:
        self.held: dict[str, Member] = {}

    def put(self, *members: Member) -> None:
        for m in members:
            self.held[m.name] = m

    def member(self, name: str) -> Member | None:
        return self.held.get(name)

    def members(self) -> list[Member]:
        return list(self.held.values())


class Harness:
    """A roster for node ME, and what it sent to its collaborators."""

    def __init__(self) -> None:
        self.now = NOW
        self.membership = FakeMembership()
        self.book = RecordBook(AUTHORITY.public_key)
        self.known: list[KnownMember] = []
        self.gone: list[str] = []
        self.certificates: list[tuple[bytes, bytes]] = []
        self.roster = Roster(
            ME.node_id,
            self.book,
            self.membership,
            own_record=None,
            on_known=self.known.append,
            on_gone=self.gone.append,
            on_certificate=lambda key, c: self.certificates.append((key, c)),
            clock=lambda: self.now,
        )

    def see(self, ev: Event) -> None:
        """The membership service holds the event's member, then the roster hears it."""
        if not isinstance(ev, SelfRefuted | AppMessage):
            self.membership.put(ev.member)
        self.roster.on_event(ev)


@pytest.fixture
def h() -> Harness:
    return Harness()


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[list[tuple[str, dict[str, object]]]]:
    """The roster's structured log events, as (what, fields), in order."""
    caplog.set_level(logging.DEBUG, logger="populi")
    out: list[tuple[str, dict[str, object]]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            out.append((record.getMessage(), dict(getattr(record, _FIELDS_ATTR, {}))))

    handler = Collect()
    logger = logging.getLogger("populi")
    logger.addHandler(handler)
    yield out
    logger.removeHandler(handler)


def events_named(logged: list[tuple[str, dict[str, object]]], what: str) -> list[dict[str, object]]:
    return [fields for name, fields in logged if name == what]


####################################################################################
# Verified members


def test_a_verified_member_is_remembered_named_and_its_certificate_learned(
    h: Harness, logged: list[tuple[str, dict[str, object]]]
) -> None:
    meta = signed_record(A, "box-a")
    h.see(MemberJoined(member(A, meta, address=("fd00::1", 7000), incarnation=4)))
    assert h.roster.name_of(A.node_id) == "box-a"
    assert h.roster.unverified_reason(A.node_id) is None
    assert h.known == [KnownMember(A.node_id, "box-a", "fd00::1", 7000, NOW)]
    assert h.certificates == [(A.public_key, cert(A))]
    assert events_named(logged, "member.joined") == [
        {"name": "box-a", "id": A.node_id, "addr": "[fd00::1]:7000", "inc": 4,
         "unverified": None}
    ]  # fmt: skip
    assert events_named(logged, "record.refused") == []
    assert h.roster.unverified_members() == []


def test_each_event_kind_logs_and_commands_the_store_as_it_should(
    h: Harness, logged: list[tuple[str, dict[str, object]]]
) -> None:
    """Joined, recovered and updated members are remembered; suspected and failed ones
    are not; a member that left is forgotten by the store."""
    m = member(A, signed_record(A, "box-a"))
    kinds: list[tuple[Event, str, int]] = [
        (MemberJoined(m), "member.joined", 20),
        (MemberSuspected(m), "member.suspect", 20),
        (MemberFailed(m), "member.dead", 30),
        (MemberRecovered(m), "member.recovered", 20),
        (MemberUpdated(m), "member.updated", 20),
        (MemberLeft(m), "member.left", 20),
    ]
    for ev, _what, _level in kinds:
        h.see(ev)
    assert [what for what, _fields in logged] == [what for _ev, what, _level in kinds]
    assert len(h.known) == 3  # joined, recovered, updated
    assert all(k.node_id == A.node_id and k.name == "box-a" for k in h.known)
    assert h.gone == [A.node_id]


def test_events_about_ourselves_and_app_messages_are_ignored(
    h: Harness, logged: list[tuple[str, dict[str, object]]]
) -> None:
    own = member(ME, signed_record(ME, "me"))
    h.see(MemberJoined(own))
    h.see(MemberLeft(own))
    h.see(SelfRefuted(3))
    h.see(AppMessage(A.node_id, "k", b"payload"))
    assert (h.known, h.gone, h.certificates, logged) == ([], [], [], [])
    assert h.roster.name_of(ME.node_id) == "?"  # not offered to the book by an event


####################################################################################
# Unverified members


@pytest.mark.parametrize(
    ("meta", "reason"),
    [
        (b"", "no_record"),
        (b"\x00garbage", "malformed"),
        (signed_record(A, "box-a", certificate=cert(A, authority=STRANGER)), "wrong_authority"),
        (signed_record(B, "box-b"), "key_mismatch"),  # B's record carried by member A
    ],
    ids=["no_record", "malformed", "wrong_authority", "key_mismatch"],
)
def test_an_unverified_member_says_why_and_is_logged_once_per_reason(
    h: Harness, logged: list[tuple[str, dict[str, object]]], meta: bytes, reason: str
) -> None:
    m = member(A, meta)
    h.see(MemberJoined(m))
    h.see(MemberUpdated(m))  # the same reason again: not logged again
    assert h.roster.unverified_reason(A.node_id) == reason
    assert events_named(logged, "record.refused") == [
        {"id": A.node_id, "reason": reason, "effect": "shown as unverified"}
    ]
    joined = events_named(logged, "member.joined")
    assert joined[0]["name"] == "?" and joined[0]["unverified"] == reason
    assert h.certificates == []
    assert h.known == [KnownMember(A.node_id, "?", "10.0.0.5", 7946, NOW)] * 2
    assert h.roster.unverified_members() == [
        {"node_id": A.node_id, "name": "?", "state": "alive", "reason": reason}
    ]


async def test_a_member_whose_new_record_is_refused_keeps_the_name_it_had(
    autojump_clock: trio.testing.MockClock, h: Harness, logged: list[tuple[str, dict[str, object]]]
) -> None:
    """What a refused record claims is never shown: the member keeps the name its last
    good record gave it, and is verified again once a good record arrives."""
    h.see(MemberJoined(member(A, signed_record(A, "box-a"))))
    forged = signed_record(A, "forged-name", sequence=2, certificate=cert(A, authority=STRANGER))
    h.see(MemberUpdated(member(A, forged, incarnation=2)))
    assert h.roster.unverified_reason(A.node_id) == "wrong_authority"
    assert h.roster.name_of(A.node_id) == "box-a"
    assert events_named(logged, "member.updated")[-1]["name"] == "box-a"
    assert h.known[-1].name == "box-a"
    # The book still holds the good record, but the row shows none of it but the name.
    (row,) = h.roster.member_rows()
    assert (row["name"], row["verified"], row["unverified"]) == ("box-a", False, "wrong_authority")
    assert (row["capabilities"], row["labels"], row["status"]) == ("-", {}, None)
    h.see(MemberUpdated(member(A, signed_record(A, "box-a2", sequence=3), incarnation=3)))
    assert h.roster.unverified_reason(A.node_id) is None
    assert h.roster.name_of(A.node_id) == "box-a2"
    assert [f["reason"] for f in events_named(logged, "record.refused")] == ["wrong_authority"]
    assert events_named(logged, "member.updated")[-1]["unverified"] is None


def test_revocation_makes_a_member_unverified(
    h: Harness, logged: list[tuple[str, dict[str, object]]]
) -> None:
    h.see(MemberJoined(member(A, signed_record(A, "box-a"))))
    h.see(MemberJoined(member(B, signed_record(B, "box-b"))))
    revocation = AUTHORITY.revoke(now=NOW, node_public_key=A.public_key)
    h.roster.update_revocations(RevocationList.of([revocation]))
    assert events_named(logged, "record.revoked") == [{"id": A.node_id}]
    assert h.roster.unverified_reason(A.node_id) == "revoked"
    assert h.roster.unverified_reason(B.node_id) is None
    assert h.roster.unverified_members() == [
        {"node_id": A.node_id, "name": "box-a", "state": "alive", "reason": "revoked"}
    ]


async def test_run_revalidates_and_drops_expired_records(
    autojump_clock: trio.testing.MockClock, h: Harness, logged: list[tuple[str, dict[str, object]]]
) -> None:
    """`run` hands events over in order and re-checks records every REVALIDATE_INTERVAL:
    a certificate that expires makes its member unverified."""
    short = signed_record(A, "box-a", certificate=cert(A, days=1))
    send, receive = trio.open_memory_channel[Event](10)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.roster.run, receive)
        h.membership.put(member(A, short))
        await send.send(MemberJoined(member(A, short)))
        await trio.sleep(REVALIDATE_INTERVAL * 1.5)
        assert h.roster.unverified_reason(A.node_id) is None
        h.now = NOW + 2 * 86400
        await trio.sleep(REVALIDATE_INTERVAL)
        nursery.cancel_scope.cancel()
    assert events_named(logged, "record.expired") == [{"id": A.node_id}]
    assert h.roster.unverified_reason(A.node_id) == "expired"
    assert h.known == [KnownMember(A.node_id, "box-a", "10.0.0.5", 7946, NOW)]


####################################################################################
# Name clashes


def test_two_live_members_with_one_name_clash_once(
    h: Harness, logged: list[tuple[str, dict[str, object]]]
) -> None:
    a, b = member(A, signed_record(A, "box")), member(B, signed_record(B, "box"))
    h.see(MemberJoined(a))
    assert events_named(logged, "name.clash") == []
    h.see(MemberJoined(b))
    h.see(MemberUpdated(b))  # the same clash: logged once
    ids = sorted([A.node_id, B.node_id])
    assert events_named(logged, "name.clash") == [
        {"name": "box", "me": ME.node_id, "ids": ",".join(ids), "others": ",".join(ids),
         "fix": "give each node its own --name"}
    ]  # fmt: skip
    assert h.roster.name_clashes() == [{"name": "box", "node_ids": ids}]


def test_a_gone_member_does_not_clash(
    h: Harness, logged: list[tuple[str, dict[str, object]]]
) -> None:
    h.see(MemberJoined(member(A, signed_record(A, "box"), state=MemberState.DEAD)))
    h.see(MemberJoined(member(B, signed_record(B, "box"))))
    assert events_named(logged, "name.clash") == []
    assert h.roster.name_clashes() == []
    h.membership.put(member(A, signed_record(A, "box"), state=MemberState.SUSPECT))
    assert h.roster.name_clashes() == [{"name": "box", "node_ids": sorted([A.node_id, B.node_id])}]


def test_a_member_that_renames_no_longer_holds_its_old_name(
    h: Harness, logged: list[tuple[str, dict[str, object]]]
) -> None:
    h.see(MemberJoined(member(B, signed_record(B, "box"))))
    h.see(MemberUpdated(member(B, signed_record(B, "box-b", sequence=2), incarnation=2)))
    h.see(MemberJoined(member(A, signed_record(A, "box"))))
    assert events_named(logged, "name.clash") == []
    assert h.roster.name_clashes() == []
    h.see(MemberJoined(member(C, signed_record(C, "box-b"))))
    assert [f["name"] for f in events_named(logged, "name.clash")] == ["box-b"]


def test_our_own_name_counts_for_clashes(
    h: Harness, logged: list[tuple[str, dict[str, object]]]
) -> None:
    """Another node called like us is a clash this node reports, naming the other."""
    h.roster.accept_own(signed_record(ME, "box"), NOW)
    h.membership.put(member(ME, signed_record(ME, "box")))  # the core holds itself
    assert h.roster.name_of(ME.node_id) == "box"
    h.see(MemberJoined(member(A, signed_record(A, "box"))))
    (clash,) = events_named(logged, "name.clash")
    assert clash["me"] == ME.node_id and clash["others"] == A.node_id
    assert clash["ids"] == ",".join(sorted([ME.node_id, A.node_id]))


def test_our_first_record_handed_at_construction_is_known(h: Harness) -> None:
    """The first record (the membership's metadata, signed before the roster exists) is
    handed to the roster when it is built: our name is indexed and our record held."""
    first = OwnRecord(signed_record(ME, "box"), NOW)
    roster = Roster(
        ME.node_id, h.book, h.membership, own_record=first, on_known=h.known.append,
        on_gone=h.gone.append, on_certificate=lambda _k, _c: None, clock=lambda: h.now,
    )  # fmt: skip
    assert roster.name_of(ME.node_id) == "box"
    record = h.book.get(ME.node_id)
    assert record is not None and record.name == "box"


def test_an_unverified_member_never_clashes(
    h: Harness, logged: list[tuple[str, dict[str, object]]]
) -> None:
    h.see(MemberJoined(member(A, signed_record(A, "box"))))
    stranger = signed_record(B, "box", certificate=cert(B, authority=STRANGER))
    h.see(MemberJoined(member(B, stranger)))
    assert events_named(logged, "name.clash") == []
    assert h.roster.name_clashes() == []


####################################################################################
# Member rows (GET /v1/members)


def gpu_record() -> dict[str, Any]:
    """A one-H100 GPU report in its record form, as the GPU module builds it."""
    device = GpuDevice(
        index=0, uuid="GPU-aaaa", name="H100", vendor=Vendor.NVIDIA, source=Source.NVML,
        compute_capability=(9, 0), memory_total=80 << 30, memory_used=0, memory_free=80 << 30,
    )  # fmt: skip
    return build_report(HardwareFacts(devices=(device,))).to_record()


async def test_member_rows_show_verified_records_and_only_the_core_for_others(
    autojump_clock: trio.testing.MockClock, h: Harness
) -> None:
    await trio.sleep(100)
    h.roster.accept_own(signed_record(ME, "me"), NOW)
    h.membership.put(member(ME, signed_record(ME, "me"), state_since=40.0))
    h.see(MemberJoined(member(
        A, signed_record(A, "box-a", gpu=gpu_record()), address=("fd00::1", 7000),
        incarnation=7, rtt=0.0123456, state_since=90.5,
    )))  # fmt: skip
    hostile = b"\x1b[31m" + signed_record(B, "box-b")  # garbled: shown as unverified
    h.see(MemberSuspected(member(B, hostile, state=MemberState.SUSPECT)))
    rows = {row["node_id"]: row for row in h.roster.member_rows()}
    assert set(rows) == {ME.node_id, A.node_id, B.node_id}

    mine = rows[ME.node_id]
    assert mine["self"] is True and mine["name"] == "me" and mine["state_since"] == 60.0
    assert mine["capabilities"] == "8 cpu, 32 GiB, no GPU" and mine["gpu"] is None

    a = rows[A.node_id]
    assert {k: a[k] for k in a if k not in ("capabilities", "gpu")} == {
        "name": "box-a", "node_id": A.node_id, "address": "[fd00::1]:7000",
        "state": "alive", "incarnation": 7, "rtt_ms": 12.346, "labels": {"rack": "b2"},
        "status": "available", "verified": True, "unverified": None, "self": False,
        "state_since": 9.5, "version": "0.1.0", "last_seen": None,
    }  # fmt: skip
    assert a["capabilities"] == "8 cpu, 32 GiB, 1\u00d7H100 80GiB (verified)"
    (gpu,) = a["gpu"]["gpus"]  # the `gpus --json` form, with each layer's provenance
    assert (gpu["name"], gpu["memory_total"]) == ("H100", 80 << 30)
    assert gpu["provenance"] == {"layer": "A", "source": "nvml"}

    b = rows[B.node_id]
    assert b == {
        "name": "?", "node_id": B.node_id, "address": "10.0.0.5:7946", "state": "suspect",
        "incarnation": 1, "rtt_ms": None, "capabilities": "-", "gpu": None, "labels": {},
        "status": None, "verified": False, "unverified": "malformed", "self": False,
        "state_since": 100.0, "version": None, "last_seen": None,
    }  # fmt: skip


async def test_an_unreadable_gpu_record_is_summarised_not_raised(
    autojump_clock: trio.testing.MockClock, h: Harness
) -> None:
    h.see(MemberJoined(member(A, signed_record(A, "box-a", gpu={"v": 99, "junk": [1]}))))
    (row,) = h.roster.member_rows()
    assert row["verified"] is True
    assert row["capabilities"] == "8 cpu, 32 GiB, GPU record unreadable"
    assert row["gpu"] is None


def test_no_members_held_means_no_rows() -> None:
    roster = Roster(
        ME.node_id, RecordBook(AUTHORITY.public_key), FakeMembership(), own_record=None,
        on_known=lambda _m: None, on_gone=lambda _n: None, on_certificate=lambda _k, _c: None,
    )  # fmt: skip
    assert roster.member_rows() == []
    assert roster.unverified_members() == []
    assert roster.name_clashes() == []


####################################################################################
# Departed members (issue 20, item 4): listed with "last seen" after the core forgot them


async def test_dead_and_left_members_stay_listed_with_last_seen_until_the_retention(
    autojump_clock: trio.testing.MockClock, h: Harness
) -> None:
    """The core forgets a dead member after its `dead_retention` (30 s at `lan`); the
    roster keeps its row, with when it was last seen (first suspected), for a day."""
    a, b = signed_record(A, "box-a"), signed_record(B, "box-b")
    h.see(MemberJoined(member(A, a, rtt=0.004)))
    h.see(MemberJoined(member(B, b)))
    h.see(MemberSuspected(member(A, a, state=MemberState.SUSPECT, rtt=0.004)))
    h.now += 5
    h.see(MemberFailed(member(A, a, state=MemberState.DEAD, rtt=0.004)))
    h.see(MemberLeft(member(B, b, state=MemberState.LEFT)))
    rows = {row["node_id"]: row for row in h.roster.member_rows()}
    # Held by the core still: the core's row, with no stale RTT, and "last seen".
    assert rows[A.node_id]["state"] == "dead" and rows[A.node_id]["rtt_ms"] is None
    assert rows[A.node_id]["last_seen"] == NOW  # first suspected, not declared dead
    assert rows[B.node_id]["last_seen"] == NOW + 5  # its goodbye

    del h.membership.held[A.node_id], h.membership.held[B.node_id]  # dead_retention ran out
    h.now += 3600
    rows = {row["node_id"]: row for row in h.roster.member_rows()}
    assert rows[A.node_id]["name"] == "box-a" and rows[A.node_id]["state"] == "dead"
    assert rows[A.node_id]["labels"] == {"rack": "b2"} and rows[A.node_id]["version"] == "0.1.0"
    assert rows[A.node_id]["state_since"] == 3600.0
    assert rows[B.node_id]["state"] == "left"
    assert h.roster.state_counts() == {"alive": 0, "suspect": 0, "dead": 1, "left": 1}

    h.now += 24 * 3600 - 3600 + 1  # a day after they went
    assert h.roster.member_rows() == []


def test_a_member_that_comes_back_is_listed_once_as_alive(h: Harness) -> None:
    a = signed_record(A, "box-a")
    h.see(MemberJoined(member(A, a)))
    h.see(MemberFailed(member(A, a, state=MemberState.DEAD)))
    del h.membership.held[A.node_id]
    h.see(MemberJoined(member(A, a, incarnation=2)))
    assert len(h.roster.departed) == 0


def test_departed_rows_follow_the_retention_setting(h: Harness) -> None:
    roster = Roster(
        ME.node_id, h.book, h.membership, own_record=None, on_known=h.known.append,
        on_gone=h.gone.append, on_certificate=lambda _k, _c: None, clock=lambda: h.now,
        departed_retention=60.0,
    )  # fmt: skip
    a = signed_record(A, "box-a")
    roster.on_event(MemberLeft(member(A, a, state=MemberState.LEFT)))
    h.now += 60
    assert [r["state"] for r in roster.member_rows()] == ["left"]
    h.now += 1
    assert roster.member_rows() == []


def test_the_feed_names_a_member_the_roster_has_not_heard_of_yet(h: Harness) -> None:
    """Issue 20, item 9: the event feed may read a join before the roster does; it then
    showed the id ("74ahn6lenbnt joined"). `display_name` reads the record it carries."""
    joined = member(A, signed_record(A, "box-a"))
    assert h.roster.display_name(joined) == "box-a"
    assert h.roster.display_name(member(C)) == C.node_id[:12]  # no record: the short id
