"""Idle or keepalive-only connections cannot hold the inbound TCP slots (issue 7 §5).

Before: zero-length keepalives renewed any connection's idle timer and a full table
refused every newcomer, so 64 connections sending keepalives locked members out.
"""

from __future__ import annotations

import trio
import trio.testing

from overlay.tcp import TcpConfig, encode_frame
from overlay.transport import TransportConfig

KEEPALIVE = encode_frame(b"")


async def closed_by_peer(stream: trio.SocketStream) -> bool:
    with trio.fail_after(5):
        return await stream.receive_some(10) == b""


async def test_keepalive_only_connections_are_evicted_for_a_member(start_transport) -> None:
    slots, extra = 4, 3
    cfg = TransportConfig(tcp=TcpConfig(max_inbound_connections=slots, idle_timeout=60))
    b = await start_transport(config=cfg)
    squatters = []
    for _ in range(slots + extra):
        s = await trio.open_tcp_stream(*b.local_address)
        await s.send_all(KEEPALIVE)
        await trio.testing.wait_all_tasks_blocked(cushion=0.02)
        squatters.append(s)
    # The oldest ones made room for the newer ones, in order.
    for s in squatters[:extra]:
        assert await closed_by_peer(s)
    assert b.statistics().tcp.inbound_evicted == extra

    member = await trio.open_tcp_stream(*b.local_address)
    await member.send_all(encode_frame(b"push-pull"))
    got = await b.receive()
    assert got.payload == b"push-pull" and got.vouch is not None
    got.vouch()  # what the daemon does once the frame authenticated

    # More squatters now evict each other (and the older ones), never the member.
    for _ in range(2 * slots):
        s = await trio.open_tcp_stream(*b.local_address)
        await s.send_all(KEEPALIVE)
        await trio.testing.wait_all_tasks_blocked(cushion=0.02)
        squatters.append(s)
    await member.send_all(encode_frame(b"still served"))
    assert (await b.receive()).payload == b"still served"
    stats = b.statistics().tcp
    assert stats.inbound_refused_capacity == 0 and stats.inbound_active == slots
    assert stats.inbound_evicted == extra + 1 + 2 * slots  # the member took a slot too
    for s in [*squatters, member]:
        await s.aclose()


async def test_full_table_of_members_refuses_newcomers(start_transport) -> None:
    cfg = TransportConfig(tcp=TcpConfig(max_inbound_connections=2))
    b = await start_transport(config=cfg)
    members = [await trio.open_tcp_stream(*b.local_address) for _ in range(2)]
    for s in members:
        await s.send_all(encode_frame(b"hi"))
        got = await b.receive()
        assert got.vouch is not None
        got.vouch()
    third = await trio.open_tcp_stream(*b.local_address)
    assert await closed_by_peer(third)
    stats = b.statistics().tcp
    assert stats.inbound_refused_capacity == 1 and stats.inbound_evicted == 0
    for s in [*members, third]:
        await s.aclose()


async def test_keepalives_renew_only_an_authenticated_connection(start_transport) -> None:
    cfg = TransportConfig(tcp=TcpConfig(idle_timeout=0.3))
    b = await start_transport(config=cfg)
    stranger = await trio.open_tcp_stream(*b.local_address)
    member = await trio.open_tcp_stream(*b.local_address)
    await member.send_all(encode_frame(b"hello"))
    got = await b.receive()
    assert got.vouch is not None
    got.vouch()
    closed_at = None
    start = trio.current_time()
    with trio.move_on_after(1.2):
        while True:  # both send a keepalive every 0.1 s: the keepalive cadence, not a wait
            await member.send_all(KEEPALIVE)
            if closed_at is None:
                try:
                    await stranger.send_all(KEEPALIVE)
                except trio.BrokenResourceError:
                    closed_at = trio.current_time()
            await trio.sleep(0.1)
    assert closed_at is not None and closed_at - start < 1.0  # the stranger timed out
    await member.send_all(encode_frame(b"after 1.2 s"))
    assert (await b.receive()).payload == b"after 1.2 s"  # the member was kept
    stats = b.statistics().tcp
    assert stats.idle_closed == 1 and stats.inbound_active == 1
    await stranger.aclose()
    await member.aclose()
