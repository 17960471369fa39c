"""NodeRecord: what a node says about itself, signed so that nobody else can say it.

A record travels as the member metadata of the swim core, so every node relays every
other node's record. Relaying must not let a relay (or anybody on the path) change it:
the record is signed by the node's own key, carries the node's enrollment certificate,
and is verified on every receipt by `RecordBook`. Its `sequence` orders a node's records
(higher wins), so an old record cannot be replayed over a newer one.

Sequence numbers must grow across restarts, but a record is not worth a disk write
per change: `next_sequence` seeds the sequence from realtime milliseconds, so a
restarted node's first record already outranks everything it signed before (unless its
clock stepped back further than its uptime; then its records are ignored until the
clock catches up, and the daemon may persist the last sequence to close that gap).

Wire format (`SignedNodeRecord.raw`): ``body || signature``, `body` the canonical
msgpack array below, the signature by `public_key` over ``b"populi/record/v1" + body``::

    [1, node_id, public_key, name, address, port, software_version, protocol_version,
     started_at, sequence, status, cpu_cores, ram_bytes, gpu|nil, labels, certificate
     (, sections)]

`sections` (optional, appended later; absent when empty, so a record without it is
byte-for-byte what older code signs) is a map from a section name to a plain msgpack
map: facts a service observed, e.g. ``"peer"`` (the peer API's port) and ``"models"``
(the inference engines' models). Every section is covered by the signature.

`status` is an index into `NODE_STATUSES` (ONLY APPEND); `gpu` is the GPU report, a
plain msgpack map or nil; `labels` a str-to-str map. Sizes are in docs/security.md.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from ._codec import CodecError, is_plain, pack_canonical, split_signed, unpack_strict
from ._keyfiles import KEY_BYTES
from .identity import NODE_ID_LENGTH, NodeIdentity, node_id_from_public_key, verify_signature

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "NODE_STATUSES",
    "Capabilities",
    "NodeRecord",
    "NodeStatus",
    "RecordError",
    "RecordReason",
    "SignedNodeRecord",
    "next_sequence",
]

#: The swim core's default member-metadata limit, which a signed record must fit in.
DEFAULT_MAX_RECORD_BYTES: Final = 4096
#: The only record format version this code reads. ONLY APPEND new versions.
RECORD_VERSION: Final = 1
#: Signature context: see `identity.verify_signature`.
RECORD_CONTEXT: Final = b"populi/record/v1"
#: Limits on what a node may say about itself; a record over them is malformed.
MAX_NAME_LENGTH: Final = 64
MAX_ADDRESS_LENGTH: Final = 255
MAX_VERSION_LENGTH: Final = 64
MAX_LABELS: Final = 32
MAX_LABEL_KEY_LENGTH: Final = 64
MAX_LABEL_VALUE_LENGTH: Final = 256
_FIELDS: Final = 16
#: With the optional `sections` map appended.
_FIELDS_WITH_SECTIONS: Final = 17
MAX_SECTIONS: Final = 16

RecordReason = Literal[
    "malformed",
    "too_large",
    "bad_signature",
    "key_mismatch",
    "bad_certificate",
    "revoked",
    "stale_sequence",
    "full",
]


class RecordError(Exception):
    """A record was refused; `reason` is one of `RecordReason`, `str()` says more."""

    def __init__(
        self, reason: RecordReason, detail: str, *, certificate_reason: str | None = None
    ) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: RecordReason = reason
        #: For `bad_certificate`: the certificate's own reason (`wrong_authority`,
        #: `expired`, ...; see `certificate.CertificateReason`).
        self.certificate_reason = certificate_reason


class NodeStatus(enum.Enum):
    """What a node says it is up for. Advice for schedulers, not membership state."""

    AVAILABLE = "available"
    BUSY = "busy"
    DEGRADED = "degraded"
    DRAINING = "draining"


#: Wire codes of `NodeStatus`: the index in this tuple. ONLY APPEND.
NODE_STATUSES: Final[tuple[NodeStatus, ...]] = (
    NodeStatus.AVAILABLE,
    NodeStatus.BUSY,
    NodeStatus.DEGRADED,
    NodeStatus.DRAINING,
)
_STATUS_CODES: Final = {status: code for code, status in enumerate(NODE_STATUSES)}


def next_sequence(previous: int | None, now_real: float) -> int:
    """The sequence number for a node's next record: realtime ms, and always above `previous`.

    Args:
        previous: the sequence of the node's last record in this run (None at start), or
            one the daemon persisted.
        now_real: realtime, Unix seconds.
    """
    seeded = int(now_real * 1000)
    return seeded if previous is None else max(previous + 1, seeded)


def _plain_gpu(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Normalise the GPU report to what decoding gives back (tuples become lists)."""
    if value is None:
        return None
    try:
        normalised = unpack_strict(pack_canonical(dict(value)))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"the gpu report is not msgpack data: {exc}") from None
    if not (isinstance(normalised, dict) and is_plain(normalised)):
        raise ValueError("the gpu report must be a map of plain msgpack data (no extension types)")
    return normalised


def _check_str(name: str, value: object, limit: int) -> None:
    if not isinstance(value, str) or len(value) > limit:
        raise ValueError(f"{name} must be a string of at most {limit} characters")


def _check_text(name: str, value: object, limit: int) -> None:
    """A string shown to people (a name, a label): within `limit`, and printable.

    `str.isprintable` refuses every control character (C0, DEL, C1), format characters
    such as the bidi overrides (U+202A-U+202E, U+2066-U+2069) and zero-width ones, line
    and paragraph separators (U+2028, U+2029), and every space but U+0020: what would
    let a member's own signed record move a terminal's cursor, recolour it, start a new
    table row or reorder what is shown.
    """
    if not isinstance(value, str) or len(value) > limit:
        raise ValueError(f"{name} must be a string of at most {limit} characters")
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise ValueError(
            f"{name} must be printable text: U+{ord(bad):04X} at {value.index(bad)} is a"
            " control, format or separator character"
        )


def _label_dict(value: Mapping[str, str]) -> dict[str, str]:
    return dict(value)


def _plain_sections(value: Mapping[str, Any]) -> dict[str, Any]:
    """Normalise the sections to what decoding gives back; each must be a plain map."""
    if not value:
        return {}
    try:
        normalised = unpack_strict(pack_canonical(dict(value)))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"the record sections are not msgpack data: {exc}") from None
    if not (isinstance(normalised, dict) and is_plain(normalised)):
        raise ValueError("the record sections must be plain msgpack data")
    if len(normalised) > MAX_SECTIONS:
        raise ValueError(f"at most {MAX_SECTIONS} record sections")
    for key, section in normalised.items():
        if not (isinstance(key, str) and 0 < len(key) <= MAX_LABEL_KEY_LENGTH):
            raise ValueError("a section name is a non-empty string")
        _check_text("a section name", key, MAX_LABEL_KEY_LENGTH)
        if not isinstance(section, dict):
            raise ValueError(f"section {key!r} is not a map")
    return dict(normalised)


@attrs.frozen
class Capabilities:
    """What the machine has: CPU cores, RAM, and the GPU engineer's report (opaque here)."""

    cpu_cores: int
    ram_bytes: int
    #: The GPU report: plain msgpack data (str keys), or None before/without GPUs.
    gpu: dict[str, Any] | None = attrs.field(default=None, converter=_plain_gpu)

    def __attrs_post_init__(self) -> None:
        if type(self.cpu_cores) is not int or type(self.ram_bytes) is not int:
            raise ValueError("cpu_cores and ram_bytes are integers")
        if self.cpu_cores < 0 or self.ram_bytes < 0:
            raise ValueError("cpu_cores and ram_bytes are not negative")


@attrs.frozen
class NodeRecord:
    """One node's self-description. Sign it with `sign`; verify with `SignedNodeRecord`.

    `started_at` is realtime (Unix seconds) passed in by the daemon; `sequence` comes
    from `next_sequence`; `certificate` is the node's enrollment certificate bytes.
    Construction validates every field, so an invalid record cannot be signed.
    """

    node_id: str
    public_key: bytes
    name: str
    address: str
    port: int
    software_version: str
    protocol_version: int
    started_at: float
    sequence: int
    status: NodeStatus
    capabilities: Capabilities
    labels: Mapping[str, str] = attrs.field(factory=dict, converter=_label_dict)
    certificate: bytes = b""
    #: Observed facts by section name (see the module docstring); empty: none.
    sections: Mapping[str, Any] = attrs.field(factory=dict, converter=_plain_sections)

    def __attrs_post_init__(self) -> None:
        if len(self.public_key) != KEY_BYTES:
            raise ValueError(f"a public key is {KEY_BYTES} bytes")
        if self.node_id != node_id_from_public_key(self.public_key):
            raise ValueError("node_id is not the id of public_key")
        _check_text("name", self.name, MAX_NAME_LENGTH)
        _check_text("address", self.address, MAX_ADDRESS_LENGTH)
        _check_text("software_version", self.software_version, MAX_VERSION_LENGTH)
        if type(self.port) is not int or not 0 <= self.port <= 0xFFFF:
            raise ValueError("port must be an integer in 0..65535")
        if type(self.protocol_version) is not int or self.protocol_version < 0:
            raise ValueError("protocol_version must be a non-negative integer")
        if type(self.sequence) is not int or self.sequence < 0:
            raise ValueError("sequence must be a non-negative integer")
        if not isinstance(self.started_at, float | int) or isinstance(self.started_at, bool):
            raise ValueError("started_at must be a number (Unix seconds)")
        if not isinstance(self.status, NodeStatus):
            raise ValueError("status must be a NodeStatus")
        if len(self.labels) > MAX_LABELS:
            raise ValueError(f"at most {MAX_LABELS} labels")
        for key, value in self.labels.items():
            _check_text("a label key", key, MAX_LABEL_KEY_LENGTH)
            _check_text("a label value", value, MAX_LABEL_VALUE_LENGTH)
            if not key:
                raise ValueError("a label key is not empty")
        if not isinstance(self.certificate, bytes):
            raise ValueError("certificate must be bytes")

    def encode_body(self) -> bytes:
        """The canonical body that the node signs (see the module docstring)."""
        caps = self.capabilities
        sections = [dict(self.sections)] if self.sections else []
        return pack_canonical(
            [
                RECORD_VERSION,
                self.node_id,
                self.public_key,
                self.name,
                self.address,
                self.port,
                self.software_version,
                self.protocol_version,
                float(self.started_at),
                self.sequence,
                _STATUS_CODES[self.status],
                caps.cpu_cores,
                caps.ram_bytes,
                caps.gpu,
                dict(self.labels),
                self.certificate,
                *sections,
            ]
        )

    def sign(
        self, identity: NodeIdentity, *, max_bytes: int = DEFAULT_MAX_RECORD_BYTES
    ) -> SignedNodeRecord:
        """Sign this record with the node's own key.

        Raises:
            ValueError: `identity` is not this record's key, or the signed record would
                exceed `max_bytes` (shrink the GPU report or the labels).
        """
        if identity.public_key != self.public_key:
            raise ValueError("a record can only be signed by its own node's key")
        body = self.encode_body()
        raw = body + identity.sign(RECORD_CONTEXT, body)
        if len(raw) > max_bytes:
            raise ValueError(f"the signed record is {len(raw)} bytes, over the {max_bytes} limit")
        return SignedNodeRecord(self, raw)


def _decode_body(body: bytes) -> NodeRecord:
    try:
        fields = unpack_strict(body)
    except CodecError as exc:
        raise RecordError("malformed", str(exc)) from None
    if not (isinstance(fields, list) and len(fields) in (_FIELDS, _FIELDS_WITH_SECTIONS)):
        raise RecordError("malformed", f"a record body is a {_FIELDS}-element array")
    sections: Any = {}
    if len(fields) == _FIELDS_WITH_SECTIONS:
        sections = fields.pop()
        # Present means non-empty: one record, one encoding.
        if not (isinstance(sections, dict) and sections):
            raise RecordError("malformed", "sections, when present, is a non-empty map")
    (version, node_id, public_key, name, address, port, software_version, protocol_version,
     started_at, sequence, status, cpu_cores, ram_bytes, gpu, labels, certificate) = fields  # fmt: skip  # noqa: E501
    if type(version) is not int or version != RECORD_VERSION:
        raise RecordError("malformed", f"unknown record version {version!r}")
    if not (isinstance(public_key, bytes) and len(public_key) == KEY_BYTES):
        raise RecordError("malformed", "public_key is not a 32-byte string")
    if not (isinstance(node_id, str) and len(node_id) == NODE_ID_LENGTH):
        raise RecordError("malformed", "node_id is not a node id")
    if type(status) is not int or not 0 <= status < len(NODE_STATUSES):
        raise RecordError("malformed", f"unknown status code {status!r}")
    if not (isinstance(labels, dict) and (gpu is None or isinstance(gpu, dict))):
        raise RecordError("malformed", "labels or gpu is not a map")
    if type(started_at) is not float:
        raise RecordError("malformed", "started_at is not a float")
    if node_id != node_id_from_public_key(public_key):
        raise RecordError("key_mismatch", f"node id {node_id} is not the id of its public key")
    try:
        return NodeRecord(
            node_id=node_id,
            public_key=public_key,
            name=name,
            address=address,
            port=port,
            software_version=software_version,
            protocol_version=protocol_version,
            started_at=started_at,
            sequence=sequence,
            status=NODE_STATUSES[status],
            capabilities=Capabilities(cpu_cores, ram_bytes, gpu),
            labels=labels,
            certificate=certificate,
            sections=sections,
        )
    except (ValueError, TypeError) as exc:
        raise RecordError("malformed", str(exc)) from None


@attrs.frozen
class SignedNodeRecord:
    """A record together with the exact signed bytes that carry it (`raw`)."""

    record: NodeRecord
    raw: bytes = attrs.field(repr=False)

    @classmethod
    def from_bytes(
        cls, data: bytes, *, max_bytes: int = DEFAULT_MAX_RECORD_BYTES
    ) -> SignedNodeRecord:
        """Check a signed record's self-consistency: size, format, key matches id, signature.

        It does *not* check the certificate or the sequence: that needs the cluster
        authority and history, which `RecordBook.accept` has.

        Raises:
            RecordError: `too_large`, `malformed`, `key_mismatch` or `bad_signature`.
        """
        if len(data) > max_bytes:
            raise RecordError("too_large", f"{len(data)} bytes, over the {max_bytes} limit")
        try:
            body, signature = split_signed(data)
        except CodecError as exc:
            raise RecordError("malformed", str(exc)) from None
        record = _decode_body(body)
        if not verify_signature(record.public_key, RECORD_CONTEXT, body, signature):
            raise RecordError("bad_signature", f"record for {record.node_id} is not signed by it")
        return cls(record, data)
