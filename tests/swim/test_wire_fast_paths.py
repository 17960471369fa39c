"""The five fast-path message decoders of `swim.wire` against their slow twins.

Ping, ack, alive, suspect and lean alive are decoded by an inlined check (`_ping_fast`,
`_ack_fast`, `_alive_fast`, `_suspect_fast`, `_alive_ref_fast`) that falls back to the
general decoder (`_ping`, `_ack`, ...) on anything it does not accept. These tests hold
the two to one contract: for every well-formed message both give the same NamedTuple,
and for every malformed one (a field of the wrong type, one past a bound, a field
missing, bytes garbled) both raise the same `DecodeError`, with the same message.

(`DecodeCache`, the packet-level fast path, is checked against the plain path in
test_wire.py.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any
from unittest import mock

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from swim import DecodeError, MessageType, wire
from swim.wire import (
    INTEGER_MAX,
    META_DIGEST_SIZE,
    NAME_LENGTH_MAX,
    Ack,
    Alive,
    AliveRef,
    Message,
    Ping,
    Suspect,
    decode_packet,
    encode,
    encode_message,
)

Decoder = Callable[[tuple[Any, ...]], Message]

#: Each fast path's message type, the fast decoder, and its slow twin.
FAST_PATHS: dict[MessageType, tuple[Decoder, Decoder]] = {
    MessageType.PING: (wire._ping_fast, wire._ping),
    MessageType.ACK: (wire._ack_fast, wire._ack),
    MessageType.ALIVE: (wire._alive_fast, wire._alive),
    MessageType.SUSPECT: (wire._suspect_fast, wire._suspect),
    MessageType.ALIVE_REF: (wire._alive_ref_fast, wire._alive_ref),
}
#: The decoder table with every fast path replaced by its slow twin.
SLOW_DECODERS = {t.value: slow for t, (_fast, slow) in FAST_PATHS.items()}

names = st.text(max_size=40) | st.text(min_size=NAME_LENGTH_MAX, max_size=NAME_LENGTH_MAX)
uints = st.integers(0, INTEGER_MAX) | st.sampled_from([0, INTEGER_MAX])
addresses = st.tuples(names, st.integers(0, 0xFFFF) | st.sampled_from([0, 0xFFFF]))
fast_messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Ping, uints, names, names, addresses),
    st.builds(Ack, uints),
    st.builds(Alive, names, uints, addresses, st.binary(max_size=64)),
    st.builds(Suspect, names, uints, names),
    st.builds(
        AliveRef,
        names,
        uints,
        addresses,
        st.binary(min_size=META_DIGEST_SIZE, max_size=META_DIGEST_SIZE),
    ),
)

# Field values at and just past every bound the decoders check, and of every type a
# field can wrongly have. `True` matters: a bool is an int to `isinstance`, never to
# the decoders.
BOUNDARY_VALUES: list[object] = [
    -1, 0, 1, INTEGER_MAX, INTEGER_MAX + 1, 2**64 - 1, -(2**63), 0xFFFF, 0x10000,
    True, False, None, 1.5, "", "x" * NAME_LENGTH_MAX, "x" * (NAME_LENGTH_MAX + 1),
    b"", b"d" * (META_DIGEST_SIZE - 1), b"d" * META_DIGEST_SIZE,
    b"d" * (META_DIGEST_SIZE + 1), "10.0.0.1", b"10.0.0.1", ("h", 1), ("h", 1, 2), ("h",),
]  # fmt: skip
junk_scalars = st.one_of(
    st.sampled_from(BOUNDARY_VALUES),
    st.integers(-(2**63), 2**64 - 1),
    st.text(max_size=8),
    st.binary(max_size=10),
)
junk_addresses = st.one_of(
    st.tuples(junk_scalars, junk_scalars),
    st.lists(junk_scalars, max_size=3).map(tuple),
    st.lists(st.just("h") | st.just(1), min_size=2, max_size=2),  # an array as a list
    st.dictionaries(st.text(max_size=2), junk_scalars, max_size=1),
)
junk_fields = junk_scalars | junk_addresses | addresses


def outcome(decode: Decoder, raw: tuple[Any, ...]) -> tuple[str, object]:
    """What `decode` makes of `raw`: the message with its exact type, or the exception
    with its exact type and text (anything but a `DecodeError` is a failure here)."""
    try:
        message = decode(raw)
    except DecodeError as exc:
        return ("raised", (type(exc), str(exc)))
    return ("decoded", (type(message), message))


def wire_form(message: Message) -> tuple[Any, ...]:
    """`message` as the decoders receive it: encoded, then unpacked by msgpack."""
    raw = msgpack.unpackb(encode_message(message), raw=False, use_list=False)
    assert type(raw) is tuple
    return raw


def test_the_decoder_table_uses_the_fast_paths() -> None:
    """The paths checked here are the ones `decode_packet` takes (were one removed on
    purpose, drop it from `FAST_PATHS`)."""
    for message_type, (fast, slow) in FAST_PATHS.items():
        assert wire._DECODERS[message_type.value] is fast
        assert fast is not slow


@settings(max_examples=400, deadline=None)
@given(fast_messages, st.lists(junk_scalars, max_size=3))
def test_well_formed_messages_decode_the_same_both_ways(
    message: Message, appended: list[object]
) -> None:
    """Both paths give the message that was encoded, as the same NamedTuple, also with
    trailing fields a newer peer appended."""
    raw = wire_form(message) + tuple(appended)
    fast, slow = FAST_PATHS[MessageType(raw[0])]
    expected = ("decoded", (type(message), message))
    assert outcome(fast, raw) == expected
    assert outcome(slow, raw) == expected


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(sorted(FAST_PATHS)), st.lists(junk_fields, max_size=6))
@example(MessageType.ACK, [True])
@example(MessageType.ACK, [INTEGER_MAX + 1])
@example(MessageType.ACK, [])
@example(MessageType.PING, [1, "t", "s", ("h", 0x10000)])
@example(MessageType.PING, [1, "t", "s", ("h", 1, 2)])
@example(MessageType.ALIVE, ["n", 1, ("h", 1), "meta as text"])
@example(MessageType.ALIVE, ["x" * (NAME_LENGTH_MAX + 1), 1, ("h", 1), b""])
@example(MessageType.SUSPECT, ["n", -1, "s"])
@example(MessageType.SUSPECT, ["n", 1])
@example(MessageType.SUSPECT, ["n", 1, "x" * (NAME_LENGTH_MAX + 1)])
@example(MessageType.ALIVE_REF, ["n", 1, ("h", 1), b"d" * (META_DIGEST_SIZE + 1)])
@example(MessageType.ALIVE_REF, ["n", 1, ("h" * (NAME_LENGTH_MAX + 1), 1), b"d" * 8])
def test_any_field_values_decode_or_fail_the_same_both_ways(
    message_type: MessageType, fields: list[object]
) -> None:
    """Whatever the fields, the fast path decodes what the slow one decodes and raises
    what it raises (`IntegerRangeError` included, which the core counts apart)."""
    raw = (message_type.value, *fields)
    fast, slow = FAST_PATHS[message_type]
    assert outcome(fast, raw) == outcome(slow, raw)


#: One well-formed message of each fast-path type.
GOOD_MESSAGES: list[Message] = [
    Ping(7, "target", "source", ("10.0.0.1", 7946)),
    Ack(7),
    Alive("name", 3, ("fd00::1", 7946), b"meta"),
    Suspect("name", 3, "source"),
    AliveRef("name", 3, ("10.0.0.1", 0), b"d" * META_DIGEST_SIZE),
]


def with_one_field_replaced(raw: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    """`raw` with each field, and each half of each address, set to each boundary value."""
    for at in range(1, len(raw)):
        for value in BOUNDARY_VALUES:
            yield (*raw[:at], value, *raw[at + 1 :])
            if type(raw[at]) is tuple:
                host, port = raw[at]
                for address in ((value, port), (host, value)):
                    yield (*raw[:at], address, *raw[at + 1 :])


def test_every_boundary_value_in_every_field_fails_the_same_both_ways() -> None:
    """Exhaustively: each field of a good message (each half of an address too) set to
    each value at or past a bound, for all five fast paths. Both paths agree on every
    one, and the fast path both accepts and refuses some (so neither side is vacuous)."""
    seen: dict[MessageType, set[str]] = {}
    for message in GOOD_MESSAGES:
        raw = wire_form(message)
        message_type = MessageType(raw[0])
        fast, slow = FAST_PATHS[message_type]
        for bad in with_one_field_replaced(raw):
            result = outcome(fast, bad)
            assert result == outcome(slow, bad), bad
            seen.setdefault(message_type, set()).add(result[0])
    assert seen == {t: {"decoded", "raised"} for t in FAST_PATHS}


@settings(max_examples=1500, deadline=None)
@given(fast_messages, st.data())
def test_one_bad_field_in_a_good_message_fails_the_same_both_ways(
    message: Message, data: st.DataObject
) -> None:
    """A good message with exactly one field (or one half of an address) replaced by
    junk: the case a bound check forgotten in a fast path would let through."""
    fields = list(wire_form(message))
    at = data.draw(st.integers(1, len(fields) - 1), label="field")
    if type(fields[at]) is tuple and data.draw(st.booleans(), label="in the address"):
        host, port = fields[at]
        half = data.draw(st.sampled_from([0, 1]), label="half")
        junk = data.draw(junk_scalars, label="junk")
        fields[at] = (junk, port) if half == 0 else (host, junk)
    else:
        fields[at] = data.draw(junk_fields, label="junk")
    raw = tuple(fields)
    fast, slow = FAST_PATHS[MessageType(raw[0])]
    assert outcome(fast, raw) == outcome(slow, raw)


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from(sorted(FAST_PATHS)), st.lists(junk_fields, max_size=6))
def test_junk_fields_through_msgpack_decode_or_fail_the_same_both_ways(
    message_type: MessageType, fields: list[object]
) -> None:
    """The same, for the values msgpack actually yields (lists become tuples, and
    what it cannot carry never arrives): a whole packet, both ways."""
    try:
        packet = bytes([wire.PROTOCOL_VERSION]) + msgpack.packb([[message_type.value, *fields]])
    except (OverflowError, TypeError, ValueError):
        return  # not encodable, so no packet can carry it
    assert packet_outcome(packet) == packet_outcome(packet, slow=True)


def packet_outcome(packet: bytes, *, slow: bool = False) -> tuple[str, object]:
    """What `decode_packet` makes of `packet`, with the fast paths, or with each
    replaced by its slow twin."""
    with mock.patch.dict(wire._DECODERS, SLOW_DECODERS) if slow else nullcontext():
        try:
            messages = decode_packet(packet)
        except DecodeError as exc:
            return ("raised", (type(exc), str(exc)))
    return ("decoded", [(type(m), m) for m in messages])


def mutations(packet: bytes, data: st.DataObject) -> Iterator[bytes]:
    """`packet` cut short, with one byte flipped, and with bytes appended."""
    yield packet[: data.draw(st.integers(0, len(packet)), label="cut")]
    flipped = bytearray(packet)
    at = data.draw(st.integers(0, len(packet) - 1), label="at")
    flipped[at] ^= data.draw(st.integers(1, 255), label="xor")
    yield bytes(flipped)
    yield packet + data.draw(st.binary(min_size=1, max_size=4), label="pad")


@settings(max_examples=500, deadline=None)
@given(st.lists(fast_messages, min_size=1, max_size=6), st.data())
def test_packets_and_their_mutations_decode_the_same_both_ways(
    batch: list[Message], data: st.DataObject
) -> None:
    """A packet of such messages decodes to them both ways; cut, flipped or padded, it
    decodes to the same messages or fails with the same `DecodeError` both ways."""
    packet = encode(*batch)
    expected = ("decoded", [(type(m), m) for m in batch])
    assert packet_outcome(packet) == expected
    assert packet_outcome(packet, slow=True) == expected
    for mutated in mutations(packet, data):
        assert packet_outcome(mutated) == packet_outcome(mutated, slow=True)


def test_the_slow_table_is_really_swapped_in() -> None:
    """The comparison above is not of the fast path with itself: while patched, the
    table holds the slow twins, and afterwards the fast paths again."""
    with mock.patch.dict(wire._DECODERS, SLOW_DECODERS):
        assert all(wire._DECODERS[t.value] is slow for t, (_f, slow) in FAST_PATHS.items())
    assert all(wire._DECODERS[t.value] is fast for t, (fast, _s) in FAST_PATHS.items())


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ((MessageType.ACK.value, True), "bad integer"),
        ((MessageType.ACK.value, INTEGER_MAX + 1), "integer out of range"),
        ((MessageType.PING.value, 1, "t", "s", ("h", 0x10000)), "bad address"),
        ((MessageType.ALIVE.value, "n", 1, ("h", 1), "m"), "bad bytes"),
        ((MessageType.SUSPECT.value, "n", 1), "needs 3 fields, got 2"),
        ((MessageType.ALIVE_REF.value, "n", 1, ("h", 1), b"1234567"), "bad metadata digest"),
    ],
)
def test_the_fast_paths_fail_with_the_slow_reasons(raw: tuple[Any, ...], error: str) -> None:
    """Named cases, so a regression reads plainly: the fast path hands a bad message to
    its slow twin, whose reason is the one raised."""
    fast, _slow = FAST_PATHS[MessageType(raw[0])]
    with pytest.raises(DecodeError, match=error):
        fast(raw)
