"""The messages of `LeaseAgent`s to one another: small frozen values and their codec.

Every message goes to one member, point to point (swim's `send_app`: its own datagram or
TCP frame, never relayed or gossiped), so the packet envelope around it already proves
who sent it: an Ed25519 signature by the sender's enrolled key, over the whole packet,
addressed to the recipient, fresh and not replayed (`overlay.auth`). The message carries
no signature and no sender of its own: its sender is the `App`'s source, which swim's
core binds to the envelope's verified signer (an `App` naming another source is dropped
and counted, `app_refused_sender`), so no message can speak in another member's name.
Layout (msgpack, append-only): ``[VERSION, type, body]``. Task ids travel as their 16 raw
bytes. Versions 1 (a signature inside) and 2 (a `sender` inside) are refused as a bad
envelope.
"""

from __future__ import annotations

import enum
from typing import Any, Final

import attrs
import msgpack

from ._cancel import OperatorProof
from ._spec import NODE_ID_CHARS_MAX, TASK_ID_CHARS, TaskSpec
from .grants import EPOCH_MAX, Ended, Refusal
from .wire import DecodeError

__all__ = [
    "MESSAGE_BYTES_MAX",
    "AgentMessage",
    "Finish",
    "FinishAnswer",
    "GrantAnswer",
    "GrantRequest",
    "Offer",
    "OfferAck",
    "Own",
    "Renew",
    "RenewAnswer",
    "RenewDigest",
    "SpecWanted",
    "decode",
    "encode",
]

VERSION: Final = 3
#: Largest encoded message (a spec with a 4 KiB command and a 4 KiB env fits).
MESSAGE_BYTES_MAX: Final = 64 * 1024
#: Leases named in one renewal at most (an owner holding more sends several).
RENEW_LEASES_MAX: Final = 2048
#: Bytes of a renewal digest (`renewals.lease_digest`).
RENEW_DIGEST_BYTES: Final = 16
_SPEC_SIG_BYTES: Final = 64
#: Failed epochs a message may report (the retry limit is at most 8).
FAILURES_MAX: Final = 64


@attrs.frozen
class Offer:
    """Accepting node -> replica: keep this task (persist, then `OfferAck`)."""

    spec: TaskSpec
    spec_signature: bytes


@attrs.frozen
class OfferAck:
    task_id: str


@attrs.frozen
class GrantRequest:
    """Proposer -> replica: grant `epoch` of the task to `owner`."""

    task_id: str
    epoch: int
    owner: str


@attrs.frozen
class GrantAnswer:
    """Replica -> proposer: granted (`refusal` 0) or why not, with what it holds."""

    task_id: str
    epoch: int
    owner: str
    refusal: int
    held_epoch: int
    live_for: float  # seconds the current lease stays live at the granter
    failures: int  # failed epochs the granter knows of


@attrs.frozen
class Own:
    """Proposer -> owner: a majority granted you `epoch`; renew, then start."""

    task_id: str
    epoch: int
    spec: TaskSpec
    spec_signature: bytes
    failures: int  # the most any granting replica knew of


@attrs.frozen
class Renew:
    """Owner -> replica: one round of renewals of every lease it holds there."""

    seq: int
    leases: tuple[tuple[str, int], ...]


@attrs.frozen
class RenewDigest:
    """Owner -> replica: renew the `count` leases you granted me whose (task, epoch)
    pairs hash to `digest` (the same set the replica renewed in full before).

    A `quiet` digest is answered only when it misses: the owner counts on the answers of
    other replicas for its majority this round (`renewals.answering`)."""

    seq: int
    count: int
    digest: bytes
    quiet: bool = False


@attrs.frozen
class RenewAnswer:
    """Replica -> owner: every lease of round `seq` renewed except `refused`; or, for a
    `RenewDigest` whose set differs here, `missed` and nothing renewed."""

    seq: int
    refused: tuple[tuple[str, int], ...]  # (task id, Refusal)
    missed: bool = False


@attrs.frozen
class Finish:
    """Owner (or a canceller) -> replica: how `epoch` ended. A cancel by a node other
    than the accepting one carries an `operator` proof (`_cancel.py`)."""

    task_id: str
    epoch: int
    ended: Ended
    failures: int = 0  # failed epochs, this one included (the owner's count)
    operator: OperatorProof | None = None  # a fifth element, only when present


@attrs.frozen
class FinishAnswer:
    task_id: str
    epoch: int
    ended: Ended
    refusal: int
    final: Ended  # what the granter holds now (NO unless the task is final there)


@attrs.frozen
class SpecWanted:
    """Replica -> proposer: I do not hold this task's spec; send me an `Offer`."""

    task_id: str


AgentMessage = (
    Offer | OfferAck | GrantRequest | GrantAnswer | Own | Renew | RenewAnswer | Finish
    | FinishAnswer | SpecWanted | RenewDigest
)  # fmt: skip


class _Type(enum.IntEnum):
    OFFER = 1
    OFFER_ACK = 2
    GRANT_REQUEST = 3
    GRANT_ANSWER = 4
    OWN = 5
    RENEW = 6
    RENEW_ANSWER = 7
    FINISH = 8
    FINISH_ANSWER = 9
    SPEC_WANTED = 10
    RENEW_DIGEST = 11


def _tid(task_id: str) -> bytes:
    return bytes.fromhex(task_id)


def _body(msg: AgentMessage) -> tuple[_Type, list[Any]]:
    match msg:
        case Offer(spec, sig):
            return _Type.OFFER, [spec.to_wire(), sig]
        case OfferAck(tid):
            return _Type.OFFER_ACK, [_tid(tid)]
        case GrantRequest(tid, epoch, owner):
            return _Type.GRANT_REQUEST, [_tid(tid), epoch, owner]
        case GrantAnswer(tid, epoch, owner, refusal, held, live, failures):
            body = [_tid(tid), epoch, owner, refusal, held, float(live), failures]
            return _Type.GRANT_ANSWER, body
        case Own(tid, epoch, spec, sig, failures):
            return _Type.OWN, [_tid(tid), epoch, spec.to_wire(), sig, failures]
        case Renew(seq, leases):
            return _Type.RENEW, [seq, [[_tid(t), e] for t, e in leases]]
        case RenewAnswer(seq, refused, missed):
            pairs = [[_tid(t), r] for t, r in refused]
            return _Type.RENEW_ANSWER, [seq, pairs, 1] if missed else [seq, pairs]
        case RenewDigest(seq, count, digest, quiet):
            return _Type.RENEW_DIGEST, [seq, count, digest, 1] if quiet else [seq, count, digest]
        case Finish(tid, epoch, ended, failures, operator):
            body = [_tid(tid), epoch, int(ended), failures]
            return _Type.FINISH, body if operator is None else [*body, operator.to_wire()]
        case FinishAnswer(tid, epoch, ended, refusal, final):
            return _Type.FINISH_ANSWER, [_tid(tid), epoch, int(ended), refusal, int(final)]
        case SpecWanted(tid):
            return _Type.SPEC_WANTED, [_tid(tid)]
    raise TypeError(f"not an agent message: {msg!r}")  # pragma: no cover


def encode(msg: AgentMessage) -> bytes:
    """The message, ready to send to one member inside our signed envelope."""
    kind, body = _body(msg)
    return msgpack.packb([VERSION, int(kind), body], use_bin_type=True)  # type: ignore[no-any-return]


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise DecodeError(what)


def _task(v: Any) -> str:
    _need(type(v) is bytes and len(v) == TASK_ID_CHARS // 2, "bad task id")
    return str(v.hex())


def _epoch(v: Any) -> int:
    _need(type(v) is int and 0 <= v <= EPOCH_MAX, "bad epoch")
    return int(v)


def _count(v: Any) -> int:
    _need(type(v) is int and 0 <= v <= FAILURES_MAX, "bad failure count")
    return int(v)


def _node(v: Any) -> str:
    _need(isinstance(v, str) and 0 < len(v) <= NODE_ID_CHARS_MAX, "bad node id")
    return str(v)


def _enum(cls: type[enum.IntEnum], v: Any, zero: bool = False) -> int:
    _need(type(v) is int, "bad code")
    _need((zero and v == 0) or v in cls._value2member_map_, "unknown code")
    return int(v)


def _spec(raw: Any, sig: Any) -> tuple[TaskSpec, bytes]:
    _need(type(sig) is bytes and len(sig) == _SPEC_SIG_BYTES, "bad spec signature")
    try:
        return TaskSpec.from_wire(raw), sig
    except (ValueError, TypeError, KeyError) as exc:
        raise DecodeError(f"bad spec: {exc}") from None


def _operator(raw: Any) -> OperatorProof:
    try:
        return OperatorProof.from_wire(raw)
    except ValueError as exc:
        raise DecodeError(f"bad operator proof: {exc}") from None


def _pairs(raw: Any, code: type[enum.IntEnum] | None) -> tuple[tuple[str, int], ...]:
    _need(isinstance(raw, list) and len(raw) <= RENEW_LEASES_MAX, "bad lease list")
    out = []
    for item in raw:
        _need(isinstance(item, list) and len(item) == 2, "bad lease item")
        value = _epoch(item[1]) if code is None else _enum(code, item[1])
        out.append((_task(item[0]), value))
    return tuple(out)


def _message(kind: int, b: list[Any]) -> AgentMessage:
    n = len(b)
    match kind:
        case _Type.OFFER if n == 2:
            return Offer(*_spec(b[0], b[1]))
        case _Type.OFFER_ACK if n == 1:
            return OfferAck(_task(b[0]))
        case _Type.GRANT_REQUEST if n == 3:
            return GrantRequest(_task(b[0]), _epoch(b[1]), _node(b[2]))
        case _Type.GRANT_ANSWER if n == 7:
            _need(isinstance(b[5], float) and 0.0 <= b[5] <= 1e6, "bad wait")
            return GrantAnswer(_task(b[0]), _epoch(b[1]), _node(b[2]),
                               _enum(Refusal, b[3], zero=True), _epoch(b[4]), b[5],
                               _count(b[6]))  # fmt: skip
        case _Type.OWN if n == 5:
            return Own(_task(b[0]), _epoch(b[1]), *_spec(b[2], b[3]), _count(b[4]))
        case _Type.RENEW if n == 2:
            _need(type(b[0]) is int and 0 <= b[0] <= EPOCH_MAX, "bad seq")
            return Renew(b[0], _pairs(b[1], None))
        case _Type.RENEW_ANSWER if n in (2, 3):
            _need(type(b[0]) is int and 0 <= b[0] <= EPOCH_MAX, "bad seq")
            _need(n == 2 or (type(b[2]) is int and b[2] == 1), "bad missed flag")
            return RenewAnswer(b[0], _pairs(b[1], Refusal), n == 3)
        case _Type.RENEW_DIGEST if n in (3, 4):
            _need(type(b[0]) is int and 0 <= b[0] <= EPOCH_MAX, "bad seq")
            _need(type(b[1]) is int and 0 < b[1] <= RENEW_LEASES_MAX, "bad lease count")
            _need(type(b[2]) is bytes and len(b[2]) == RENEW_DIGEST_BYTES, "bad digest")
            _need(n == 3 or (type(b[3]) is int and b[3] == 1), "bad quiet flag")
            return RenewDigest(b[0], b[1], b[2], n == 4)
        case _Type.FINISH if n in (4, 5):
            ended = Ended(_enum(Ended, b[2]))
            proof = _operator(b[4]) if n == 5 else None
            _need(proof is None or ended is Ended.CANCELLED, "an operator proof is for a cancel")
            _need(ended not in (Ended.NO, Ended.CANCELLING), "not an end anyone posts")
            return Finish(_task(b[0]), _epoch(b[1]), ended, _count(b[3]), proof)
        case _Type.FINISH_ANSWER if n == 5:
            ended, final = Ended(_enum(Ended, b[2])), Ended(_enum(Ended, b[4]))
            return FinishAnswer(_task(b[0]), _epoch(b[1]), ended, _enum(Refusal, b[3], True), final)
        case _Type.SPEC_WANTED if n == 1:
            return SpecWanted(_task(b[0]))
    raise DecodeError("unknown message type or layout")


def decode(data: bytes) -> AgentMessage:
    """The message in `data`; `DecodeError` for junk. Its sender is the packet's
    verified signer, which the caller knows."""
    _need(len(data) <= MESSAGE_BYTES_MAX, "message too large")
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=len(data))
    except (ValueError, msgpack.UnpackException) as exc:
        raise DecodeError(f"not msgpack: {exc}") from None
    _need(isinstance(raw, list) and len(raw) == 3 and raw[0] == VERSION, "bad envelope")
    _, kind, body = raw
    _need(type(kind) is int and isinstance(body, list), "bad envelope")
    return _message(kind, body)
