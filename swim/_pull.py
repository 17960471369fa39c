"""Where a pull is answered, and how much: the rule that keeps pulls from reflecting.

Theory of operation
-------------------
A `Pull` names its requester (`source`) and an address to answer at
(`source_address`). Answering at that address made the pull a reflector: any enrolled
key could name a victim's host and port and have every member send it full records,
6 to 9 bytes for each byte asked, and over a stream have members open
TCP connections to it. So the named address is never used. An answer goes only where
the request provably came from:

- **datagram** from the requester's held address (the requester is a member this core
  holds, in any state, whose address is the packet's source): the whole answer, there.
- **datagram** from anywhere else (a requester we do not hold, or one heard from
  another address): an answer to the packet's source, cut to the request's own size.
  Whoever is at that address sent the request, so it gets at most one byte back per
  byte it sent, and never a stream.
- **stream**: its source is a connection (an ephemeral port), so the answer goes to the
  requester's held address, and only when the connection came from that address's
  host. Otherwise the pull is refused: no connection is opened to an address that only
  a packet names.

When the driver authenticates packets it passes the sender's name (`sender`): a pull
whose `source` names another member is refused, so a member cannot ask in another's
name to aim answers at it. Without `sender` (the simulator) the source address alone
ties a datagram to its requester.

What it costs: a requester whose packets leave from another address than the one it
advertises (a NAT between members) gets answers within the request's size; its pull
retries go to other members and then to the pulled member itself, and sync repairs what
is still missing.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._events import Address
from .wire import packet_size

__all__ = ["parts_within", "pull_answer_route"]


def pull_answer_route(
    held: Address | None, source: Address, reliable: bool
) -> tuple[Address, bool] | None:
    """Where to answer a pull, and whether the answer is cut to the request's size.

    Args:
        held: the requester's address as this core holds it (None: not held, or the
            authenticated sender is not the requester).
        source: where the packet came from (a stream's remote address).
        reliable: the pull came over a stream.

    Returns:
        (destination, capped), or None to refuse the pull.
    """
    if reliable:
        if held is not None and held[0] == source[0]:
            return held, False
        return None
    return source, held != source


def parts_within(parts: Sequence[bytes], budget: int) -> list[bytes]:
    """The first `parts` (encoded messages) that one packet of at most `budget` bytes
    holds: a capped answer is never bigger than the request it answers."""
    kept: list[bytes] = []
    used = 0
    for part in parts:
        if packet_size(used + len(part), len(kept) + 1) > budget:
            break
        kept.append(part)
        used += len(part)
    return kept
