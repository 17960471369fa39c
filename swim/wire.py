"""The wire codec: protocol messages to bytes and back, and nothing else.

A packet is one version byte followed by one msgpack array of messages; each message is
a msgpack array whose first element is its `MessageType` and whose other elements are
the fields of the matching NamedTuple below, in order. A packet with several messages is
a compound packet: that is how gossip rides on pings and acks. Messages are tuples, not
maps, so field names never travel (an alive message with no metadata is ~30 bytes).

Decoding is strict about types and bounds, and every way malformed input can fail ends
in one `DecodeError`, which callers count and drop. Trailing fields a newer peer appends
to a message are ignored, so fields, like message types, may only ever be appended.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from hashlib import blake2b as _blake2b
from typing import Any, NamedTuple

import msgpack

from ._events import Address

#: First byte of every packet. Bump it only for a change older peers cannot ignore.
PROTOCOL_VERSION = 1
_VERSION_PREFIX = bytes([PROTOCOL_VERSION])

#: Bytes a packet adds around its messages: the version byte and the array header.
PACKET_OVERHEAD = 4
#: Longest member name or host string accepted.
NAME_LENGTH_MAX = 255
#: Most messages in one packet, and members in one push-pull.
MESSAGES_MAX = 4096
MEMBERS_MAX = 1 << 20
#: Largest integer any wire field may hold (incarnations, sequence numbers, sizes), and
#: so the largest incarnation a member can hold. 2**62 leaves headroom below both
#: msgpack's uint64 and SQLite's signed 64-bit INTEGER, so a value the decoder accepts,
#: plus one, still encodes and still stores. Larger values are a `DecodeError`: the
#: packet is dropped and counted, never acted on. See docs/protocol.md ("Bounded
#: integers") for what a member accused at this incarnation does.
INTEGER_MAX = 1 << 62
#: The highest incarnation the protocol knows (the same bound as every wire integer).
INCARNATION_MAX = INTEGER_MAX


class MessageType(enum.IntEnum):
    """Message type tags.

    ONLY APPEND; values are part of the protocol.
    """

    PING = 0
    INDIRECT_PING = 1
    ACK = 2
    NACK = 3
    ALIVE = 4
    SUSPECT = 5
    DEAD = 6
    LEFT = 7
    PUSH_PULL = 8
    APP = 9
    SYNC = 10
    ALIVE_REF = 11
    PULL = 12


class DecodeError(ValueError):
    """A packet could not be decoded: truncated, garbled, wrong version or bad fields.

    The only exception `decode_packet` raises. It is an operating error (a remote
    problem), never a bug of ours: the core counts it and drops the packet.
    """


class IntegerRangeError(DecodeError):
    """A wire integer outside 0..INTEGER_MAX: counted apart from garbled packets.

    Only an enrolled sender can get such a packet past authentication, so the core
    counts it separately (`MembershipStatistics.dropped_out_of_range`): it is worth
    an operator's attention, unlike line noise.
    """


####################################################################################
# Messages
####################################################################################


class Ping(NamedTuple):
    """Are you alive? Answered with `Ack(seq)` sent to `source_address`."""

    seq: int
    #: The name we expect to answer, so a new process on a reused address does not ack
    #: on behalf of the member that used to live there.
    target: str
    source: str
    #: Where to reply: the sender's advertised address, not the packet's source, which
    #: is an ephemeral port when the ping came over a stream.
    source_address: Address


class IndirectPing(NamedTuple):
    """Ping `target` for me and forward its ack (SWIM's ping-req)."""

    seq: int
    target: str
    target_address: Address
    #: Send `Nack(seq)` if the target does not answer within our probe timeout.
    nack: bool
    source: str
    source_address: Address


class Ack(NamedTuple):
    seq: int


class Nack(NamedTuple):
    """Lifeguard: "I asked, the target did not answer": proof the requester is healthy."""

    seq: int


class Alive(NamedTuple):
    """`name` is alive at `incarnation`, at `address`, with metadata `meta`."""

    name: str
    incarnation: int
    address: Address
    meta: bytes


#: Bytes of a metadata digest (`meta_digest`) in an `AliveRef`.
META_DIGEST_SIZE = 8
#: Most names one `Pull` may carry; a longer list is a `DecodeError`. The core asks
#: for and answers fewer (`SwimConfig.pull_names_max`).
PULL_NAMES_MAX = 256


def meta_digest(meta: bytes) -> bytes:
    """The digest an `AliveRef` carries in place of `meta`: 8 bytes of BLAKE2b.

    64 bits, not CRC-32: a receiver that already holds a record with the same digest
    keeps it, so a collision would keep a stale record (silently) until the next change.
    """
    return _blake2b(meta, digest_size=META_DIGEST_SIZE).digest()


class AliveRef(NamedTuple):
    """A lean `Alive`: `meta` replaced by its digest (`meta_digest`).

    Gossip sends this for members whose metadata is large (`SwimConfig.lean_alive_meta_min`),
    so many more rumors fit in a datagram. A receiver holding metadata with this digest
    applies it with what it holds (a refute: new incarnation, same record); one that
    does not sends a `Pull` and applies the member only once the full `Alive` arrives.
    """

    name: str
    incarnation: int
    address: Address
    meta_digest: bytes


class Pull(NamedTuple):
    """Send me the full `Alive` of these members (the answer to `AliveRef`s we lack).

    Answered with one packet of `Alive` messages to `source_address`, for those of
    `names` the receiver holds alive or suspect, at most `SwimConfig.pull_names_max`.
    """

    source: str
    source_address: Address
    names: tuple[str, ...]


class Suspect(NamedTuple):
    """`source` suspects `name` at `incarnation`."""

    name: str
    incarnation: int
    source: str


class Dead(NamedTuple):
    """`source` declares `name` dead at `incarnation`."""

    name: str
    incarnation: int
    source: str


class Left(NamedTuple):
    """`name` left the cluster gracefully at `incarnation` (not a failure)."""

    name: str
    incarnation: int


#: One member in a push-pull: (name, address, incarnation, MemberState value, meta).
MemberEntry = tuple[str, Address, int, int, bytes]


class PushPull(NamedTuple):
    """Full-state anti-entropy: the sender's whole view. Answered in kind unless `reply`."""

    join: bool
    reply: bool
    source: str
    source_address: Address
    members: tuple[MemberEntry, ...]


class App(NamedTuple):
    """An application broadcast (`Membership.broadcast_app`), piggybacked like rumors.

    `key` is the application's invalidation key: a newer broadcast under the same key
    replaces an older one still queued. The core never re-gossips what it receives.
    """

    source: str
    key: str
    payload: bytes


#: One member in a sync digest: (name, incarnation, MemberState value, entry hash). The
#: incarnation is the member's version; the hash (CRC-32 of the encoded `MemberEntry`)
#: tells apart two records at one incarnation, as when a restarted daemon publishes a
#: new record at the incarnation it stored (the member then refutes, as before).
DigestEntry = tuple[str, int, int, int]


class Sync(NamedTuple):
    """Digest-first anti-entropy, in up to three legs (see docs/protocol.md).

    Leg 0 (opening): `digest` of every member we hold, our own full entry in `members`,
    and the application digest. Leg 1 (reply): full entries the opener lacks or holds
    older, the names we want in full (`wanted`), our application digest, and the
    application state the opener lacks. Leg 2 (closing, only when needed): the wanted
    full entries, and the application state the replier lacks.
    """

    leg: int
    join: bool
    source: str
    source_address: Address
    digest: tuple[DigestEntry, ...]
    members: tuple[MemberEntry, ...]
    wanted: tuple[str, ...]
    app_digest: bytes
    app_state: bytes


Message = (
    Ping
    | IndirectPing
    | Ack
    | Nack
    | Alive
    | Suspect
    | Dead
    | Left
    | PushPull
    | App
    | Sync
    | AliveRef
    | Pull
)

_TYPE_OF: dict[type[Any], int] = {
    Ping: MessageType.PING.value,
    IndirectPing: MessageType.INDIRECT_PING.value,
    Ack: MessageType.ACK.value,
    Nack: MessageType.NACK.value,
    Alive: MessageType.ALIVE.value,
    Suspect: MessageType.SUSPECT.value,
    Dead: MessageType.DEAD.value,
    Left: MessageType.LEFT.value,
    PushPull: MessageType.PUSH_PULL.value,
    App: MessageType.APP.value,
    Sync: MessageType.SYNC.value,
    AliveRef: MessageType.ALIVE_REF.value,
    Pull: MessageType.PULL.value,
}

####################################################################################
# Encoding
####################################################################################

_packer = msgpack.Packer(use_bin_type=True)
_pack: Callable[[object], bytes] = _packer.pack
_pack_array_header: Callable[[int], bytes] = _packer.pack_array_header
_ARRAY_HEADERS = [_pack_array_header(i) for i in range(16)]


def encode_message(message: Message) -> bytes:
    """One message as msgpack bytes, ready to be joined into a packet."""
    return _pack((_TYPE_OF[type(message)], *message))


def encode_member_entry(entry: MemberEntry) -> bytes:
    """One push-pull member entry as msgpack bytes, for `encode_push_pull`."""
    return _pack(entry)


def encode_digest_entry(entry: DigestEntry) -> bytes:
    """One sync digest entry as msgpack bytes, for `encode_sync`."""
    return _pack(entry)


def encode_sync(
    leg: int,
    join: bool,
    source: str,
    source_address: Address,
    digest: Sequence[bytes],
    members: Sequence[bytes],
    wanted: Sequence[str],
    app_digest: bytes,
    app_state: bytes,
) -> bytes:
    """A `Sync` message from pre-encoded digest and member entries.

    Byte for byte what `encode_message(Sync(...))` gives, without re-encoding the
    entries of members that did not change since the last exchange.
    """
    return b"".join(
        (
            _ARRAY_HEADERS[10],
            _pack(MessageType.SYNC.value),
            _pack(leg),
            _pack(join),
            _pack(source),
            _pack(source_address),
            _pack_array_header(len(digest)),
            *digest,
            _pack_array_header(len(members)),
            *members,
            _pack(tuple(wanted)),
            _pack(app_digest),
            _pack(app_state),
        )
    )


def encode_push_pull(
    join: bool, reply: bool, source: str, source_address: Address, entries: Sequence[bytes]
) -> bytes:
    """A `PushPull` message from pre-encoded member entries.

    Byte for byte what `encode_message(PushPull(...))` gives, but a member whose state
    did not change since the last exchange is not re-encoded: at 10,000 members that is
    most of the cost of an exchange.
    """
    return b"".join(
        (
            _ARRAY_HEADERS[6],
            _pack(MessageType.PUSH_PULL.value),
            _pack(join),
            _pack(reply),
            _pack(source),
            _pack(source_address),
            _pack_array_header(len(entries)),
            *entries,
        )
    )


def encode_packet(parts: Sequence[bytes]) -> bytes:
    """A packet from already-encoded messages (`encode_message` outputs).

    Messages are encoded once and concatenated under one array header, so a broadcast
    piggybacked on many packets is never re-encoded.
    """
    n = len(parts)
    header = _ARRAY_HEADERS[n] if n < 16 else _pack_array_header(n)
    return _VERSION_PREFIX + header + b"".join(parts)


def encode(*messages: Message) -> bytes:
    """A packet of the given messages (convenience for tests and drivers)."""
    return encode_packet([encode_message(m) for m in messages])


def _first_type(packet: bytes) -> int | None:
    """The first message's type byte, by a peek at the packet's head (no decoding), or
    None when the head is not a packet of array messages (malformed input included)."""
    if len(packet) < 4 or packet[0] != PROTOCOL_VERSION:
        return None
    at = 2 if 0x91 <= packet[1] <= 0x9F else 4 if packet[1] == 0xDC else 0  # array16: 16+
    if at == 0 or len(packet) < at + 2 or not 0x91 <= packet[at] <= 0x9F:
        return None
    return packet[at + 1]


def answers_a_probe(packet: bytes) -> bool:
    """Whether `packet` opens with an ack or nack: proof its sender read a probe of ours.

    A cheap peek (`_first_type`); False for anything else. The daemon uses it to end a
    certificate introduction early (`overlay.introductions`), so a wrong answer costs
    bytes, never correctness.
    """
    return _first_type(packet) in (MessageType.ACK, MessageType.NACK)


def asks_for_an_answer(packet: bytes) -> bool:
    """Whether `packet` opens with a ping or an indirect ping: a datagram its receiver
    answers. Gossip and acks expect nothing back.

    A cheap peek (`_first_type`). The daemon uses it so that only datagrams that ask for
    an answer count towards "UDP seems blocked" (`overlay.peerpaths`): a wrong answer
    costs a diagnostic, never correctness.
    """
    return _first_type(packet) in (MessageType.PING, MessageType.INDIRECT_PING)


def packet_size(parts_size: int, count: int) -> int:
    """Exact size of a packet holding `count` messages totalling `parts_size` bytes."""
    header = 1 if count < 16 else 3
    return 1 + header + parts_size


####################################################################################
# Decoding
####################################################################################


def _name(value: Any) -> str:
    if type(value) is not str or len(value) > NAME_LENGTH_MAX:
        raise DecodeError("bad name")
    return value


def _uint(value: Any) -> int:
    """The one check every wire integer goes through: 0 <= value <= INTEGER_MAX."""
    if type(value) is not int:
        raise DecodeError("bad integer")
    if not 0 <= value <= INTEGER_MAX:
        raise IntegerRangeError("integer out of range")
    return value


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise DecodeError("bad boolean")
    return value


def _address(value: Any) -> Address:
    if (
        type(value) is not tuple
        or len(value) != 2
        or type(value[0]) is not str
        or len(value[0]) > NAME_LENGTH_MAX
        or type(value[1]) is not int
        or not 0 <= value[1] <= 0xFFFF
    ):
        raise DecodeError("bad address")
    return value


def _bytes(value: Any) -> bytes:
    if type(value) is not bytes:
        raise DecodeError("bad bytes")
    return value


def _need(raw: tuple[Any, ...], n: int) -> None:
    if len(raw) < n:
        raise DecodeError(f"message type {raw[0]} needs {n - 1} fields, got {len(raw) - 1}")


def _ping(raw: tuple[Any, ...]) -> Ping:
    _need(raw, 5)
    return Ping(_uint(raw[1]), _name(raw[2]), _name(raw[3]), _address(raw[4]))


def _ping_fast(raw: tuple[Any, ...]) -> Ping:
    """`_ping` for a well-formed message, in one call (see `_alive_fast`)."""
    if len(raw) >= 5:
        seq, target, source, address = raw[1:5]
        if (
            type(seq) is int
            and 0 <= seq <= INTEGER_MAX
            and type(target) is str
            and len(target) <= NAME_LENGTH_MAX
            and type(source) is str
            and len(source) <= NAME_LENGTH_MAX
            and type(address) is tuple
            and len(address) == 2
            and type(address[0]) is str
            and len(address[0]) <= NAME_LENGTH_MAX
            and type(address[1]) is int
            and 0 <= address[1] <= 0xFFFF
        ):
            return _tuple_new(Ping, raw[1:5])
    return _ping(raw)


def _indirect_ping(raw: tuple[Any, ...]) -> IndirectPing:
    _need(raw, 7)
    return IndirectPing(
        _uint(raw[1]),
        _name(raw[2]),
        _address(raw[3]),
        _bool(raw[4]),
        _name(raw[5]),
        _address(raw[6]),
    )


def _ack(raw: tuple[Any, ...]) -> Ack:
    _need(raw, 2)
    return Ack(_uint(raw[1]))


def _ack_fast(raw: tuple[Any, ...]) -> Ack:
    """`_ack` for a well-formed ack, in one call (see `_alive_fast`)."""
    if len(raw) >= 2:
        seq = raw[1]
        if type(seq) is int and 0 <= seq <= INTEGER_MAX:
            return _tuple_new(Ack, raw[1:2])
    return _ack(raw)


def _nack(raw: tuple[Any, ...]) -> Nack:
    _need(raw, 2)
    return Nack(_uint(raw[1]))


def _alive(raw: tuple[Any, ...]) -> Alive:
    _need(raw, 5)
    return Alive(_name(raw[1]), _uint(raw[2]), _address(raw[3]), _bytes(raw[4]))


def _alive_fast(raw: tuple[Any, ...]) -> Alive:
    """`_alive` for a well-formed message, in one call instead of six.

    Alive is most of what a packet carries while a cluster forms (every member's
    announcement reaches every member several times). The same checks, inlined; any
    failure goes back to `_alive`, so malformed input raises exactly what it did.
    """
    if len(raw) >= 5:
        name, incarnation, address, meta = raw[1:5]
        if (
            type(name) is str
            and len(name) <= NAME_LENGTH_MAX
            and type(incarnation) is int
            and 0 <= incarnation <= INTEGER_MAX
            and type(address) is tuple
            and len(address) == 2
            and type(address[0]) is str
            and len(address[0]) <= NAME_LENGTH_MAX
            and type(address[1]) is int
            and 0 <= address[1] <= 0xFFFF
            and type(meta) is bytes
        ):
            return _tuple_new(Alive, raw[1:5])
    return _alive(raw)


def _digest(value: Any) -> bytes:
    if type(value) is not bytes or len(value) != META_DIGEST_SIZE:
        raise DecodeError("bad metadata digest")
    return value


def _alive_ref(raw: tuple[Any, ...]) -> AliveRef:
    _need(raw, 5)
    return AliveRef(_name(raw[1]), _uint(raw[2]), _address(raw[3]), _digest(raw[4]))


def _alive_ref_fast(raw: tuple[Any, ...]) -> AliveRef:
    """`_alive_ref` for a well-formed message, in one call (see `_alive_fast`): lean
    rumors are what a forming cluster receives most."""
    if len(raw) >= 5:
        name, incarnation, address, digest = raw[1:5]
        if (
            type(name) is str
            and len(name) <= NAME_LENGTH_MAX
            and type(incarnation) is int
            and 0 <= incarnation <= INTEGER_MAX
            and type(address) is tuple
            and len(address) == 2
            and type(address[0]) is str
            and len(address[0]) <= NAME_LENGTH_MAX
            and type(address[1]) is int
            and 0 <= address[1] <= 0xFFFF
            and type(digest) is bytes
            and len(digest) == META_DIGEST_SIZE
        ):
            return _tuple_new(AliveRef, raw[1:5])
    return _alive_ref(raw)


def _pull(raw: tuple[Any, ...]) -> Pull:
    _need(raw, 4)
    names = raw[3]
    if type(names) is not tuple or len(names) > PULL_NAMES_MAX:
        raise DecodeError("bad pull name list")
    return Pull(_name(raw[1]), _address(raw[2]), _names(names))


def _suspect(raw: tuple[Any, ...]) -> Suspect:
    _need(raw, 4)
    return Suspect(_name(raw[1]), _uint(raw[2]), _name(raw[3]))


def _suspect_fast(raw: tuple[Any, ...]) -> Suspect:
    """`_suspect` for a well-formed message, in one call (see `_alive_fast`)."""
    if len(raw) >= 4:
        name, incarnation, source = raw[1:4]
        if (
            type(name) is str
            and len(name) <= NAME_LENGTH_MAX
            and type(incarnation) is int
            and 0 <= incarnation <= INTEGER_MAX
            and type(source) is str
            and len(source) <= NAME_LENGTH_MAX
        ):
            return _tuple_new(Suspect, raw[1:4])
    return _suspect(raw)


def _dead(raw: tuple[Any, ...]) -> Dead:
    _need(raw, 4)
    return Dead(_name(raw[1]), _uint(raw[2]), _name(raw[3]))


def _left(raw: tuple[Any, ...]) -> Left:
    _need(raw, 3)
    return Left(_name(raw[1]), _uint(raw[2]))


def _member_entries(value: Any) -> tuple[MemberEntry, ...]:
    """Validate a push-pull member list, column by column.

    It can be 10,000 entries long, so the checks run as C-level passes over each column
    (`map`, `set`, `min`, `max`) instead of a Python loop per entry.
    """
    if type(value) is not tuple or len(value) > MEMBERS_MAX:
        raise DecodeError("bad push-pull member list")
    if not value:
        return ()
    if set(map(type, value)) != {tuple}:
        raise DecodeError("bad push-pull member entry")
    lengths = set(map(len, value))
    if min(lengths) < 5:
        raise DecodeError("bad push-pull member entry")
    if lengths != {5}:  # a newer peer appended fields: keep the ones we know
        value = tuple([entry[:5] for entry in value])
    names, addresses, incarnations, states, metas = zip(*value, strict=True)
    if (
        set(map(type, names)) != {str}
        or max(map(len, names)) > NAME_LENGTH_MAX
        or set(map(type, addresses)) != {tuple}
        or set(map(len, addresses)) != {2}
        or set(map(type, incarnations)) != {int}
        or set(map(type, states)) != {int}
        or min(states) < 0
        or max(states) > 3
        or set(map(type, metas)) != {bytes}
    ):
        raise DecodeError("bad push-pull member entry")
    if min(incarnations) < 0 or max(incarnations) > INTEGER_MAX:
        raise IntegerRangeError("push-pull incarnation out of range")
    hosts, ports = zip(*addresses, strict=True)
    if (
        set(map(type, hosts)) != {str}
        or max(map(len, hosts)) > NAME_LENGTH_MAX
        or set(map(type, ports)) != {int}
        or min(ports) < 0
        or max(ports) > 0xFFFF
    ):
        raise DecodeError("bad push-pull member entry")
    return value  # type: ignore[no-any-return]


def _push_pull(raw: tuple[Any, ...]) -> PushPull:
    _need(raw, 6)
    return PushPull(
        _bool(raw[1]), _bool(raw[2]), _name(raw[3]), _address(raw[4]), _member_entries(raw[5])
    )


def _digest_entries(value: Any) -> tuple[DigestEntry, ...]:
    """Validate a sync digest, column by column (see `_member_entries`)."""
    if type(value) is not tuple or len(value) > MEMBERS_MAX:
        raise DecodeError("bad sync digest")
    if not value:
        return ()
    if set(map(type, value)) != {tuple}:
        raise DecodeError("bad sync digest entry")
    lengths = set(map(len, value))
    if min(lengths) < 4:
        raise DecodeError("bad sync digest entry")
    if lengths != {4}:
        value = tuple([entry[:4] for entry in value])
    names, incarnations, states, hashes = zip(*value, strict=True)
    if (
        set(map(type, names)) != {str}
        or max(map(len, names)) > NAME_LENGTH_MAX
        or set(map(type, incarnations)) != {int}
        or set(map(type, states)) != {int}
        or min(states) < 0
        or max(states) > 3
        or set(map(type, hashes)) != {int}
    ):
        raise DecodeError("bad sync digest entry")
    if (
        min(incarnations) < 0
        or max(incarnations) > INTEGER_MAX
        or min(hashes) < 0
        or max(hashes) > INTEGER_MAX
    ):
        raise IntegerRangeError("sync digest integer out of range")
    return value  # type: ignore[no-any-return]


def _names(value: Any) -> tuple[str, ...]:
    if type(value) is not tuple or len(value) > MEMBERS_MAX:
        raise DecodeError("bad name list")
    for name in value:
        _name(name)
    return value


def _app(raw: tuple[Any, ...]) -> App:
    _need(raw, 4)
    return App(_name(raw[1]), _name(raw[2]), _bytes(raw[3]))


def _sync(raw: tuple[Any, ...]) -> Sync:
    _need(raw, 10)
    leg = _uint(raw[1])
    if leg > 2:
        raise DecodeError("bad sync leg")
    return Sync(
        leg,
        _bool(raw[2]),
        _name(raw[3]),
        _address(raw[4]),
        _digest_entries(raw[5]),
        _member_entries(raw[6]),
        _names(raw[7]),
        _bytes(raw[8]),
        _bytes(raw[9]),
    )


#: Builds a message NamedTuple from an already-checked tuple of its fields, in C.
_tuple_new = tuple.__new__

_DECODERS: dict[int, Callable[[tuple[Any, ...]], Message]] = {
    MessageType.PING.value: _ping_fast,
    MessageType.INDIRECT_PING.value: _indirect_ping,
    MessageType.ACK.value: _ack_fast,
    MessageType.NACK.value: _nack,
    MessageType.ALIVE.value: _alive_fast,
    MessageType.SUSPECT.value: _suspect_fast,
    MessageType.DEAD.value: _dead,
    MessageType.LEFT.value: _left,
    MessageType.PUSH_PULL.value: _push_pull,
    MessageType.APP.value: _app,
    MessageType.SYNC.value: _sync,
    MessageType.ALIVE_REF.value: _alive_ref_fast,
    MessageType.PULL.value: _pull,
}


#: Packets at least this long (anti-entropy: a sync digest, a push-pull) are worth
#: remembering once decoded (`DecodeCache`): a member opens a sync with the same bytes
#: to each peer it joins through, and a simulator delivers all of them in one process.
DECODED_SIZE_MIN = 2048
#: How many such packets a `DecodeCache` remembers by default (the oldest is dropped
#: first). Small: the hits come from copies that arrive close together; this many
#: hold a few MB at 1,000 members (a 20 kB digest decodes to about 200 kB of tuples).
DECODED_MAX = 16


#: How many rumor messages (alive, lean alive, suspect, dead, left) a `DecodeCache` remembers by
#: default, by their bytes. A rumor travels as the same bytes to every member, several
#: times each (piggybacked on `retransmit_limit` packets by every member that holds
#: it), so a member decodes most rumors it receives more than once; while 1,000
#: members join, nearly all the messages received are such copies.
RUMORS_REMEMBERED = 4096
#: Compound packets of at least this many messages (a fixarray from 3, or an array16
#: header) have their rumors looked up one by one (splitting costs more than it saves
#: on a ping with one rumor; measured).
_SPLIT_MESSAGES_MIN = 3
_RUMOR_TYPES = frozenset(
    {
        MessageType.ALIVE.value,
        MessageType.SUSPECT.value,
        MessageType.DEAD.value,
        MessageType.LEFT.value,
        MessageType.ALIVE_REF.value,
    }
)


class DecodeCache:
    """Decoded packets and rumors, remembered by their bytes, so a copy is decoded once.

    Decoding is a pure function of the bytes and messages are immutable tuples, so a
    hit is always right: a rumor is remembered only once it decoded and validated, and
    a packet that is malformed anywhere is decoded afresh by `decode_packet`'s own path,
    so it fails exactly as it would without a cache. The cache is owned by whoever
    passes it to `decode_packet`: each `swim.Membership` holds its own unless its
    driver hands one in (the simulator shares one between all the cores of a run, where
    one opening reaches many of them). Bounded: at most `max_packets` large packets
    (each at least `size_min` bytes) and `max_rumors` rumors, the oldest dropped first.
    """

    __slots__ = ("_packets", "_rumors", "_unpacker", "max_packets", "max_rumors", "size_min")

    def __init__(
        self,
        max_packets: int = DECODED_MAX,
        size_min: int = DECODED_SIZE_MIN,
        max_rumors: int = RUMORS_REMEMBERED,
    ) -> None:
        if max_packets < 1 or max_rumors < 1:
            raise ValueError(
                f"max_packets and max_rumors must be at least 1, got {max_packets}, {max_rumors}"
            )
        self.max_packets = max_packets
        self.max_rumors = max_rumors
        self.size_min = size_min
        self._packets: dict[bytes, tuple[Message, ...]] = {}
        self._rumors: dict[bytes, Message] = {}
        #: One unpacker reused from packet to packet (making one costs about as much as
        #: splitting a short packet); dropped after any packet it failed on.
        self._unpacker: msgpack.Unpacker | None = None

    def __len__(self) -> int:
        """Large packets held (rumors are counted by `rumors`)."""
        return len(self._packets)

    @property
    def rumors(self) -> int:
        """Rumor messages held."""
        return len(self._rumors)

    def decode(self, packet: bytes | bytearray) -> list[Message]:
        """`decode_packet(packet)`, answered from the cache where it can be (the list
        is a fresh copy each time)."""
        if type(packet) is not bytes:
            return _decode(packet)
        if len(packet) >= self.size_min:
            packets = self._packets
            cached = packets.get(packet)
            if cached is not None:
                return list(cached)
            messages = _decode(packet)
            if len(packets) >= self.max_packets:
                del packets[next(iter(packets))]
            packets[packet] = tuple(messages)
            return messages
        if (
            len(packet) > 2
            and packet[0] == PROTOCOL_VERSION
            and (0x90 + _SPLIT_MESSAGES_MIN <= packet[1] <= 0x9F or packet[1] == 0xDC)
        ):
            try:
                return self._split(packet)
            except Exception:  # malformed: the plain path below raises what it should
                pass
        return _decode(packet)

    def _split(self, packet: bytes) -> list[Message]:
        """Decode a compound packet message by message, rumors from the cache.

        Raises on anything but a well-formed packet (any exception: the caller then
        decodes it the plain way, which raises the right `DecodeError`).
        """
        unpacker = self._unpacker
        if unpacker is None:
            unpacker = msgpack.Unpacker(raw=False, use_list=False, strict_map_key=True)
        self._unpacker = None  # given back below, once this packet parsed cleanly
        # `tell` counts from the first byte ever fed to this unpacker.
        base = unpacker.tell()
        unpacker.feed(packet)
        unpacker.skip()  # the version byte, checked by the caller
        count = unpacker.read_array_header()
        tell = unpacker.tell
        skip = unpacker.skip
        rumors = self._rumors
        remembered = rumors.get
        start = tell() - base
        messages: list[Message] = []
        for _ in range(count):
            skip()
            end = tell() - base
            chunk = packet[start:end]
            start = end
            message = remembered(chunk)
            if message is None:
                item = msgpack.unpackb(chunk, raw=False, use_list=False, strict_map_key=True)
                if type(item) is not tuple or not item or type(item[0]) is not int:
                    raise DecodeError("a message is a non-empty array")
                message = _DECODERS[item[0]](item)
                if item[0] in _RUMOR_TYPES:
                    if len(rumors) >= self.max_rumors:
                        del rumors[next(iter(rumors))]
                    rumors[chunk] = message
            messages.append(message)
        if start != len(packet):
            raise DecodeError("trailing bytes")
        self._unpacker = unpacker
        return messages


def decode_packet(packet: bytes | bytearray, cache: DecodeCache | None = None) -> list[Message]:
    """The messages in one packet.

    Args:
        packet: the bytes, as received.
        cache: where large packets seen recently are remembered (see `DecodeCache`);
            None decodes every time.

    Raises:
        DecodeError: for anything but a well-formed packet of this protocol version.
    """
    if cache is not None:
        return cache.decode(packet)
    return _decode(packet)


def _decode(packet: bytes | bytearray) -> list[Message]:
    if not packet:
        raise DecodeError("empty packet")
    if packet[0] != PROTOCOL_VERSION:
        raise DecodeError(f"unsupported protocol version {packet[0]}")
    try:
        raw = msgpack.unpackb(
            memoryview(packet)[1:], raw=False, use_list=False, strict_map_key=True
        )
    except Exception as exc:  # msgpack raises a zoo of types; all mean "malformed"
        raise DecodeError(f"malformed msgpack: {type(exc).__name__}") from None
    if type(raw) is not tuple or not raw or len(raw) > MESSAGES_MAX:
        raise DecodeError("a packet is a non-empty array of messages")
    messages: list[Message] = []
    for item in raw:
        if type(item) is not tuple or not item:
            raise DecodeError("a message is a non-empty array")
        decoder = _DECODERS.get(item[0]) if type(item[0]) is int else None
        if decoder is None:
            raise DecodeError(f"unknown message type {item[0]!r}")
        messages.append(decoder(item))
    return messages
