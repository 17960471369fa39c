"""Where a reply goes, and how much: the rule that keeps members from reflecting.

Theory of operation
-------------------
Pings, indirect pings, syncs and push-pulls name an address to answer at
(`source_address`), and an indirect ping names the address of the member to probe.
Answering there made every member a reflector: any enrolled key could name a victim's
host and port and have members send it an ack with a datagram of piggybacked rumors,
or a whole view over a TCP connection opened to it (pulls have their own rule,
`swim._pull`, which this one follows). So an answer goes only where the request
provably came from:

- **datagram** from the address it names, or from the requester's held address (the
  requester is a member this core holds, in any state): the whole answer, there. A
  joiner, a member we do not hold yet, speaks from the address it names.
- **datagram** from anywhere else (naming another address than its source, from a
  requester not held there): an answer to the packet's source, within the request's
  own size (`Membership` keeps one budget per packet, so several messages in one
  packet share it). Whoever is at that address sent the request, so it gets at most
  one byte back per byte it sent, and never a stream.
- **stream**: its source is a connection (an ephemeral port) whose host the handshake
  proved. The answer goes to the named address when it is on that host, else to the
  requester's held address when that is; otherwise it is refused: no connection is
  opened to an address that only a packet names.

When the driver authenticates packets it passes the sender's name (`sender`): a message
whose requester names another member is refused, so a member cannot ask in another's
name to aim answers at it. Without `sender` (the simulator) the source address alone
ties a datagram to its requester.

An indirect ping's target is checked against membership: we ping the target's held
address, never the one the request names, and a target we do not hold is not pinged.
The ping we send for it fits within the request's size too (a member's own requests
carry their piggybacked rumors, so theirs are full), and the ack or nack we forward
goes to the requester under the rule above, within the same size.

What it costs: a member whose packets leave from another address than the one it
advertises (a NAT, a host with several addresses and a wildcard bind) gets its acks
without piggybacked rumors, and its sync answers cut to its request's size; gossip and
its next syncs from other members carry the rest. A join whose datagrams leave from
another address than the one it names gets an answer within its size, so a joiner
must send from the address it advertises (populi binds it).

What it does not stop: a datagram whose source address is forged. A sender that can
forge its source (raw sockets on a network that does not filter them; an overlay such
as WireGuard does) and names that forged address gets the whole answer sent there, as
any UDP protocol would. Authentication still names the sender, and over a stream the
handshake proves the host.
"""

from __future__ import annotations

from collections.abc import Callable

from ._events import Address

__all__ = ["fit_within", "reply_route"]


def reply_route(
    held: Address | None, named: Address, source: Address, reliable: bool
) -> tuple[Address, bool] | None:
    """Where to answer a request, and whether the answer is cut to the request's size.

    Args:
        held: the requester's address as this core held it before the packet (None:
            not held, or it is us).
        named: the address the request asks to be answered at.
        source: where the packet came from (a stream's remote address).
        reliable: the request came over a stream.

    Returns:
        (destination, capped), or None to refuse the request.
    """
    if reliable:
        if named[0] == source[0]:
            return named, False
        if held is not None and held[0] == source[0]:
            return held, False
        return None
    return source, source not in (held, named)


def fit_within(build: Callable[[int], bytes], count: int, budget: int) -> tuple[int, bytes] | None:
    """The largest `k <= count` whose packet `build(k)` is within `budget` bytes, and
    that packet; None when not even `build(0)` fits. `build` must grow with `k` (the
    first `k` items of a list); a binary search calls it O(log count) times."""
    best = build(0)
    if len(best) > budget:
        return None
    low, high = 0, count
    while low < high:
        middle = (low + high + 1) // 2
        packet = build(middle)
        if len(packet) <= budget:
            low, best = middle, packet
        else:
            high = middle - 1
    return low, best
