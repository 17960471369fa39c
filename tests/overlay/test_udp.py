"""`overlay.udp.UdpEndpoint` on loopback: what is queued, what is dropped and under
which counter, and how sends fail."""

from __future__ import annotations

import socket

import attrs
import pytest
import trio

from overlay.base import TransportError
from overlay.inbox import BULK, URGENT, LaneLimit, PriorityInbox
from overlay.netfilter import AcceptPolicy
from overlay.peerpaths import PathHealth
from overlay.udp import UdpEndpoint

from .ovtest_support import LOOPBACK


def inbox(items: int = 8) -> PriorityInbox:
    return PriorityInbox([LaneLimit(items, 1 << 16), LaneLimit(items, 1 << 16)])


def endpoint(box: PriorityInbox, **kwargs: object) -> UdpEndpoint:
    kwargs.setdefault("policy", LOOPBACK)
    return UdpEndpoint.bind("127.0.0.1", 0, inbox=box, **kwargs)  # type: ignore[arg-type]


def counters(ep: UdpEndpoint) -> dict[str, int]:
    """The non-zero counters, by name."""
    return {name: value for name, value in attrs.asdict(ep.statistics()).items() if value}


async def test_each_refusal_has_its_own_counter() -> None:
    box = inbox(items=1)

    def classify(payload: bytes) -> int:
        if payload == b"garbage":
            raise ValueError(payload)
        return URGENT if payload.startswith(b"!") else BULK

    ep = endpoint(box, classify=classify, max_datagram_size=16)
    try:
        ep._handle(b"x" * 17, ("127.0.0.1", 9))
        ep._handle(b"ok", ("10.1.2.3", 9))  # outside the accept policy
        ep._handle(b"garbage", ("127.0.0.1", 9))
        ep._handle(b"!urgent", ("127.0.0.1", 9))
        ep._handle(b"bulk", ("127.0.0.1", 9))
        ep._handle(b"bulk again", ("127.0.0.1", 9))  # its lane holds one
        assert counters(ep) == {
            "oversize": 1,
            "refused_source": 1,
            "unclassified": 1,
            "queued": 2,
            "queue_full": 1,
        }
        first, second = box.receive_nowait(), box.receive_nowait()
        assert (first.payload, first.lane, first.reliable) == (b"!urgent", URGENT, False)
        assert (second.payload, second.source) == (b"bulk", ("127.0.0.1", 9))
    finally:
        ep.close()


async def test_a_datagram_goes_through_the_socket_and_the_paths_count_it() -> None:
    paths_a, paths_b = PathHealth(), PathHealth()
    box_a, box_b = inbox(), inbox()
    a, b = endpoint(box_a, paths=paths_a), endpoint(box_b, paths=paths_b)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.serve)
        nursery.start_soon(b.serve)
        await a.send(b.local_address, b"hello")
        with trio.fail_after(5):
            got = await box_b.receive()
        assert (got.payload, got.source, got.reliable) == (b"hello", a.local_address, False)
        # b heard a stranger (not tracked: a flood cannot evict known peers) ...
        assert paths_b.get(a.local_address) is None
        await b.send(a.local_address, b"back")
        with trio.fail_after(5):
            assert (await box_a.receive()).payload == b"back"
        # ... and a's datagram was answered.
        to_b = paths_a.get(b.local_address)
        assert to_b is not None
        assert (to_b.udp_sent, to_b.udp_received, to_b.udp_sent_since_received) == (1, 1, 0)
        assert a.statistics().sent == b.statistics().queued == 1
        a.close()
        b.close()  # serve returns


async def test_sends_that_cannot_go_raise_one_clear_error_and_are_counted() -> None:
    ep = endpoint(inbox(), max_datagram_size=8)
    with pytest.raises(ValueError, match="exceeds max_datagram_size 8"):
        await ep.send(("127.0.0.1", 9), b"123456789")
    with pytest.raises(TransportError):
        await ep.send(("not-a-host", 9), b"x")
    ep.close()
    ep.close()  # idempotent
    with pytest.raises(TransportError, match="closed"):
        await ep.send(("127.0.0.1", 9), b"x")
    assert ep.statistics().send_errors == 2
    assert ep.statistics().sent == 0


@pytest.mark.parametrize("size", [0, 65508])
def test_the_datagram_limit_must_fit_udp(size: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with pytest.raises(ValueError, match=r"max_datagram_size must be in 1\.\.65507"):
            UdpEndpoint(
                sock, inbox=inbox(), policy=AcceptPolicy.allow_all(), max_datagram_size=size
            )
    finally:
        sock.close()


async def test_a_receive_buffer_is_requested() -> None:
    ep = endpoint(inbox(), receive_buffer=1 << 16)
    try:
        assert ep.receive_buffer >= 1 << 16  # Linux grants double, capped by rmem_max
    finally:
        ep.close()
