"""The application channel (issue 8): broadcasts after rumors, and a digest-first section.

The lease table gossips its deltas with `broadcast_app` and adds its state to
anti-entropy through an `AppState` delegate, as Serf does with memberlist's delegate.
"""

from __future__ import annotations

import hashlib
import random

import attrs
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swim import AppMessage, Event, Membership, Send
from swim.wire import PACKET_OVERHEAD, Alive, App, decode_packet, encode

from .helpers import TEST_CONFIG, Cluster, Network

APP_CONFIG = attrs.evolve(TEST_CONFIG, app_channel_enabled=True)


class Echo:
    """A test application: dedupe by (key, payload), re-broadcast what is new to it.

    Like the lease table, it also repairs through sync: `state(name)` is that node's
    `AppState`, whose digest is a hash of everything the node has seen.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.seen: dict[str, set[tuple[str, bytes]]] = {name: set() for name in cluster.nodes}
        cluster.on_event = self.on_event

    def state(self, name: str) -> EchoState:
        self.seen.setdefault(name, set())
        return EchoState(self.seen, name)

    def originate(self, name: str, key: str, payload: bytes) -> None:
        self.seen[name].add((key, payload))
        self.cluster.nodes[name].broadcast_app(key, payload, self.cluster.now)

    def on_event(self, name: str, event: Event) -> None:
        if isinstance(event, AppMessage) and (event.key, event.payload) not in self.seen[name]:
            self.seen[name].add((event.key, event.payload))
            self.cluster.nodes[name].broadcast_app(event.key, event.payload, self.cluster.now)


class EchoState:
    """One node's share of `Echo` as an `AppState`: everything it has seen."""

    def __init__(self, seen: dict[str, set[tuple[str, bytes]]], name: str) -> None:
        self.seen = seen
        self.name = name

    def _encode(self) -> bytes:
        return msgpack.packb(sorted(self.seen[self.name]))  # type: ignore[no-any-return]

    def digest(self) -> bytes:
        return hashlib.sha256(self._encode()).digest()[:16]

    def state_for(self, remote_digest: bytes) -> bytes | None:
        return None if remote_digest == self.digest() else self._encode()

    def merge(self, payload: bytes) -> None:
        for key, value in msgpack.unpackb(payload):
            self.seen[self.name].add((key, value))


class Table:
    """A toy `AppState`: a grow-only dict, digest = hash of its sorted items."""

    def __init__(self, items: dict[bytes, bytes] | None = None) -> None:
        self.items = dict(items or {})
        self.asked: list[bytes] = []

    def _encode(self) -> bytes:
        return b"\n".join(k + b"=" + v for k, v in sorted(self.items.items()))

    def digest(self) -> bytes:
        return hashlib.sha256(self._encode()).digest()[:16]

    def state_for(self, remote_digest: bytes) -> bytes | None:
        self.asked.append(remote_digest)
        return None if remote_digest == self.digest() else self._encode()

    def merge(self, payload: bytes) -> None:
        for line in payload.split(b"\n"):
            key, sep, value = line.partition(b"=")
            if sep:
                self.items.setdefault(key, value)


def joined(n: int, seed: int = 0) -> Cluster:
    """A converged cluster (a simultaneous join of 12 can take ~16 s of gossip)."""
    cluster = Cluster(n, config=APP_CONFIG, seed=seed, network=Network())
    cluster.join_all()
    for _ in range(60):
        cluster.run(1.0)
        if cluster.converged():
            return cluster
    raise AssertionError(f"{n} members did not converge in 60 s")


def app_events(cluster: Cluster) -> list[tuple[str, AppMessage]]:
    return [(name, e) for _, name, e in cluster.events if isinstance(e, AppMessage)]


def test_a_broadcast_is_delivered_as_an_event_to_the_members_it_reaches() -> None:
    cluster = joined(4)
    cluster.nodes["node-1"].broadcast_app("lease/7", b"epoch=3", cluster.now)
    cluster.run(2.0)
    received = app_events(cluster)
    assert received, "nobody got the broadcast"
    assert {e for _, e in received} == {AppMessage("node-1", "lease/7", b"epoch=3")}
    assert "node-1" not in {name for name, _ in received}
    stats = cluster.nodes["node-1"].statistics()
    assert stats.app_messages_queued == 1
    assert sum(cluster.nodes[n].statistics().app_messages_received for n in cluster.nodes) == len(
        received
    )


def test_app_broadcasts_ride_after_membership_rumors_within_the_budget() -> None:
    config = attrs.evolve(APP_CONFIG, packet_budget=200)
    core = Membership(config, "me", ("10.0.0.1", 1), random.Random(1), 0.0)
    core.receive(("x", 1), encode(Alive("peer", 0, ("10.0.0.2", 1), b"")), 0.0)
    core.broadcast_app("k", b"x" * 100, 0.0)
    sends: list[Send] = []
    while not sends:
        deadline = core.next_deadline()
        assert deadline is not None
        sends = [o for o in core.tick(deadline) if isinstance(o, Send) and not o.reliable]
    messages = decode_packet(sends[0].payload)
    kinds = [type(m).__name__ for m in messages]
    assert "App" in kinds
    assert kinds.index("App") > max(i for i, k in enumerate(kinds) if k == "Alive")
    assert all(len(s.payload) <= 200 for s in sends)


def test_a_newer_broadcast_under_the_same_key_replaces_the_queued_one() -> None:
    cluster = joined(3)
    core = cluster.nodes["node-1"]
    core.broadcast_app("lease/1", b"old", cluster.now)
    core.broadcast_app("lease/1", b"new", cluster.now)
    cluster.run(3.0)
    payloads = {e.payload for _, e in app_events(cluster)}
    assert payloads == {b"new"}


def test_limits_are_enforced_on_both_ends() -> None:
    core = Membership(APP_CONFIG, "me", ("10.0.0.1", 1), random.Random(1), 0.0)
    with pytest.raises(ValueError, match="app_payload_size_max"):
        core.broadcast_app("k", b"x" * (APP_CONFIG.app_payload_size_max + 1), 0.0)
    small = attrs.evolve(APP_CONFIG, packet_budget=128)
    with pytest.raises(ValueError, match="packet budget"):
        Membership(small, "me", ("h", 1), random.Random(1), 0.0).broadcast_app("k", b"x" * 200, 0)
    off = Membership(TEST_CONFIG, "me", ("10.0.0.1", 1), random.Random(1), 0.0)
    with pytest.raises(ValueError, match="app_channel_enabled"):
        off.broadcast_app("k", b"", 0.0)
    # Received while the channel is off, or oversized: dropped and counted, no event.
    assert off.receive(("x", 1), encode(App("evil", "k", b"p")), 0.0) == []
    bound = max(APP_CONFIG.app_payload_size_max, APP_CONFIG.app_direct_size_max)
    big = App("evil", "k", b"x" * (bound + 1))
    assert core.receive(("x", 1), encode(big), 0.0) == []
    assert off.statistics().app_dropped == 1
    assert core.statistics().app_dropped == 1
    assert PACKET_OVERHEAD < 128


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=12),
    seed=st.integers(min_value=0, max_value=2**32),
    broadcasts=st.lists(
        st.tuples(st.integers(min_value=0, max_value=11), st.binary(max_size=64)),
        min_size=1,
        max_size=6,
    ),
)
def test_every_app_broadcast_reaches_every_member_in_a_lossless_cluster(
    n: int, seed: int, broadcasts: list[tuple[int, bytes]]
) -> None:
    """Broadcasts spread epidemically (best effort, as memberlist's), and sync repairs
    the rare member every copy missed (about 1 in 100 runs at n = 9 before repair)."""
    cluster = Cluster(0, config=APP_CONFIG, seed=seed, network=Network())
    echo = Echo(cluster)
    for _ in range(n):
        name = f"node-{len(cluster.nodes) + 1}"
        cluster.add(name, app_state=echo.state(name))
    cluster.join_all()
    for _ in range(60):
        cluster.run(1.0)
        if cluster.converged():
            break
    assert cluster.converged()
    names = list(cluster.nodes)
    sent = set()
    for i, (origin, payload) in enumerate(broadcasts):
        key = f"k{i}"
        echo.originate(names[origin % n], key, payload)
        sent.add((key, payload))
    cluster.run(2 * APP_CONFIG.push_pull_interval + 10.0)
    for name in names:
        assert echo.seen[name] == sent, f"{name} missed {sent - echo.seen[name]}"


def test_push_pull_app_section_is_digest_first() -> None:
    config = attrs.evolve(APP_CONFIG, push_pull_interval=5.0)
    cluster = Cluster(config=config, network=Network())
    tables = [Table({b"a": b"1"}), Table({b"b": b"2"}), Table({b"c": b"3"})]
    for table in tables:
        cluster.add(app_state=table)
    cluster.join_all()
    cluster.run(30.0)
    assert cluster.converged()
    everything = {b"a": b"1", b"b": b"2", b"c": b"3"}
    assert all(t.items == everything for t in tables)
    # Once everyone agrees, syncs carry digests and no state at all.
    before = [cluster.nodes[n].statistics().app_states_sent for n in cluster.nodes]
    syncs_before = sum(cluster.nodes[n].statistics().push_pulls_sent for n in cluster.nodes)
    cluster.run(30.0)
    after = [cluster.nodes[n].statistics().app_states_sent for n in cluster.nodes]
    syncs_after = sum(cluster.nodes[n].statistics().push_pulls_sent for n in cluster.nodes)
    assert syncs_after > syncs_before
    assert after == before


def test_without_a_delegate_a_sync_has_no_app_section() -> None:
    cluster = joined(2)
    for _, _, send in cluster.sent:
        for message in decode_packet(send.payload):
            if type(message).__name__ == "Sync":
                assert message.app_digest == b"" and message.app_state == b""  # type: ignore[union-attr]


def test_send_app_reaches_one_member_by_datagram_or_stream() -> None:
    """A direct message to one member: a datagram when it fits, else a stream; the
    receiver gets an `AppMessage` either way, and the bounds hold on both ends."""
    a = Membership(APP_CONFIG, "a", ("10.0.0.1", 1), random.Random(1), 0.0)
    b = Membership(APP_CONFIG, "b", ("10.0.0.2", 1), random.Random(2), 0.0)
    with pytest.raises(ValueError, match="no member"):
        a.send_app("b", "k", b"x", 0.0)
    a.receive(("10.0.0.2", 1), encode(Alive("b", 1, ("10.0.0.2", 1), b"")), 0.0)
    small, = (o for o in a.send_app("b", "k", b"hello", 0.0) if isinstance(o, Send))
    assert not small.reliable
    large, = (o for o in a.send_app("b", "k", b"y" * 5000, 0.0) if isinstance(o, Send))
    assert large.reliable
    got = [e for e in b.receive(("10.0.0.1", 1), small.payload, 0.0) if isinstance(e, AppMessage)]
    assert [(e.source, e.payload) for e in got] == [("a", b"hello")]
    got = b.receive(("10.0.0.1", 1), large.payload, 0.0, reliable=True)
    assert [e.payload for e in got if isinstance(e, AppMessage)] == [b"y" * 5000]
    with pytest.raises(ValueError, match="app_direct_size_max"):
        a.send_app("b", "k", b"z" * (APP_CONFIG.app_direct_size_max + 1), 0.0)


def test_an_app_message_in_another_members_name_is_dropped_and_counted() -> None:
    """With the packet's authenticated sender (the daemon's envelope), an `App` whose
    source is someone else is refused (`app_refused_sender`): an `AppMessage`'s source
    is who sent the packet, which the lease agents rely on (their messages carry no
    signature of their own). Without one (the simulator), the source is taken as sent."""
    core = Membership(APP_CONFIG, "me", ("10.0.0.1", 1), random.Random(1), 0.0)
    packet = encode(App("victim", "k", b"p"))
    assert core.receive(("10.0.0.9", 1), packet, 0.0, sender="insider") == []
    assert core.statistics().app_refused_sender == 1
    assert core.statistics().app_messages_received == 0
    for sender in ("victim", None):
        got = core.receive(("10.0.0.9", 1), packet, 0.0, sender=sender)
        assert [(e.source, e.payload) for e in got if isinstance(e, AppMessage)] == [
            ("victim", b"p")
        ]
    assert core.statistics().app_refused_sender == 1
