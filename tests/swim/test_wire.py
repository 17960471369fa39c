"""The codec: round trips, exact framing, and "malformed input only ever raises DecodeError"."""

from __future__ import annotations

import operator
import random
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swim import PROTOCOL_VERSION, DecodeError, Membership, MessageType, SwimConfig, wire
from swim.wire import (
    INTEGER_MAX,
    NAME_LENGTH_MAX,
    Ack,
    Alive,
    AliveRef,
    App,
    Dead,
    IndirectPing,
    Left,
    MemberEntry,
    Message,
    Nack,
    Ping,
    Pull,
    PushPull,
    Suspect,
    Sync,
    decode_packet,
    encode,
    encode_digest_entry,
    encode_member_entry,
    encode_message,
    encode_packet,
    encode_push_pull,
    encode_sync,
    packet_size,
)

names = st.text(max_size=40)
uints = st.integers(min_value=0, max_value=INTEGER_MAX)
addresses = st.tuples(st.text(max_size=40), st.integers(min_value=0, max_value=0xFFFF))
metas = st.binary(max_size=64)
entries = st.tuples(names, addresses, uints, st.integers(min_value=0, max_value=3), metas)

digest_entries = st.tuples(
    names, uints, st.integers(min_value=0, max_value=3), st.integers(0, 2**32 - 1)
)

messages = st.one_of(
    st.builds(App, names, names, metas),
    st.builds(
        Sync,
        st.integers(min_value=0, max_value=2),
        st.booleans(),
        names,
        addresses,
        st.lists(digest_entries, max_size=5).map(tuple),
        st.lists(entries, max_size=3).map(tuple),
        st.lists(names, max_size=3).map(tuple),
        metas,
        metas,
    ),
    st.builds(Ping, uints, names, names, addresses),
    st.builds(IndirectPing, uints, names, addresses, st.booleans(), names, addresses),
    st.builds(Ack, uints),
    st.builds(Nack, uints),
    st.builds(Alive, names, uints, addresses, metas),
    st.builds(Suspect, names, uints, names),
    st.builds(Dead, names, uints, names),
    st.builds(Left, names, uints),
    st.builds(AliveRef, names, uints, addresses, st.binary(min_size=8, max_size=8)),
    st.builds(Pull, names, addresses, st.lists(names, max_size=5).map(tuple)),
    st.builds(
        PushPull,
        st.booleans(),
        st.booleans(),
        names,
        addresses,
        st.lists(entries, max_size=5).map(tuple),
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, min_size=1, max_size=10))
def test_round_trip(batch: list[Message]) -> None:
    packet = encode(*batch)
    assert packet[0] == PROTOCOL_VERSION
    decoded = decode_packet(packet)
    assert decoded == batch
    assert [type(m) for m in decoded] == [type(m) for m in batch]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_decode_error(data: bytes) -> None:
    try:
        decode_packet(data)
    except DecodeError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=100))
def test_random_bytes_after_the_version_byte(data: bytes) -> None:
    try:
        decode_packet(bytes([PROTOCOL_VERSION]) + data)
    except DecodeError:
        pass


# Structurally plausible garbage: msgpack values of every type where messages belong.
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: (
        st.lists(children, max_size=7) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.lists(msgpack_values, max_size=7)), max_size=4))
def test_wrong_field_types_only_raise_decode_error(raw: list[tuple[int, list[object]]]) -> None:
    packet = bytes([PROTOCOL_VERSION]) + msgpack.packb([[t, *fields] for t, fields in raw])
    try:
        decode_packet(packet)
    except DecodeError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, min_size=1, max_size=5), st.data())
def test_truncation_and_bit_flips_only_raise_decode_error(
    batch: list[Message], data: st.DataObject
) -> None:
    packet = bytearray(encode(*batch))
    cut = data.draw(st.integers(0, len(packet)))
    flip = data.draw(st.integers(0, len(packet) - 1))
    mutated = bytearray(packet[:cut]) if data.draw(st.booleans()) else packet
    if mutated and flip < len(mutated):
        mutated[flip] ^= data.draw(st.integers(1, 255))
    try:
        decode_packet(bytes(mutated))
    except DecodeError:
        pass


@pytest.mark.parametrize(
    ("packet", "reason"),
    [
        (b"", "empty"),
        (bytes([PROTOCOL_VERSION + 1]) + msgpack.packb([[2, 1]]), "version"),
        (bytes([PROTOCOL_VERSION]) + b"\xc1", "malformed"),
        (bytes([PROTOCOL_VERSION]) + msgpack.packb([]), "non-empty array of messages"),
        (bytes([PROTOCOL_VERSION]) + msgpack.packb([[99, 1]]), "unknown message type"),
        (bytes([PROTOCOL_VERSION]) + msgpack.packb([[True, 1]]), "unknown message type"),
        (bytes([PROTOCOL_VERSION]) + msgpack.packb([[2]]), "needs 1 fields"),
        (bytes([PROTOCOL_VERSION]) + msgpack.packb([[2, -1]]), "integer out of range"),
        (bytes([PROTOCOL_VERSION]) + msgpack.packb([[2, True]]), "bad integer"),
        (bytes([PROTOCOL_VERSION]) + msgpack.packb([[2, 1.0]]), "bad integer"),
        (bytes([PROTOCOL_VERSION]) + msgpack.packb([[4, "a", 1, ["h", 70000], b""]]), "address"),
        (bytes([PROTOCOL_VERSION]) + msgpack.packb([[4, "a", 1, ["h", 1], "meta"]]), "bytes"),
        (
            bytes([PROTOCOL_VERSION]) + msgpack.packb([[7, "x" * (NAME_LENGTH_MAX + 1), 1]]),
            "bad name",
        ),
        (
            bytes([PROTOCOL_VERSION])
            + msgpack.packb([[8, False, False, "a", ["h", 1], [["b", ["h", 2], 1, 4, b""]]]]),
            "member entry",
        ),
        (bytes([PROTOCOL_VERSION]) + msgpack.packb([[2, 1]]) + b"\x00", "malformed"),
    ],
)
def test_malformed_packets(packet: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        decode_packet(packet)


def test_message_types_are_append_only() -> None:
    # Values are part of the protocol: changing one breaks every deployed peer.
    assert {t.name: t.value for t in MessageType} == {
        "PING": 0,
        "INDIRECT_PING": 1,
        "ACK": 2,
        "NACK": 3,
        "ALIVE": 4,
        "SUSPECT": 5,
        "DEAD": 6,
        "LEFT": 7,
        "PUSH_PULL": 8,
        "APP": 9,
        "SYNC": 10,
        "ALIVE_REF": 11,
        "PULL": 12,
    }


def test_framing_byte_by_byte() -> None:
    # Version byte, array header, then each message as [type, fields...].
    assert encode(Ack(5)) == bytes([PROTOCOL_VERSION, 0x91, 0x92, 0x02, 0x05])
    ping = encode_message(Ping(7, "b", "a", ("10.0.0.1", 7946)))
    assert ping == msgpack.packb([0, 7, "b", "a", ["10.0.0.1", 7946]])
    assert encode_packet([ping, encode_message(Ack(1))]) == (
        bytes([PROTOCOL_VERSION, 0x92]) + ping + msgpack.packb([2, 1])
    )


def test_trailing_fields_from_newer_peers_are_ignored() -> None:
    packet = bytes([PROTOCOL_VERSION]) + msgpack.packb([[2, 9, "future"]])
    assert decode_packet(packet) == [Ack(9)]


@pytest.mark.parametrize("count", [0, 1, 15, 16, 300])
def test_packet_size_is_exact(count: int) -> None:
    parts = [encode_message(Ack(i)) for i in range(count)]
    assert len(encode_packet(parts)) == packet_size(sum(map(len, parts)), count)


@settings(max_examples=100, deadline=None)
@given(st.booleans(), st.booleans(), names, addresses, st.lists(entries, max_size=20))
def test_encode_push_pull_matches_generic_encoding(
    join: bool,
    reply: bool,
    source: str,
    address: tuple[str, int],
    members: list[MemberEntry],
) -> None:
    pre = [encode_member_entry(entry) for entry in members]
    expected = encode_message(PushPull(join, reply, source, address, tuple(members)))
    assert encode_push_pull(join, reply, source, address, pre) == expected


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=0, max_value=2),
    st.booleans(),
    st.lists(digest_entries, max_size=20),
    st.lists(entries, max_size=10),
    st.lists(names, max_size=5),
    metas,
    metas,
)
def test_encode_sync_matches_generic_encoding(
    leg: int,
    join: bool,
    digest: list[tuple[str, int, int, int]],
    members: list[MemberEntry],
    wanted: list[str],
    app_digest: bytes,
    app_state: bytes,
) -> None:
    message = Sync(
        leg,
        join,
        "s",
        ("h", 1),
        tuple(digest),
        tuple(members),
        tuple(wanted),
        app_digest,
        app_state,
    )
    encoded = encode_sync(
        leg,
        join,
        "s",
        ("h", 1),
        [encode_digest_entry(e) for e in digest],
        [encode_member_entry(e) for e in members],
        wanted,
        app_digest,
        app_state,
    )
    assert encoded == encode_message(message)
    assert decode_packet(encode_packet([encoded])) == [message]


@pytest.mark.parametrize(
    "raw",
    [
        [10, 3, False, "s", ["h", 1], [], [], [], b"", b""],  # leg out of range
        [10, 0, False, "s", ["h", 1], [["a", 1, 0]], [], [], b"", b""],  # short digest entry
        [10, 0, False, "s", ["h", 1], [["a", 1, 4, 0]], [], [], b"", b""],  # bad state
        [10, 0, False, "s", ["h", 1], [["a", 1, 0, "x"]], [], [], b"", b""],  # bad hash
        [10, 0, False, "s", ["h", 1], [], [], [1], b"", b""],  # wanted not names
        [10, 0, False, "s", ["h", 1], [], [], [], "x", b""],  # digest not bytes
        [9, "s", "k"],  # app missing payload
        [11, "a", 1, ["h", 1], b"1234567"],  # digest one byte short
        [11, "a", 1, ["h", 1], b"123456789"],  # digest one byte long
        [11, "a", 1, ["h", 1], "12345678"],  # digest not bytes
        [11, "a", 1, ["h", 1]],  # lean alive missing its digest
        [12, "s", ["h", 1], ["a", 1]],  # pull names not names
        [12, "s", ["h", 1], ["a"] * (wire.PULL_NAMES_MAX + 1)],  # too many names
        [12, "s", ["h", 1], "a"],  # pull names not a list
    ],
)
def test_malformed_sync_and_app_are_decode_errors(raw: list[object]) -> None:
    with pytest.raises(DecodeError):
        decode_packet(bytes([PROTOCOL_VERSION]) + msgpack.packb([raw]))


@given(st.lists(messages, min_size=1, max_size=40))
def test_answers_a_probe_peeks_the_first_message_type(batch: list[Any]) -> None:
    from swim.wire import answers_a_probe

    packet = encode(*batch)
    assert answers_a_probe(packet) is isinstance(batch[0], Ack | Nack)


def test_answers_a_probe_on_junk_is_false() -> None:
    from swim.wire import answers_a_probe

    for junk in (b"", b"\x01", b"\x01\x91\x92", b"\x02\x91\x92\x02\x00", b"\xff" * 8):
        assert answers_a_probe(junk) is False


@given(st.lists(messages, min_size=1, max_size=40))
def test_asks_for_an_answer_peeks_the_first_message_type(batch: list[Any]) -> None:
    from swim.wire import asks_for_an_answer

    packet = encode(*batch)
    assert asks_for_an_answer(packet) is isinstance(batch[0], Ping | IndirectPing)


def test_asks_for_an_answer_on_junk_is_false() -> None:
    from swim.wire import asks_for_an_answer

    for junk in (b"", b"\x01", b"\x01\x91\x92", b"\x02\x91\x92\x01\x00", b"\x01\xdc\x00"):
        assert asks_for_an_answer(junk) is False
    assert asks_for_an_answer(b"\x01\xdc\x00\x10\x92\x00") is True  # a 16-message ping


def test_every_probe_and_ack_a_cluster_sends_is_recognised() -> None:
    """The daemon ends certificate introductions on acks, and counts only probes towards
    "UDP seems blocked": the core must send each first in its packet."""
    from swim.wire import answers_a_probe, asks_for_an_answer
    from tests.swim.helpers import Cluster

    cluster = Cluster(4, seed=3)
    cluster.join_all()
    cluster.run(10.0)
    pings = acks = 0
    for _at, _name, send in cluster.sent:
        first = decode_packet(send.payload)[0]
        assert asks_for_an_answer(send.payload) is isinstance(first, Ping | IndirectPing)
        assert answers_a_probe(send.payload) is isinstance(first, Ack | Nack)
        pings += isinstance(first, Ping)
        acks += isinstance(first, Ack)
    assert pings > 10 and acks > 10


#: Per hot message kind: a valid message's fields, and for each field the values at
#: and across the bounds the decoder checks, plus values of every wrong type.
WRONG_TYPES: list[object] = [None, True, 1.5, "x", b"x", ("x",), (), -1]
NAMES: list[object] = ["", "n" * NAME_LENGTH_MAX, "n" * (NAME_LENGTH_MAX + 1)]
UINTS: list[object] = [0, INTEGER_MAX, INTEGER_MAX + 1, -1, 2**64 - 1, False]
ADDRESSES: list[object] = [
    ("h" * NAME_LENGTH_MAX, 0xFFFF),
    ("h" * (NAME_LENGTH_MAX + 1), 1),
    ("h", 0x10000),
    ("h", -1),
    ("h", "1"),
    (1, 1),
    ("h", 1, 2),
    ("h",),
    ("h", True),
]
BYTES: list[object] = [b"", b"m" * 2000]
HOT: dict[str, list[tuple[object, list[object]]]] = {
    "alive": [("m", NAMES), (3, UINTS), (("10.0.0.1", 7946), ADDRESSES), (b"meta", BYTES)],
    "suspect": [("m", NAMES), (3, UINTS), ("s", NAMES)],
    "ping": [(9, UINTS), ("t", NAMES), ("s", NAMES), (("10.0.0.1", 7946), ADDRESSES)],
    "ack": [(9, UINTS)],
    "alive_ref": [
        ("m", NAMES),
        (3, UINTS),
        (("10.0.0.1", 7946), ADDRESSES),
        (b"d" * 8, [b"d" * 8, b"d" * 7, b"d" * 9, b""]),
    ],
}


def hot_cases() -> list[tuple[str, tuple[object, ...]]]:
    cases = []
    for kind, fields in HOT.items():
        base = [value for value, _ in fields]
        for cut in range(len(base)):
            cases.append((kind, (0, *base[:cut])))
        cases.append((kind, (0, *base, "a newer peer's field")))
        for i, (_, edges) in enumerate(fields):
            for value in [*edges, *WRONG_TYPES]:
                cases.append((kind, (0, *base[:i], value, *base[i + 1 :])))
    return cases


def decode_outcome(decoder: object, raw: tuple[object, ...]) -> object:
    try:
        message = decoder(raw)  # type: ignore[operator]
    except DecodeError as exc:
        return type(exc)
    return (type(message), tuple(message))


@pytest.mark.parametrize(("kind", "raw"), hot_cases())
def test_fast_decoders_agree_with_the_checked_ones(kind: str, raw: tuple[object, ...]) -> None:
    """The inlined decoders of the hot messages accept exactly what the field-by-field
    ones accept, build the same message, and fail with the same error class: every
    field at and across each bound, and of each wrong type."""
    fast = getattr(wire, f"_{kind}_fast")
    checked = getattr(wire, f"_{kind}")
    assert decode_outcome(fast, raw) == decode_outcome(checked, raw)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(HOT)),
    st.lists(st.sampled_from([*NAMES, *UINTS, *ADDRESSES, *BYTES, *WRONG_TYPES]), max_size=6),
)
def test_fast_decoders_agree_on_any_mix(kind: str, fields: list[object]) -> None:
    """The same, for fields drawn from every list at once (several wrong together)."""
    raw = (0, *fields)
    fast = getattr(wire, f"_{kind}_fast")
    assert decode_outcome(fast, raw) == decode_outcome(getattr(wire, f"_{kind}"), raw)


def big_sync(n: int, tag: str = "") -> bytes:
    digest = tuple((f"member-{tag}{i:04d}", i, 0, i) for i in range(n))
    return encode(Sync(0, False, "s", ("h", 1), digest, (), (), b"", b""))


def test_large_packets_are_decoded_once_and_stay_bounded() -> None:
    """A large packet seen again is answered from its cache: the same messages, a
    fresh list each time, and never more than `max_packets` packets held."""
    cache = wire.DecodeCache()
    packet = big_sync(300)
    assert len(packet) >= wire.DECODED_SIZE_MIN
    first = decode_packet(packet, cache)
    first.clear()  # a caller's list is its own
    second = decode_packet(bytes(packet), cache)  # equal bytes, another object
    assert len(second) == 1 and second[0] is decode_packet(packet, cache)[0]
    assert second[0] is not decode_packet(packet)[0]  # no cache: decoded afresh
    for i in range(wire.DECODED_MAX + 5):
        decode_packet(big_sync(200, tag=str(i)), cache)
    assert len(cache) == wire.DECODED_MAX
    small = encode(Ack(9))
    assert decode_packet(small, cache) == [Ack(9)] and len(cache) == wire.DECODED_MAX
    garbled = packet[:-3] + b"\xc1\xc1\xc1"
    for _ in range(2):
        with pytest.raises(DecodeError):
            decode_packet(garbled, cache)
    assert decode_packet(bytearray(packet), cache) == decode_packet(packet)
    with pytest.raises(ValueError, match="max_packets"):
        wire.DecodeCache(0)


def test_the_decode_cache_is_per_instance_not_global() -> None:
    """No module-level cache in the sans-IO core: each `Membership` owns its own
    unless its driver hands one in, and only what it receives goes into it."""
    assert not [
        name
        for name, value in vars(wire).items()
        if isinstance(value, dict | list | set) and not (name.isupper() or name.startswith("__"))
    ], "swim.wire holds module-level mutable state"
    config = SwimConfig.lan()
    shared = wire.DecodeCache()
    a = Membership(config, "a", ("a", 1), random.Random(1), 0.0, decode_cache=shared)
    b = Membership(config, "b", ("b", 1), random.Random(2), 0.0, decode_cache=shared)
    c = Membership(config, "c", ("c", 1), random.Random(3), 0.0)
    packet = big_sync(300)
    a.receive(("s", 1), packet, 0.0, reliable=True)
    assert len(shared) == 1
    b.receive(("s", 1), packet, 0.0, reliable=True)
    c.receive(("s", 1), packet, 0.0, reliable=True)
    assert len(shared) == 1  # b's copy was a hit; c decoded into its own cache
    assert a.statistics().push_pulls_received == b.statistics().push_pulls_received == 1
    assert c.statistics().push_pulls_received == 1


def decode_result(packet: bytes, cache: wire.DecodeCache | None) -> object:
    """What decoding gives: the messages, or the exact exception type."""
    try:
        return decode_packet(packet, cache)
    except DecodeError as exc:
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, min_size=1, max_size=24), st.data())
def test_the_cache_decodes_exactly_as_the_plain_path(
    batch: list[Message], data: st.DataObject
) -> None:
    """A compound packet decoded message by message, rumors from the cache, gives the
    same messages as the plain path, and a truncated, flipped or padded one the same
    exception type (so the core counts it the same), before and after its rumors are
    remembered."""
    cache = wire.DecodeCache(max_rumors=8)
    packet = encode(*batch)
    mutated = bytearray(packet)
    action = data.draw(st.sampled_from(["cut", "flip", "pad", "none"]))
    if action == "cut":
        mutated = mutated[: data.draw(st.integers(0, len(packet)))]
    elif action == "flip":
        mutated[data.draw(st.integers(0, len(packet) - 1))] ^= data.draw(st.integers(1, 255))
    elif action == "pad":
        mutated += data.draw(st.binary(min_size=1, max_size=4))
    for candidate in (packet, bytes(mutated), packet):
        expected = decode_result(candidate, None)
        assert decode_result(candidate, cache) == expected
        assert decode_result(candidate, cache) == expected  # rumors now remembered
    assert cache.rumors <= 8


def test_one_cache_decodes_a_stream_of_good_and_bad_packets_as_the_plain_path() -> None:
    """The cache reuses one msgpack unpacker from packet to packet (and drops it after
    a packet it failed on): every packet of a long mixed stream still decodes exactly
    as the plain path decodes it alone."""
    rng = random.Random(8)
    cache = wire.DecodeCache(max_rumors=64)
    rumors = [Alive(f"m{i}", i, ("10.0.0.1", 7946), b"x" * (i % 5)) for i in range(40)]
    # Two packets in a row, each split message by message (the second with the
    # unpacker the first used): all their rumors are remembered.
    decode_packet(encode(Ack(1), *rumors[:5]), cache)
    decode_packet(encode(Ack(2), *rumors[5:10]), cache)
    assert cache.rumors == 10
    outcomes = set()
    for _ in range(300):
        packet = encode(Ack(rng.randrange(100)), *rng.sample(rumors, rng.randrange(2, 12)))
        # Cut and padded packets (flipped bytes are the Hypothesis test's): their
        # rumors are all originals, so the count below is exact.
        kind = rng.choice(["good", "good", "cut", "pad"])
        if kind == "cut":
            packet = packet[: rng.randrange(len(packet))]
        elif kind == "pad":
            packet += bytes([rng.randrange(256)])
        expected = decode_result(packet, None)
        assert decode_result(packet, cache) == expected
        outcomes.add(isinstance(expected, list))
    assert outcomes == {True, False}  # both well-formed and malformed packets came
    # And the message-by-message path was taken throughout, not only the plain one it
    # falls back to: every rumor was remembered.
    assert cache.rumors == len(rumors)


def test_rumors_are_remembered_by_their_bytes_and_bounded() -> None:
    """Rumors in a compound packet are decoded once, then found by their bytes;
    pings, acks and other one-off messages are not kept; the oldest go first."""
    cache = wire.DecodeCache(max_rumors=3)
    rumors = [Alive(f"m{i}", i, ("h", i), b"") for i in range(4)]
    first = decode_packet(encode(Ack(1), *rumors[:3]), cache)
    assert cache.rumors == 3
    again = decode_packet(encode(Ack(2), *rumors[:3]), cache)
    assert again[1:] == rumors[:3] and all(map(operator.is_, again[1:], first[1:]))
    decode_packet(encode(Ack(3), rumors[3], rumors[2], rumors[1]), cache)
    assert cache.rumors == 3
    assert decode_packet(encode(Ack(4), rumors[0], rumors[3], rumors[3]), cache)[1] is not first[1]
