"""What the membership core hands back to its driver.

The core never does I/O. Every call returns a list of `Output`: packets to put on the
wire (`Send`) and membership events for the application. Both are small frozen attrs
classes, so drivers and tests can compare them by value.
"""

from __future__ import annotations

import enum

import attrs

#: Where a member can be reached: (host, port). The core treats it as an opaque,
#: hashable, msgpack-encodable value; the Trio driver fills in real socket addresses and
#: the simulator uses synthetic ones.
Address = tuple[str, int]


class MemberState(enum.IntEnum):
    """A member's state as the local node believes it.

    ONLY APPEND; values are part of the protocol.
    """

    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3


@attrs.frozen
class Member:
    """A read-only snapshot of one member, as returned by `Membership.members()`."""

    name: str
    address: Address
    state: MemberState
    incarnation: int
    meta: bytes = b""
    #: The core's `now` when the member last changed state.
    state_since: float = 0.0
    #: Smoothed round-trip time of our direct probes of it, seconds (EWMA, see
    #: `swim._math.smoothed_rtt`); None until one of our pings got a direct ack.
    rtt: float | None = None


@attrs.frozen
class Send:
    """Put `payload` on the wire to `destination`.

    `reliable` asks the driver for a stream (TCP) attempt instead of a datagram: the core
    sets it for the fallback probe of memberlist's TCP ping and for push-pull state
    exchange, which may be larger than one packet.
    """

    destination: Address
    payload: bytes
    reliable: bool = False


@attrs.frozen
class MemberJoined:
    member: Member


@attrs.frozen
class MemberUpdated:
    """A live member's metadata or address changed."""

    member: Member


@attrs.frozen
class MemberSuspected:
    member: Member


@attrs.frozen
class MemberFailed:
    """The member was declared dead (its suspicion ran out, or a dead rumor arrived)."""

    member: Member


@attrs.frozen
class MemberLeft:
    """The member announced a graceful leave: not a failure."""

    member: Member


@attrs.frozen
class MemberRecovered:
    """A suspect or dead member was proven alive again (a refute or a rejoin)."""

    member: Member


@attrs.frozen
class SelfRefuted:
    """Somebody suspected or declared us dead; we bumped our incarnation to refute it."""

    incarnation: int


@attrs.frozen
class AppMessage:
    """An application broadcast arrived (`Membership.broadcast_app` on `source`).

    Delivered once per receipt: the same broadcast can arrive several times (it is
    piggybacked more than once, and re-broadcast by other members' applications), so
    deduplication (by a version in the payload, say) is the application's job, as is
    re-broadcasting what it has not seen before. `source` is the member that sent the
    packet: when the driver passes the packet's authenticated `sender` to `receive`, an
    `App` naming another source is dropped (`app_refused_sender`). (Without one, as in
    the simulator, it is only what the packet claims.)
    """

    source: str
    key: str
    payload: bytes


@attrs.frozen
class IncarnationExhausted(SelfRefuted):
    """We were accused at `swim.wire.INCARNATION_MAX`, which no refute can outbid.

    Only a forged or corrupted rumor gets there (2**62 honest refutes would take longer
    than the universe has). The core starts a new session: its incarnation goes back to
    0, and peers take it back as a new member once they have declared the old session
    dead and reaped it (`dead_retention` later; records at the limit are not remembered
    after reaping). The driver should persist the new incarnation and log loudly: some
    enrolled key is sending forged rumors. A subclass of `SelfRefuted` (with
    `incarnation` 0), so a driver that only knows refutes persists the reset.
    """

    #: The incarnation we were accused at.
    accused: int = 0


Event = (
    MemberJoined
    | MemberUpdated
    | MemberSuspected
    | MemberFailed
    | MemberLeft
    | MemberRecovered
    | SelfRefuted
    | AppMessage
)
Output = Send | Event
