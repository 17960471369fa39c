"""`populi_p2p.trust._codec`: canonical msgpack, strict unpacking, signed-blob
splitting and the plain-data check under every signed object."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.trust._codec import (
    MAX_PLAIN_DEPTH,
    CodecError,
    is_plain,
    pack_canonical,
    split_signed,
    unpack_strict,
)
from populi_p2p.trust.identity import SIGNATURE_BYTES

#: Plain values as they come back from msgpack (lists, str-keyed maps).
plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=40)
@given(plain)
def test_canonical_round_trips(value: Any) -> None:
    assert unpack_strict(pack_canonical(value)) == value


@settings(max_examples=40)
@given(st.dictionaries(st.text(max_size=8), st.integers(0, 2**32), min_size=2, max_size=8))
def test_key_order_does_not_change_the_bytes(mapping: dict[str, int]) -> None:
    reverse = dict(reversed(list(mapping.items())))
    assert pack_canonical(reverse) == pack_canonical(mapping)
    assert pack_canonical([{"n": reverse}]) == pack_canonical(({"n": mapping},))  # nested, tuple


def test_keys_are_sorted_in_the_bytes() -> None:
    assert pack_canonical({"b": 1, "a": 2}) == msgpack.packb({"a": 2, "b": 1})


def test_ext_types_are_left_alone_not_turned_into_lists() -> None:
    ext = msgpack.ExtType(5, b"x")
    assert msgpack.unpackb(pack_canonical([ext])) == [ext]


@pytest.mark.parametrize(
    "data",
    [
        b"",  # nothing
        msgpack.packb([1, 2])[:-1],  # truncated
        msgpack.packb(1) + b"\x01",  # trailing bytes
        msgpack.packb({1: "int key"}),  # map keys are str only
        b"\xc1",  # never used
    ],
)
def test_unpack_strict_refuses_what_is_not_one_value(data: bytes) -> None:
    with pytest.raises(CodecError, match="undecodable msgpack"):
        unpack_strict(data)


@given(st.binary(max_size=64))
def test_unpack_strict_raises_only_codec_error(data: bytes) -> None:
    try:
        unpack_strict(data)
    except CodecError:
        pass


def test_split_signed_takes_the_last_64_bytes() -> None:
    body, signature = split_signed(b"B" * 3 + b"S" * SIGNATURE_BYTES)
    assert (body, signature) == (b"BBB", b"S" * SIGNATURE_BYTES)
    with pytest.raises(CodecError):
        split_signed(b"S" * SIGNATURE_BYTES)  # a signature with no body


@settings(max_examples=40)
@given(plain)
def test_what_msgpack_gives_back_is_plain(value: Any) -> None:
    assert is_plain(value)


@pytest.mark.parametrize(
    "value", [{1: "x"}, (1, 2), {"a": {3}}, msgpack.ExtType(1, b""), [object()]]
)
def test_not_plain(value: Any) -> None:
    assert not is_plain(value)


def test_nesting_deeper_than_the_limit_is_not_plain() -> None:
    deep: Any = 1
    for _ in range(MAX_PLAIN_DEPTH):
        deep = [deep]
    assert is_plain(deep)
    assert not is_plain([deep])
