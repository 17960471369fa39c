"""Canonical msgpack and signed blobs: the one codec under certificates, revocations, records.

Every signed object in populi is ``body || signature``: `body` is canonical msgpack (a
fixed-layout array whose first element is a format version; maps inside it have sorted
keys), `signature` is the last 64 bytes, an Ed25519 signature over a per-purpose context
string followed by `body` (see `identity.verify_signature`). Verifiers check the
signature over the exact bytes received before decoding anything, so a decoder bug can
never be reached by an unsigned input, and canonical encoding means one object has one
byte string (stable sizes, stable cache keys).
"""

from __future__ import annotations

from typing import Any

import msgpack

from .identity import SIGNATURE_BYTES

__all__ = ["CodecError", "is_plain", "pack_canonical", "split_signed", "unpack_strict"]

#: Nesting allowed inside opaque values (the GPU report): deeper is malformed.
MAX_PLAIN_DEPTH = 8


class CodecError(ValueError):
    """Bytes that are not the msgpack we expect: always a malformed input, never our bug."""


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if type(value) in (list, tuple):  # not namedtuples such as msgpack.ExtType
        return [_sorted(v) for v in value]
    return value


def pack_canonical(value: Any) -> bytes:
    """Pack `value` with every map's keys sorted, so equal values give equal bytes."""
    return msgpack.packb(_sorted(value), use_bin_type=True)  # type: ignore[no-any-return]


def unpack_strict(data: bytes) -> Any:
    """Unpack exactly one msgpack value with str map keys and no trailing bytes.

    Raises:
        CodecError: anything msgpack rejects (truncated, trailing data, bad type, too deep).
    """
    try:
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise CodecError(f"undecodable msgpack: {type(exc).__name__}") from None


def split_signed(blob: bytes) -> tuple[bytes, bytes]:
    """Split ``body || signature`` into its two parts.

    Raises:
        CodecError: too short to hold a signature and a body.
    """
    if len(blob) <= SIGNATURE_BYTES:
        raise CodecError(f"a signed blob is longer than {SIGNATURE_BYTES} bytes")
    return blob[:-SIGNATURE_BYTES], blob[-SIGNATURE_BYTES:]


def is_plain(value: Any, depth: int = 0) -> bool:
    """Whether `value` is plain data: nil, bool, int, float, str, bytes, lists, str-keyed maps.

    Used to vet opaque slots (the GPU report) so a record never carries msgpack
    extension types or absurd nesting.
    """
    if depth > MAX_PLAIN_DEPTH:
        return False
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return True
    if isinstance(value, list):
        return all(is_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v, depth + 1) for k, v in value.items())
    return False
