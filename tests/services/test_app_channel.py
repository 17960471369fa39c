"""The swim application channel: one byte of kind before every payload, one push-pull
section multiplexing every kind's, and everything received hostile (junk is counted,
never raised)."""

from __future__ import annotations

import msgpack
import pytest
import trio

from populi_p2p.leases import LeaseConfig, LeaseTable, Requirements, TaskKind, TaskSpec
from populi_p2p.leases.driver.view import LeaseSection
from populi_p2p.services.app_channel import (
    SECTIONS_MAX,
    AppChannel,
    AppKind,
    AppSections,
    _decode_sections,
)
from swim import AppMessage, MemberJoined


def _table(me: str) -> LeaseTable:
    return LeaseTable(LeaseConfig.local(), me, lambda d: b"s" * 64, lambda n, d, s: True)


def _spec(me: str, n: int) -> TaskSpec:
    return TaskSpec(TaskKind.BATCH, Requirements(), ("echo", str(n)), submitted_by=me)


def _channel(table: LeaseTable) -> AppSections:
    sections = AppSections()

    async def ignore(message: AppMessage, body: bytes) -> None:
        pass

    async def refuse(key: str, payload: bytes) -> None:
        raise ValueError("not sent in this test")

    channel = AppChannel(sections, refuse)
    channel.register(AppKind.LEASES, ignore, LeaseSection(table, lambda _e: None, lambda: 0.0))
    return sections


def test_sync_section_converges_two_tables_digest_first() -> None:
    a, b = _table("a"), _table("b")
    for n in range(40):
        a.submit(_spec("a", n), 0.0)
    for n in range(40, 45):
        b.submit(_spec("b", n), 0.0)
    ca, cb = _channel(a), _channel(b)
    assert len(ca.digest()) <= 256, "must fit SwimConfig.app_digest_size_max"
    # The swim sync: leg 0 A's digest; leg 1 B answers with what A lacks; leg 2 back.
    to_a = cb.state_for(ca.digest())
    to_b = ca.state_for(cb.digest())
    assert to_a is not None and to_b is not None
    ca.merge(to_a)
    cb.merge(to_b)
    assert {e.task_id for e in a} == {e.task_id for e in b}
    assert len(a) == 45
    # In agreement: two digests, no state.
    assert ca.state_for(cb.digest()) is None and cb.state_for(ca.digest()) is None


async def test_channel_routes_by_kind_and_counts_junk() -> None:
    sent: list[tuple[str, bytes]] = []

    async def broadcast(key: str, payload: bytes) -> None:
        sent.append((key, payload))

    channel = AppChannel(AppSections(), broadcast)
    got: list[bytes] = []

    async def on_ack(message: AppMessage, body: bytes) -> None:
        got.append(body)

    channel.register(AppKind.LEASE_AGENT, on_ack)
    await channel.deliver(AppMessage("x", "k", bytes([AppKind.LEASE_AGENT]) + b"hello"))
    await channel.deliver(AppMessage("x", "k", bytes([AppKind.LEASES]) + b"nobody"))
    await channel.deliver(AppMessage("x", "k", b""))
    assert got == [b"hello"]
    assert channel.dropped == 2
    sections = channel.sections
    sections.merge(b"\xc1junk")  # never raises
    sections.merge(b"\x81\x07\xc4\x01x")  # {7: b"x"}: an unknown kind
    assert sections.dropped == 2 and channel.dropped == 2
    assert sections.state_for(b"\xff\xff") is None
    # Sent with the kind's byte first, through the membership's broadcast.
    assert await channel.broadcast(AppKind.LEASE_AGENT, "k1", b"hi")
    assert sent == [("k1", bytes([AppKind.LEASE_AGENT]) + b"hi")]


def test_the_kinds_are_the_wire_values() -> None:
    """ONLY APPEND: a peer reads these bytes; a retired kind keeps its number."""
    assert {k.name: k.value for k in AppKind} == {
        "LEASES": 1, "LEASE_ACK": 2, "REVOCATIONS": 3, "LEASE_AGENT": 4,
    }  # fmt: skip


@pytest.mark.parametrize(
    "junk",
    [
        msgpack.packb([1, 2]),
        msgpack.packb({i: b"x" for i in range(SECTIONS_MAX + 1)}),
        b"\x81",  # truncated
        b"\xc1",  # never used in msgpack
    ],
    ids=["not-a-map", "too-many", "truncated", "reserved-byte"],
)
def test_junk_sync_sections_decode_to_nothing(junk: bytes) -> None:
    assert _decode_sections(junk) == {}


def test_only_int_kinds_with_bytes_survive_decoding() -> None:
    raw = msgpack.packb({1: b"a", "2": b"b", 3: "text", 4: b""}, use_bin_type=True)
    assert _decode_sections(raw) == {1: b"a", 4: b""}
    assert _decode_sections(b"\x81\xc3\xc4\x01c") == {}  # {True: b"c"}: a bool is no kind
    assert _decode_sections(b"") == {}


class _Section:
    """An `AppState` that answers with a fixed state and keeps what it is handed."""

    def __init__(self, digest: bytes, state: bytes | None) -> None:
        self._digest, self._state = digest, state
        self.asked: list[bytes] = []
        self.merged: list[bytes] = []

    def digest(self) -> bytes:
        return self._digest

    def state_for(self, remote_digest: bytes) -> bytes | None:
        self.asked.append(remote_digest)
        return self._state

    def merge(self, payload: bytes) -> None:
        self.merged.append(payload)


def test_each_section_sees_its_own_part_of_the_sync() -> None:
    sections = AppSections()
    leases, revocations = _Section(b"L", b"lease-state"), _Section(b"R", None)
    sections.add(AppKind.REVOCATIONS, revocations)
    sections.add(AppKind.LEASES, leases)
    # Sorted by kind, whatever order they registered in: the same bytes on every node.
    assert sections.digest() == msgpack.packb({1: b"L", 3: b"R"}, use_bin_type=True)
    state = sections.state_for(msgpack.packb({1: b"theirs"}, use_bin_type=True))
    assert leases.asked == [b"theirs"] and revocations.asked == [b""]
    assert state == msgpack.packb({1: b"lease-state"}, use_bin_type=True)  # none from R
    sections.merge(msgpack.packb({3: b"rev", 1: b"lease"}, use_bin_type=True))
    assert leases.merged == [b"lease"] and revocations.merged == [b"rev"]
    assert sections.dropped == 0
    sections.merge(b"")  # an empty section is no junk
    assert sections.dropped == 0


async def test_a_refused_broadcast_is_counted_by_kind() -> None:
    async def refuse(key: str, payload: bytes) -> None:
        raise ValueError("too big for one packet")

    channel = AppChannel(AppSections(), refuse)
    assert not await channel.broadcast(AppKind.LEASES, "k", b"x" * 10)
    assert not await channel.broadcast(AppKind.LEASES, "k", b"x")
    assert not await channel.broadcast(AppKind.REVOCATIONS, "k", b"x")
    assert channel.refused == {"LEASES": 2, "REVOCATIONS": 1}


async def test_run_delivers_only_app_messages() -> None:
    got: list[bytes] = []

    async def on_lease(message: AppMessage, body: bytes) -> None:
        got.append(body)

    async def nowhere(key: str, payload: bytes) -> None:
        pass

    channel = AppChannel(AppSections(), nowhere)
    channel.register(AppKind.LEASES, on_lease)
    send, receive = trio.open_memory_channel[object](10)
    async with trio.open_nursery() as nursery:
        await nursery.start(channel.run, receive)
        await send.send(MemberJoined(member=None))  # type: ignore[arg-type]
        await send.send(AppMessage("x", "k", bytes([AppKind.LEASES]) + b"one"))
        await send.aclose()
    assert got == [b"one"] and channel.dropped == 0
