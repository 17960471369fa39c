"""Revocations signed by the cluster authority, and the grow-only set that gossips them.

Removing a machine must work without a central server and without reaching every node
at once: the operator signs a `Revocation` with the authority key and hands it to any
node; nodes gossip their `RevocationList` and merge what they hear. The list is a
grow-only set (a G-Set CRDT): merge is set union, so it is commutative, associative and
idempotent, and every node that has heard the same revocations holds the same list no
matter the order or repetition. A revocation never expires and cannot be withdrawn:
a removed machine that should come back makes a new key (delete its ``node.key``) and is
enrolled again, which also protects against a key that leaked with the machine.

A revocation names either one certificate (by serial: for example a certificate issued
with the wrong scope) or a node key (every certificate ever issued to that key), or
(appended later) one API key by its 16-byte id (`populi_p2p.inference.keys`).

Wire format, like certificates (see `certificate`): ``body || signature`` with `body`
the canonical msgpack array ``[1, authority_key_id, serial|nil, node_public_key|nil,
issued_at]`` (exactly one of serial and key set), or for an API key the 6-element
``[1, authority_key_id, nil, nil, issued_at, api_key_id]``, and the signature over
``b"populi/revocation/v1" + body``. A revocation list on the wire is a msgpack array of
such byte strings, sorted, so equal lists have equal bytes and equal `digest`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

import attrs

from ._codec import CodecError, pack_canonical, split_signed, unpack_strict
from ._keyfiles import KEY_BYTES, encode_public_key, read_armored, write_armored
from .certificate import (
    AUTHORITY_KEY_ID_BYTES,
    CertificateError,
    EnrollmentCertificate,
    authority_key_id,
)
from .identity import verify_signature

__all__ = ["Revocation", "RevocationList", "read_revocation", "write_revocation"]

#: The only revocation format version this code reads. ONLY APPEND new versions.
REVOCATION_VERSION: Final = 1
#: Signature context: see `identity.verify_signature`.
REVOCATION_CONTEXT: Final = b"populi/revocation/v1"
#: Armor label of a revocation file.
REVOCATION_LABEL: Final = "POPULI REVOCATION"
#: Bytes of an API key id.
API_KEY_ID_BYTES: Final = 16


@attrs.frozen
class Revocation:
    """One verified revocation: of certificate `serial`, or of every certificate for a key.

    Made by `ClusterAuthority.revoke` or decoded (and verified) by `from_bytes`.
    """

    authority_key_id: bytes
    serial: int | None
    node_public_key: bytes | None
    issued_at: int
    raw: bytes = attrs.field(repr=False)
    #: The API key this revokes (then `serial` and `node_public_key` are None).
    api_key_id: bytes | None = None

    @staticmethod
    def encode_body(
        authority_key_id: bytes,
        serial: int | None,
        node_public_key: bytes | None,
        issued_at: int,
        api_key_id: bytes | None = None,
    ) -> bytes:
        """The canonical body that the authority signs."""
        if api_key_id is not None:
            if serial is not None or node_public_key is not None:
                raise ValueError("an API key revocation names only the key id")
            if len(api_key_id) != API_KEY_ID_BYTES:
                raise ValueError(f"an API key id is {API_KEY_ID_BYTES} bytes")
            return pack_canonical(
                [REVOCATION_VERSION, authority_key_id, None, None, issued_at, api_key_id]
            )
        if (serial is None) == (node_public_key is None):
            raise ValueError("a revocation names exactly one of a serial and a node key")
        return pack_canonical(
            [REVOCATION_VERSION, authority_key_id, serial, node_public_key, issued_at]
        )

    @classmethod
    def from_bytes(cls, data: bytes, authority_public_key: bytes) -> Revocation:
        """Verify the authority's signature on `data` and decode it.

        Raises:
            CertificateError: `malformed`, `wrong_authority` or `bad_signature`.
        """
        try:
            body, signature = split_signed(data)
            fields = unpack_strict(body)
        except CodecError as exc:
            raise CertificateError("malformed", str(exc)) from None
        if not (isinstance(fields, list) and len(fields) in (5, 6)):
            raise CertificateError("malformed", "a revocation body is a 5-element array")
        api_key_id = fields.pop() if len(fields) == 6 else None
        version, key_id, serial, node_key, issued_at = fields
        if api_key_id is not None and not (
            isinstance(api_key_id, bytes) and len(api_key_id) == API_KEY_ID_BYTES
            and serial is None and node_key is None and type(issued_at) is int
        ):  # fmt: skip
            raise CertificateError("malformed", "an API key revocation has the wrong fields")
        if type(version) is not int or version != REVOCATION_VERSION:
            raise CertificateError("malformed", f"unknown revocation version {version!r}")
        if not (
            isinstance(key_id, bytes)
            and len(key_id) == AUTHORITY_KEY_ID_BYTES
            and (serial is None or type(serial) is int)
            and (node_key is None or (isinstance(node_key, bytes) and len(node_key) == KEY_BYTES))
            and ((serial is None) != (node_key is None) or api_key_id is not None)
            and type(issued_at) is int
        ):
            raise CertificateError("malformed", "a revocation field has the wrong type")
        if key_id != authority_key_id(authority_public_key):
            raise CertificateError("wrong_authority", "revocation from another cluster's authority")
        if not verify_signature(authority_public_key, REVOCATION_CONTEXT, body, signature):
            raise CertificateError("bad_signature", "the authority signature does not verify")
        return cls(key_id, serial, node_key, issued_at, data, api_key_id)

    def describe(self) -> str:
        """One line for logs and the CLI."""
        if self.api_key_id is not None:
            return f"revoke API key {self.api_key_id.hex()}"
        if self.node_public_key is not None:
            return f"revoke node key {encode_public_key(self.node_public_key)}"
        return f"revoke certificate serial {self.serial}"


@attrs.frozen
class RevocationList:
    """An immutable grow-only set of verified revocations for one authority.

    Build with `RevocationList()` or `RevocationList.of(...)`, grow with `merge` and
    `with_revocation` (each returns a new list), gossip with `to_bytes` / `from_bytes`.
    Lookups (`is_revoked`) are O(1).
    """

    revocations: frozenset[Revocation] = frozenset()
    _serials: frozenset[int] = attrs.field(init=False, eq=False, repr=False)
    _keys: frozenset[bytes] = attrs.field(init=False, eq=False, repr=False)
    _api_keys: frozenset[bytes] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        revs = self.revocations
        serials = frozenset(r.serial for r in revs if r.serial is not None)
        keys = frozenset(r.node_public_key for r in revs if r.node_public_key is not None)
        object.__setattr__(self, "_serials", serials)
        object.__setattr__(self, "_keys", keys)
        api_keys = frozenset(r.api_key_id for r in revs if r.api_key_id is not None)
        object.__setattr__(self, "_api_keys", api_keys)

    @classmethod
    def of(cls, revocations: Iterable[Revocation]) -> RevocationList:
        return cls(frozenset(revocations))

    def __len__(self) -> int:
        return len(self.revocations)

    def __iter__(self) -> Iterator[Revocation]:
        # Sorted, never set order: iteration must not depend on PYTHONHASHSEED.
        return iter(sorted(self.revocations, key=lambda r: r.raw))

    def merge(self, other: RevocationList) -> RevocationList:
        """The union of both lists (commutative, associative, idempotent)."""
        if other.revocations <= self.revocations:
            return self
        return RevocationList(self.revocations | other.revocations)

    def with_revocation(self, revocation: Revocation) -> RevocationList:
        """This list plus one revocation."""
        return self.merge(RevocationList(frozenset((revocation,))))

    def is_revoked(self, cert: EnrollmentCertificate) -> bool:
        """Whether `cert` is revoked, by its serial or by its node key."""
        return cert.serial in self._serials or cert.node_public_key in self._keys

    def is_key_revoked(self, node_public_key: bytes) -> bool:
        """Whether every certificate for `node_public_key` is revoked."""
        return node_public_key in self._keys

    def is_api_key_revoked(self, api_key_id: bytes) -> bool:
        """Whether the API key with this id is revoked."""
        return api_key_id in self._api_keys

    def to_bytes(self) -> bytes:
        """The list on the wire: a msgpack array of signed revocations, sorted."""
        return pack_canonical([r.raw for r in self])

    def digest(self) -> bytes:
        """16 bytes that equal lists share: peers compare digests before sending lists."""
        return hashlib.blake2b(self.to_bytes(), digest_size=16).digest()

    @classmethod
    def from_bytes(cls, data: bytes, authority_public_key: bytes) -> RevocationList:
        """Decode and verify every revocation in a gossiped list.

        All or nothing: honest nodes only relay verified revocations, so one bad entry
        means the whole message is forged or corrupt.

        Raises:
            CertificateError: the list or any entry is malformed or not signed by the
                authority.
        """
        try:
            entries = unpack_strict(data)
        except CodecError as exc:
            raise CertificateError("malformed", str(exc)) from None
        if not (isinstance(entries, list) and all(isinstance(e, bytes) for e in entries)):
            raise CertificateError("malformed", "a revocation list is an array of byte strings")
        return cls.of(Revocation.from_bytes(e, authority_public_key) for e in entries)


def write_revocation(path: Path, revocation: Revocation, *, overwrite: bool = False) -> None:
    """Write one revocation as an armored text file for the operator to hand to a node."""
    write_armored(
        path,
        REVOCATION_LABEL,
        revocation.raw,
        secret=False,
        overwrite=overwrite,
        comments=[f"populi revocation: {revocation.describe()}"],
    )


def read_revocation(path: Path, authority_public_key: bytes) -> Revocation:
    """Read and verify a revocation file.

    Raises:
        KeyFileError: missing, unreadable or not a revocation file.
        CertificateError: not a valid revocation from this authority.
    """
    return Revocation.from_bytes(
        read_armored(path, REVOCATION_LABEL, secret=False), authority_public_key
    )
