"""Real-socket tests of the UDP/TCP transport on loopback (127.0.0.1 and ::1)."""

from __future__ import annotations

import socket
import struct

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlay.base import DEFAULT_PORT, TransportError, normalize_source
from overlay.inbox import BULK, URGENT
from overlay.netfilter import AcceptPolicy
from overlay.peerpaths import PathHealth
from overlay.tcp import TcpConfig, encode_frame
from overlay.transport import Transport, TransportConfig

from .ovtest_support import LOOPBACK, needs_ipv6

HOSTS = ["127.0.0.1", pytest.param("::1", marks=needs_ipv6)]


def by_first_byte(payload: bytes) -> int:
    """Test classifier: b'U...' is urgent, anything else bulk, empty raises."""
    return URGENT if payload[0:1] == b"U" else BULK if payload else 1 // 0


async def quiesce() -> None:
    """Let the reader tasks drain whatever loopback already delivered."""
    await trio.testing.wait_all_tasks_blocked(cushion=0.01)


################################################################################
# Basics
################################################################################


def test_default_port_is_documented_value() -> None:
    assert DEFAULT_PORT == 7950


@pytest.mark.parametrize("host", HOSTS)
async def test_udp_round_trip(start_transport, host) -> None:
    a = await start_transport(host)
    b = await start_transport(host)
    await a.send_datagram(b.local_address, b"ping")
    got = await b.receive()
    assert got.payload == b"ping"
    assert got.source == a.local_address
    assert got.reliable is False
    await b.send_datagram(got.source, b"ack")
    back = await a.receive()
    assert (back.payload, back.source) == (b"ack", b.local_address)
    assert a.statistics().udp.sent == 1 and b.statistics().udp.queued == 1


@pytest.mark.parametrize("host", HOSTS)
async def test_tcp_round_trip_reuses_one_connection(start_transport, host) -> None:
    a = await start_transport(host)
    b = await start_transport(host)
    assert a.local_address[1] != 0
    payloads = [b"first", b"x" * 100_000, b"third"]
    for p in payloads:
        await a.send_frame(b.local_address, p)
    got = [await b.receive() for _ in payloads]
    assert [g.payload for g in got] == payloads
    assert all(g.reliable for g in got)
    assert got[0].source[0] == host
    sa, sb = a.statistics().tcp, b.statistics().tcp
    assert sa.frames_sent == 3 and sa.pool_connections == 1
    assert sb.inbound_accepted == 1 and sb.frames_queued == 3


async def test_udp_and_tcp_share_one_port(start_transport) -> None:
    t = await start_transport()
    port = t.local_address[1]
    # Both protocols are bound: binding either again on that port fails.
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as s, pytest.raises(OSError):
            s.bind(("127.0.0.1", port))


@needs_ipv6
async def test_dual_stack_accepts_ipv4_and_unmaps_sources(start_transport) -> None:
    server = await start_transport("::", dual_stack=True)
    client = await start_transport("127.0.0.1")
    port = server.local_address[1]
    await client.send_datagram(("127.0.0.1", port), b"v4")
    got = await server.receive()
    assert got.source == client.local_address  # "127.0.0.1", not "::ffff:127.0.0.1"
    # ...and it answers an IPv4 peer from its IPv6 socket.
    await server.send_datagram(got.source, b"reply")
    assert (await client.receive()).payload == b"reply"
    await client.send_frame(("127.0.0.1", port), b"frame")
    frame = await server.receive()
    assert frame.reliable and frame.source[0] == "127.0.0.1"


def test_normalize_source_shapes() -> None:
    assert normalize_source(("::ffff:10.1.2.3", 5, 0, 0)) == ("10.1.2.3", 5)
    assert normalize_source(("fd77::1", 7950, 0, 0)) == ("fd77::1", 7950)
    assert normalize_source(("10.0.0.1", 1)) == ("10.0.0.1", 1)


async def test_ipv6_destination_on_ipv4_socket_is_a_transport_error(start_transport) -> None:
    t = await start_transport()
    with pytest.raises(TransportError, match=r"IPv6 peer \[::1\]:9 from an IPv4 socket"):
        await t.send_datagram(("::1", 9), b"x")
    assert t.statistics().udp.send_errors == 1


async def test_bad_bind_host_and_port_in_use(nursery, start_transport) -> None:
    with pytest.raises(ValueError, match="numeric IPv4 or IPv6"):
        await nursery.start(Transport("localhost", 0, policy=LOOPBACK).run)
    first = await start_transport()
    with pytest.raises(TransportError, match=r"cannot bind udp 127\.0\.0\.1:"):
        await nursery.start(Transport("127.0.0.1", first.local_address[1], policy=LOOPBACK).run)


async def test_cancel_closes_sockets_and_inbox() -> None:
    t = Transport("127.0.0.1", 0, policy=LOOPBACK)
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(t.run)
        nursery.cancel_scope.cancel()
    with pytest.raises(trio.EndOfChannel):
        await t.receive()
    with pytest.raises(RuntimeError, match="not running"):
        await t.send_datagram(("127.0.0.1", 9), b"x")
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):  # the port is free again
        with socket.socket(socket.AF_INET, kind) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))


################################################################################
# Limits, drops and counters
################################################################################


async def test_oversize_datagram_dropped_and_refused_on_send(start_transport) -> None:
    cfg = TransportConfig(max_datagram_size=512)
    b = await start_transport(config=cfg)
    a = await start_transport(config=cfg)
    with pytest.raises(ValueError, match="exceeds max_datagram_size 512"):
        await a.send_datagram(b.local_address, b"x" * 513)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.sendto(b"x" * 513, b.local_address)
        raw.sendto(b"y" * 512, b.local_address)
    got = await b.receive()
    assert got.payload == b"y" * 512
    stats = b.statistics().udp
    assert stats.oversize == 1 and stats.received == 2 and stats.queued == 1


async def test_oversize_frame_closes_connection(start_transport) -> None:
    cfg = TransportConfig(tcp=TcpConfig(max_frame_size=1024))
    b = await start_transport(config=cfg)
    a = await start_transport(config=cfg)
    with pytest.raises(ValueError, match="exceeds max_frame_size 1024"):
        await a.send_frame(b.local_address, b"x" * 1025)
    stream = await trio.open_tcp_stream(*b.local_address)
    await stream.send_all(encode_frame(b"ok") + struct.pack(">I", 1025) + b"x" * 10)
    assert (await b.receive()).payload == b"ok"
    with trio.fail_after(5):  # the server hangs up on us
        while await stream.receive_some(1024):
            pass
    assert b.statistics().tcp.oversize_frames == 1
    await stream.aclose()


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    payloads=st.lists(st.binary(min_size=0, max_size=3000), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=20),
)
async def test_frames_survive_any_segmentation(payloads, cuts) -> None:
    """However the byte stream is cut, frames come out whole and in order."""
    t = Transport("127.0.0.1", 0, policy=LOOPBACK)
    async with trio.open_nursery() as nursery:
        await nursery.start(t.run)
        wire = b"".join(encode_frame(p) for p in payloads)
        stream = await trio.open_tcp_stream(*t.local_address)
        pos, i = 0, 0
        while pos < len(wire):
            step = cuts[i % len(cuts)] * 97
            await stream.send_all(wire[pos : pos + step])
            pos += step
            i += 1
        expected = [p for p in payloads if p]  # zero-length frames are keepalives
        got = [(await t.receive()).payload for _ in expected]
        assert got == expected
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_bounded_queue_drops_and_counts(start_transport) -> None:
    cfg = TransportConfig(bulk_queue_items=4, urgent_queue_items=2)
    b = await start_transport(config=cfg, classify=by_first_byte)
    a = await start_transport()
    for i in range(20):
        await a.send_datagram(b.local_address, b"B%d" % i)
    await quiesce()
    stats = b.statistics()
    assert stats.udp.received == 20
    assert stats.udp.queue_full == 16
    assert stats.inbox.dropped_full == (0, 16)
    assert stats.inbox.queued == (0, 4)
    # The survivors are the first four, in order.
    assert [(await b.receive()).payload for _ in range(4)] == [b"B0", b"B1", b"B2", b"B3"]


async def test_queue_bytes_bound_frames() -> None:
    cfg = TransportConfig(queue_bytes=10_000, tcp=TcpConfig(max_frame_size=4000))
    b = Transport("127.0.0.1", 0, policy=LOOPBACK, config=cfg)
    a = Transport("127.0.0.1", 0, policy=LOOPBACK)
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        await nursery.start(a.run)
        for _ in range(5):
            await a.send_frame(b.local_address, b"z" * 3000)
        await quiesce()
        stats = b.statistics()
        assert stats.tcp.frames_received == 5
        assert stats.inbox.queued == (0, 3) and stats.inbox.queued_bytes == (0, 9000)
        assert stats.tcp.queue_full == 2
        nursery.cancel_scope.cancel()


async def test_urgent_lane_served_first_under_storm(start_transport) -> None:
    cfg = TransportConfig(bulk_queue_items=64, urgent_queue_items=64)
    b = await start_transport(config=cfg, classify=by_first_byte)
    a = await start_transport()
    storm = await start_transport()
    for i in range(400):
        await storm.send_datagram(b.local_address, b"B%d" % i)
        if i % 100 == 99:
            await a.send_datagram(b.local_address, b"U%d" % (i // 100))
    await quiesce()
    first = [await b.receive() for _ in range(4)]
    assert [f.payload for f in first] == [b"U0", b"U1", b"U2", b"U3"]
    assert {f.source for f in first} == {a.local_address}
    stats = b.statistics()
    assert stats.inbox.dropped_full[URGENT] == 0
    assert stats.inbox.dropped_full[BULK] == stats.udp.queue_full > 0
    assert stats.udp.received == 404
    assert (await b.receive()).payload == b"B0"


async def test_unclassifiable_packets_dropped_and_counted(start_transport) -> None:
    b = await start_transport(classify=by_first_byte)
    a = await start_transport()
    await a.send_datagram(b.local_address, b"")  # classifier raises on empty
    await a.send_datagram(b.local_address, b"U")
    assert (await b.receive()).payload == b"U"
    await quiesce()
    assert b.statistics().udp.unclassified == 1


################################################################################
# Accept policy on the sockets
################################################################################


async def test_sources_outside_policy_refused_before_decoding(start_transport) -> None:
    seen: list[bytes] = []

    def spy(payload: bytes) -> int:
        seen.append(payload)
        return BULK

    b = await start_transport(policy=AcceptPolicy.from_cidrs(["10.77.0.0/24"]), classify=spy)
    a = await start_transport()
    await a.send_datagram(b.local_address, b"hello")
    # TCP: the connection is accepted by the kernel, then closed before a byte is read.
    stream = await trio.open_tcp_stream(*b.local_address)
    with trio.fail_after(5):
        assert await stream.receive_some(10) == b""
    await quiesce()
    stats = b.statistics()
    assert stats.udp.refused_source == 1 and stats.udp.queued == 0
    assert stats.tcp.inbound_refused_source == 1 and stats.tcp.inbound_accepted == 0
    assert seen == []  # never reached the classifier


################################################################################
# TCP connections: failures, limits, pool
################################################################################


async def test_connect_refused_is_a_clear_transport_error(start_transport) -> None:
    a = await start_transport()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()
    with pytest.raises(TransportError, match=rf"tcp connect to 127.0.0.1:{dead[1]} failed") as e:
        await a.send_frame(dead, b"x")
    assert e.value.address == dead
    stats = a.statistics().tcp
    assert stats.connect_failures == 1 and stats.send_failures == 1
    assert stats.pool_connections == 0
    assert a.paths.get(dead).tcp_failed == 1


async def test_connect_timeout(monkeypatch, autojump_clock) -> None:
    async def never(*args, **kwargs):
        await trio.sleep_forever()

    monkeypatch.setattr(trio, "open_tcp_stream", never)
    cfg = TransportConfig(tcp=TcpConfig(connect_timeout=1.5))
    t = Transport("127.0.0.1", 0, policy=LOOPBACK, config=cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(t.run)
        with pytest.raises(TransportError, match=r"timed out after 1.5 s"):
            await t.send_frame(("127.0.0.1", 9), b"x")
        nursery.cancel_scope.cancel()


async def test_send_timeout_when_peer_stops_reading(start_transport) -> None:
    cfg = TransportConfig(tcp=TcpConfig(send_timeout=0.3))
    a = await start_transport(config=cfg)
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    with pytest.raises(TransportError, match=r"timed out after 0\.3 s"):
        for _ in range(200):  # fills both socket buffers, then blocks
            await a.send_frame(listener.getsockname(), b"x" * 1_000_000)
    listener.close()


async def test_inbound_connection_limit(start_transport) -> None:
    cfg = TransportConfig(tcp=TcpConfig(max_inbound_connections=2))
    b = await start_transport(config=cfg)
    held = [await trio.open_tcp_stream(*b.local_address) for _ in range(2)]
    for s in held:  # make sure both are being served before the third arrives
        await s.send_all(encode_frame(b"hi"))
    for _ in held:
        got = await b.receive()
        assert got.vouch is not None
        got.vouch()  # members' connections (unauthenticated ones would be evicted)
    third = await trio.open_tcp_stream(*b.local_address)
    with trio.fail_after(5):
        assert await third.receive_some(10) == b""
    stats = b.statistics().tcp
    assert stats.inbound_refused_capacity == 1 and stats.inbound_active == 2
    for s in [*held, third]:
        await s.aclose()


async def test_slow_frame_body_and_idle_connections_are_closed(start_transport) -> None:
    cfg = TransportConfig(tcp=TcpConfig(frame_timeout=0.2, idle_timeout=0.3))
    b = await start_transport(config=cfg)
    slow = await trio.open_tcp_stream(*b.local_address)
    await slow.send_all(struct.pack(">I", 100) + b"only part")
    idle = await trio.open_tcp_stream(*b.local_address)
    with trio.fail_after(5):
        assert await slow.receive_some(10) == b""
        assert await idle.receive_some(10) == b""
    stats = b.statistics().tcp
    assert stats.frame_timeouts == 1 and stats.idle_closed == 1 and stats.inbound_active == 0
    await slow.aclose()
    await idle.aclose()


async def test_pool_evicts_least_recently_used(start_transport) -> None:
    cfg = TransportConfig(tcp=TcpConfig(pool_size=1))
    a = await start_transport(config=cfg)
    b = await start_transport()
    c = await start_transport()
    await a.send_frame(b.local_address, b"1")
    await a.send_frame(c.local_address, b"2")
    await a.send_frame(b.local_address, b"3")
    assert (await b.receive()).payload == b"1"
    assert (await c.receive()).payload == b"2"
    assert (await b.receive()).payload == b"3"
    stats = a.statistics().tcp
    assert stats.pool_connections == 1 and stats.pool_evictions == 2


async def test_idle_pooled_connection_closed_by_janitor(start_transport) -> None:
    cfg = TransportConfig(tcp=TcpConfig(idle_timeout=0.2))
    a = await start_transport(config=cfg)
    b = await start_transport()
    await a.send_frame(b.local_address, b"x")
    await b.receive()
    with trio.fail_after(5):
        while a.statistics().tcp.pool_connections:
            await trio.sleep(0.05)
    assert a.statistics().tcp.pool_evictions == 1


async def test_pooled_connection_survives_peer_restart(nursery, start_transport) -> None:
    a = await start_transport()
    b1 = Transport("127.0.0.1", 0, policy=LOOPBACK)
    async with trio.open_nursery() as inner:
        address = await inner.start(b1.run)
        await a.send_frame(address, b"before")
        assert (await b1.receive()).payload == b"before"
        inner.cancel_scope.cancel()
    b2 = Transport(address[0], address[1], policy=LOOPBACK)
    await nursery.start(b2.run)
    await a.send_frame(address, b"after")
    assert (await b2.receive()).payload == b"after"
    assert a.statistics().tcp.send_failures == 0


async def test_peer_can_answer_on_the_pooled_connection(start_transport) -> None:
    a = await start_transport()
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    await a.send_frame(listener.getsockname(), b"request")
    conn, _ = await listener.accept()
    server = trio.SocketStream(conn)
    assert await server.receive_some(100) == encode_frame(b"request")
    await server.send_all(encode_frame(b"answer"))
    got = await a.receive()
    assert (got.payload, got.reliable, got.source) == (b"answer", True, listener.getsockname())
    await server.aclose()
    listener.close()


################################################################################
# UDP blocked while TCP works
################################################################################


async def test_udp_seems_blocked_while_tcp_works(start_transport) -> None:
    paths = PathHealth(udp_silence_threshold=3, udp_silence_min=0.0)
    a = await start_transport(paths=paths)
    b = await start_transport()
    await a.send_datagram(b.local_address, b"probe")
    await a.send_frame(b.local_address, b"probe over tcp")  # the handshake completes
    for _ in range(2):
        await a.send_datagram(b.local_address, b"probe")
    assert a.paths.udp_seems_blocked(b.local_address)
    assert a.statistics().udp_blocked_peers == (b.local_address,)
    assert a.paths.warn_udp_blocked_once(b.local_address) is True
    assert a.paths.warn_udp_blocked_once(b.local_address) is False
    await b.send_datagram(a.local_address, b"udp works again")
    await a.receive()
    assert not a.paths.udp_seems_blocked(b.local_address)
    assert a.paths.get(b.local_address).udp_received == 1


async def test_unreachable_peer_gets_no_tcp_works_claim(start_transport) -> None:
    """Issue 7 §7: a peer unreachable over both UDP and TCP is never "TCP works"."""
    paths = PathHealth(udp_silence_threshold=3, udp_silence_min=0.0)
    a = await start_transport(paths=paths)
    with socket.socket() as probe:  # a port where nothing listens, neither UDP nor TCP
        probe.bind(("127.0.0.1", 0))
        address = probe.getsockname()
    for _ in range(5):
        await a.send_datagram(address, b"probe")
        with pytest.raises(TransportError):
            await a.send_frame(address, b"probe over tcp")
    assert not a.paths.udp_seems_blocked(address)
    assert a.statistics().udp_blocked_peers == ()


async def test_receive_batch_takes_urgent_first_then_bulk(start_transport) -> None:
    b = await start_transport(classify=by_first_byte)
    a = await start_transport()
    for payload in (b"B1", b"B2", b"U1", b"B3", b"U2"):
        await a.send_datagram(b.local_address, payload)
    await quiesce()
    batch = await b.receive_batch(4)
    assert [p.payload for p in batch] == [b"U1", b"U2", b"B1", b"B2"]
    assert [p.payload for p in await b.receive_batch(10)] == [b"B3"]


async def test_hostname_destination_is_refused_without_dns(start_transport) -> None:
    a = await start_transport()
    with pytest.raises(TransportError, match="numeric IP address, got 'localhost'"):
        await a.send_datagram(("localhost", 9), b"x")
