"""The lease table's wire format: versioned msgpack, separate from the state machine.

Every message is ``[VERSION, MessageType, body]``. Decoding checks sizes before
unpacking, checks every field's type and bound, and recomputes each spec's task id; any
mismatch raises one `DecodeError`, which the table counts and drops.
"""

from __future__ import annotations

import enum
import itertools
import re
from typing import Any

import msgpack

from ._cancel import OperatorProof
from ._entry import (
    EPOCH_MAX,
    EXPLANATION_CHARS_MAX,
    HISTORY_EPOCHS_MAX,
    OUTPUT_HOLDERS_MAX,
    OUTPUT_TAIL_MAX,
    RANK_MAX,
    RENEWALS_MAX,
    SIGNATURE_BYTES_MAX,
    Cancel,
    Checkpoint,
    ClaimRecord,
    Phase,
    TaskEntry,
    TaskOutput,
    TaskResult,
)
from ._spec import NODE_ID_CHARS_MAX, OUTPUTS_MAX, TASK_ID_CHARS, TaskSpec, task_id_of

VERSION = 1
#: Largest delta (one gossip payload, a few entries); a submit with a full spec fits.
DELTA_BYTES_MAX = 64 * 1024
#: Largest anti-entropy payload (digest, summary or a batch of entries).
STATE_BYTES_MAX = 32 * 1024 * 1024
#: Entries in one message.
ENTRIES_PER_MESSAGE_MAX = 200_000
_TASK_ID = re.compile(rb"[0-9a-f]{%d}" % TASK_ID_CHARS)


class MessageType(enum.IntEnum):
    """ONLY APPEND; values are part of the protocol."""

    ENTRIES = 1  # a delta or a batch of entries: merge each
    DIGEST = 2  # anti-entropy step 1: per-bucket hashes
    SUMMARY = 3  # step 2: (id prefix, entry hash) for each entry of the differing buckets
    PUSH_WANT = 4  # step 3: entries the peer lacks, and ids we want back


class DecodeError(ValueError):
    """Bytes that are not a valid lease message: a remote error, dropped and counted."""


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def entry_to_wire(entry: TaskEntry) -> list[Any]:
    """Five elements, and the checkpoint as a sixth only when there is one (entries
    without one keep their bytes, hashes and stored form)."""
    out = [
        entry.task_id,
        None if entry.spec is None else entry.spec.to_wire(),
        entry.spec_signature,
        [c.to_wire() for c in entry.claims],
        None if entry.cancel is None else _cancel_to_wire(entry.cancel),
    ]
    return out if entry.checkpoint is None else [*out, entry.checkpoint.to_wire()]


def _cancel_to_wire(cancel: Cancel) -> list[Any]:
    """``[by, signature]``, and the operator proof as a third element when present."""
    out: list[Any] = [cancel.by, cancel.signature]
    return out if cancel.operator is None else [*out, cancel.operator.to_wire()]


def encode_entry(entry: TaskEntry) -> bytes:
    """The canonical bytes of one entry (also its stored form and hash input)."""
    return _pack(entry_to_wire(entry))


def encode_message(kind: MessageType, body: Any) -> bytes:
    return _pack([VERSION, int(kind), body])


def encode_entries(entries: list[TaskEntry]) -> bytes:
    return encode_message(MessageType.ENTRIES, [entry_to_wire(e) for e in entries])


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise DecodeError(what)


def _node_id(v: Any) -> str:
    _need(isinstance(v, str) and 0 < len(v) <= NODE_ID_CHARS_MAX, "bad node id")
    return str(v)


def _sig(v: Any) -> bytes:
    _need(isinstance(v, bytes) and len(v) <= SIGNATURE_BYTES_MAX, "bad signature")
    return bytes(v)


def _int(v: Any, hi: int) -> int:
    _need(type(v) is int and 0 <= v <= hi, "bad integer")
    return int(v)


def task_id_from_wire(v: Any) -> str:
    _need(isinstance(v, str) and _TASK_ID.fullmatch(v.encode()) is not None, "bad task id")
    return str(v)


def _outputs(raw: Any) -> tuple[list[TaskOutput], list[str]]:
    """A result's seventh element: ``[[[path, sha256, size, unpack], ...], holders]``."""
    _need(isinstance(raw, list) and len(raw) == 2, "bad outputs layout")
    outputs, holders = raw
    _need(isinstance(outputs, list) and 0 < len(outputs) <= OUTPUTS_MAX, "bad outputs")
    _need(isinstance(holders, list) and 0 < len(holders) <= OUTPUT_HOLDERS_MAX, "bad holders")
    _need(all(isinstance(o, list) and len(o) == 4 for o in outputs), "bad output")
    _need(all(isinstance(h, str) and 0 < len(h) <= NODE_ID_CHARS_MAX for h in holders),
          "bad holder")  # fmt: skip
    try:
        return [TaskOutput(*o) for o in outputs], holders
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"bad output: {exc}") from None


def _result(raw: Any) -> TaskResult:
    _need(isinstance(raw, list) and len(raw) in (5, 6, 7), "bad result layout")
    code, tail, duration, fault, sig = raw[:5]
    # `final` is a sixth element only when true or when outputs follow: one encoding.
    _need(len(raw) == 5 or raw[5] is True or (len(raw) == 7 and raw[5] is False), "bad final")
    outputs, holders = _outputs(raw[6]) if len(raw) == 7 else ([], [])
    _need(type(code) is int and -(1 << 31) <= code < (1 << 31), "bad exit code")
    _need(isinstance(tail, bytes) and len(tail) <= OUTPUT_TAIL_MAX, "bad output tail")
    _need(isinstance(duration, float) and 0 <= duration <= 1e9, "bad duration")
    _need(isinstance(fault, bool), "bad node_fault")
    final = len(raw) > 5 and raw[5] is True
    return TaskResult(code, tail, duration, fault, _sig(sig), final, outputs, holders)


def _claim(raw: Any) -> ClaimRecord:
    _need(isinstance(raw, list) and len(raw) in (9, 10), "bad claim layout")
    # 9 fields: written before `failures_before` existed (a store on disk); it was 0.
    epoch, rank, owner, sig, expl, phase, renewals, result, progress_sig = raw[:9]
    failures_before = raw[9] if len(raw) == 10 else 0
    _need(isinstance(expl, str) and len(expl) <= EXPLANATION_CHARS_MAX, "bad explanation")
    _need(type(phase) is int and phase in Phase._value2member_map_, "bad phase")
    ph = Phase(phase)
    res = None if result is None else _result(result)
    _need((res is not None) == (ph in (Phase.FAILED, Phase.SUCCEEDED)), "result/phase mismatch")
    return ClaimRecord(
        _int(epoch, EPOCH_MAX),
        _int(rank, RANK_MAX),
        _node_id(owner),
        _sig(sig),
        expl,
        ph,
        _int(renewals, RENEWALS_MAX),
        res,
        _sig(progress_sig),
        _int(failures_before, EPOCH_MAX),
    )


def _checkpoint(raw: Any) -> Checkpoint:
    """An entry's sixth element: ``[epoch, seq, owner, sha256, size, holders, taken_in,
    signature]``."""
    _need(isinstance(raw, list) and len(raw) == 8, "bad checkpoint layout")
    epoch, seq, owner, sha, size, holders, taken_in, sig = raw
    _need(isinstance(sha, str) and isinstance(holders, list), "bad checkpoint")
    _need(len(holders) <= OUTPUT_HOLDERS_MAX, "bad checkpoint holders")
    try:
        return Checkpoint(
            _int(epoch, EPOCH_MAX), _int(seq, RENEWALS_MAX), _node_id(owner), sha,
            _int(size, 1 << 50), tuple(_node_id(h) for h in holders), _int(taken_in, EPOCH_MAX),
            _sig(sig),
        )  # fmt: skip
    except ValueError as exc:
        raise DecodeError(f"bad checkpoint: {exc}") from None


def entry_from_wire(raw: Any) -> TaskEntry:
    """Validate and rebuild one entry; raises `DecodeError`."""
    _need(isinstance(raw, list) and len(raw) in (5, 6), "bad entry layout")
    tid_raw, spec_raw, spec_sig, claims_raw, cancel_raw = raw[:5]
    checkpoint = _checkpoint(raw[5]) if len(raw) == 6 else None
    tid = task_id_from_wire(tid_raw)
    spec = None
    if spec_raw is not None:
        try:
            spec = TaskSpec.from_wire(spec_raw)
        except (ValueError, TypeError, KeyError) as exc:
            raise DecodeError(f"bad spec: {exc}") from None
        _need(task_id_of(spec.canonical()) == tid, "spec does not hash to its task id")
    _need(isinstance(claims_raw, list) and len(claims_raw) <= HISTORY_EPOCHS_MAX, "bad claims")
    claims = tuple(_claim(c) for c in claims_raw)
    _need(
        all(a.epoch < b.epoch for a, b in itertools.pairwise(claims)),
        "claims not in ascending epochs",
    )
    cancel = None
    if cancel_raw is not None:
        _need(isinstance(cancel_raw, list) and len(cancel_raw) in (2, 3), "bad cancel")
        proof = None
        if len(cancel_raw) == 3:
            try:
                proof = OperatorProof.from_wire(cancel_raw[2])
            except ValueError as exc:
                raise DecodeError(f"bad cancel: {exc}") from None
        cancel = Cancel(_node_id(cancel_raw[0]), _sig(cancel_raw[1]), proof)
    spec_sig = _sig(spec_sig) if spec is not None else b""
    return TaskEntry(tid, spec, spec_sig, claims, cancel, checkpoint)


def decode_message(data: bytes, size_max: int = STATE_BYTES_MAX) -> tuple[MessageType, Any]:
    """Split a message into its type and (unvalidated) body; raises `DecodeError`."""
    _need(isinstance(data, bytes | bytearray) and 0 < len(data) <= size_max, "bad size")
    try:
        raw = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_array_len=ENTRIES_PER_MESSAGE_MAX,
            max_map_len=1024,
        )
    except Exception as exc:  # msgpack raises many types on junk
        raise DecodeError(f"not msgpack: {type(exc).__name__}") from None
    _need(isinstance(raw, list) and len(raw) == 3, "bad envelope")
    _need(raw[0] == VERSION, f"unsupported version {raw[0]!r}")
    _need(type(raw[1]) is int and raw[1] in MessageType._value2member_map_, "bad type")
    return MessageType(raw[1]), raw[2]


def decode_entries(body: Any) -> list[TaskEntry]:
    _need(isinstance(body, list), "bad entries body")
    return [entry_from_wire(e) for e in body]
