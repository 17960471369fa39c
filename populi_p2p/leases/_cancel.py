"""Who may cancel a task: the node that accepted it, or an operator of the cluster.

Why: a cancel ends a task for good, on every node, whoever asked for it. So it is
refused unless it comes from the task's accepting node (`TaskSpec.submitted_by`, the
spec's signer: where its user submitted it), or carries an `OperatorProof`: a key the
cluster authority certified in the "operator" scope (`populi-node cluster operator`),
and that key's signature over the task id and the time it signed. The granters apply
this rule to each `Finish(CANCELLED)` (`grants.on_finish`), and the lease table to each
cancel record it merges, so the table never shows a cancel the granters refuse.

This package holds no key types and reads no clock: the check of a proof (certificate,
expiry, revocation, signature) is an `OperatorCheck` the node passes in
(`populi_p2p.trust.operator.operator_checker`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import attrs
import msgpack

from ._spec import TaskSpec

__all__ = [
    "OPERATOR_CANCEL_CONTEXT",
    "OPERATOR_CERTIFICATE_BYTES_MAX",
    "OperatorCheck",
    "OperatorProof",
    "cancel_refusal_line",
    "may_cancel",
    "operator_cancel_bytes",
]

#: Signature context of an operator's cancel (never sent: see `identity.verify_signature`).
OPERATOR_CANCEL_CONTEXT: Final = b"populi/operator-cancel/v1"
#: Largest operator certificate carried (one is about 140 bytes).
OPERATOR_CERTIFICATE_BYTES_MAX: Final = 256
#: An Ed25519 signature.
OPERATOR_SIGNATURE_BYTES: Final = 64
#: Largest `signed_at` (Unix seconds): far past any real clock, well inside msgpack's int.
SIGNED_AT_MAX: Final = 1 << 40


@attrs.frozen
class OperatorProof:
    """An operator's leave to cancel one task: the authority's certificate of the
    operator key, when the operator signed (Unix seconds, its clock), and its signature
    of ``OPERATOR_CANCEL_CONTEXT + operator_cancel_bytes(task_id, signed_at)``."""

    certificate: bytes
    signed_at: int
    signature: bytes

    def to_wire(self) -> list[Any]:
        return [self.certificate, self.signed_at, self.signature]

    @classmethod
    def from_wire(cls, raw: Any) -> OperatorProof:
        """Validate types and bounds (not the signatures).

        Raises:
            ValueError: one line saying which part is wrong.
        """
        if not (isinstance(raw, list) and len(raw) == 3):
            raise ValueError("an operator proof is [certificate, signed_at, signature]")
        cert, at, sig = raw
        if not (type(cert) is bytes and 0 < len(cert) <= OPERATOR_CERTIFICATE_BYTES_MAX):
            bound = OPERATOR_CERTIFICATE_BYTES_MAX
            raise ValueError(f"an operator certificate is 1..{bound} bytes")
        if not (type(at) is int and 0 <= at <= SIGNED_AT_MAX):
            raise ValueError("an operator proof's signed_at is Unix seconds")
        if not (type(sig) is bytes and len(sig) == OPERATOR_SIGNATURE_BYTES):
            raise ValueError(f"an operator signature is {OPERATOR_SIGNATURE_BYTES} bytes")
        return cls(cert, at, sig)

    def sort_key(self) -> bytes:
        """A total order (the lease table's join picks one cancel record)."""
        return msgpack.packb(self.to_wire(), use_bin_type=True)  # type: ignore[no-any-return]


def operator_cancel_bytes(task_id: str, signed_at: int) -> bytes:
    """What an operator signs (after `OPERATOR_CANCEL_CONTEXT`) to cancel `task_id`."""
    packed: bytes = msgpack.packb([bytes.fromhex(task_id), signed_at], use_bin_type=True)
    return packed


#: ``check(task_id, proof, fresh) -> None`` when `proof` lets its holder cancel the
#: task, else why not (one line). `fresh`: a cancel decided now (a granter, the node
#: asked to cancel): the certificate must hold now and the proof be recent. Otherwise
#: (a cancel record already agreed, arriving by gossip or from disk) the certificate
#: must have held when the operator signed, and not be revoked.
OperatorCheck = Callable[[str, OperatorProof, bool], str | None]


def no_operators(_task_id: str, _proof: OperatorProof, _fresh: bool) -> str:
    """The check of a node that knows no authority (tests, the simulator)."""
    return "this node checks no operator keys"


def may_cancel(
    task_id: str,
    spec: TaskSpec | None,
    by: str,
    proof: OperatorProof | None,
    check: OperatorCheck,
    *,
    fresh: bool,
) -> str | None:
    """None when a cancel of `task_id` by node `by` (with `proof`, if any) stands; else
    why not, one line. Without the spec nobody can tell who accepted the task: only an
    operator proof stands then."""
    if spec is not None and by == spec.submitted_by:
        return None
    if proof is None:
        return "not the accepting node, and no operator key"
    return check(task_id, proof, fresh)


def cancel_refusal_line(task_id: str, spec: TaskSpec, detail: str | None = None) -> str:
    """The one line a refused canceller sees: who may cancel, and how."""
    why = f" ({detail})" if detail else ""
    return (
        f"task {task_id} may be cancelled only by the node that accepted it"
        f" ({spec.submitted_by[:16]}) or with an operator key{why}: run populi-node cancel"
        " on that node, or pass --operator-key FILE (made by populi-node cluster operator)"
    )
