"""Shared test helpers: fake signing, specs, and hypothesis strategies for entries."""

from __future__ import annotations

import hashlib

from hypothesis import strategies as st

from populi_p2p.leases import (
    Cancel,
    Checkpoint,
    ClaimRecord,
    Phase,
    Requirements,
    TaskEntry,
    TaskKind,
    TaskResult,
    TaskSpec,
)
from populi_p2p.leases._cancel import OperatorProof


def fake_sign(node: str):
    """A deterministic 'signature': a keyed hash any test can recompute (not crypto)."""

    def sign(data: bytes) -> bytes:
        return hashlib.blake2b(data, key=node.encode()[:64], digest_size=16).digest()

    return sign


def fake_verify(node: str, data: bytes, sig: bytes) -> bool:
    return fake_sign(node)(data) == sig


def spec(
    n: int = 0, *, by: str = "n0", gpus: int = 1, labels: tuple[str, ...] = (), retry_limit: int = 2
) -> TaskSpec:
    return TaskSpec(
        kind=TaskKind.BATCH,
        requirements=Requirements(
            gpu_count=gpus, vram_per_gpu=8 << 30, labels_required=frozenset(labels)
        ),
        command=("python", "job.py", str(n)),
        env={"SEED": str(n)},
        retry_limit=retry_limit,
        submitted_by=by,
    )


SPEC = spec(0)
TID = SPEC.task_id()
OWNERS = ("a", "b", "c")

results = st.builds(
    TaskResult,
    exit_code=st.integers(-2, 2),
    output_tail=st.sampled_from([b"", b"ok", b"boom"]),
    duration=st.sampled_from([0.0, 1.5]),
    node_fault=st.booleans(),
    signature=st.sampled_from([b"r1", b"r2"]),
    final=st.booleans(),
)


@st.composite
def claim_records(draw: st.DrawFn, epoch: int | None = None) -> ClaimRecord:
    phase = draw(st.sampled_from(list(Phase)))
    result = draw(results) if phase in (Phase.FAILED, Phase.SUCCEEDED) else None
    return ClaimRecord(
        epoch=draw(st.integers(1, 4)) if epoch is None else epoch,
        rank=draw(st.integers(0, 2)),
        owner=draw(st.sampled_from(OWNERS)),
        signature=draw(st.sampled_from([b"s1", b"s2"])),
        explanation=draw(st.sampled_from(["", "fit"])),
        phase=phase,
        renewals=draw(st.integers(0, 3)),
        result=result,
        progress_signature=draw(st.sampled_from([b"", b"p1", b"p2"])),
        failures_before=draw(st.integers(0, 2)),
    )


#: Operator proofs as the wire bounds them (the signatures are not checked here).
operator_proofs = st.builds(
    OperatorProof,
    st.sampled_from([b"cert-1", b"cert-2" * 40]),
    st.integers(0, 2),
    st.sampled_from([b"s" * 64, b"t" * 64]),
)
cancels = st.builds(
    Cancel,
    st.sampled_from(OWNERS),
    st.sampled_from([b"c1", b"c2"]),
    st.none() | operator_proofs,
)


checkpoints = st.builds(
    Checkpoint,
    epoch=st.integers(1, 4),
    seq=st.integers(0, 2),
    owner=st.sampled_from(OWNERS),
    sha256=st.just("ab" * 32),
    size=st.integers(1, 3),
    holders=st.sampled_from([("a",), ("a", "b")]),
    taken_in=st.just(1),
    signature=st.sampled_from([b"k1", b"k2"]),
)


@st.composite
def entries(draw: st.DrawFn) -> TaskEntry:
    records = draw(st.lists(claim_records(), max_size=4))
    by_epoch: dict[int, ClaimRecord] = {}
    for r in records:
        by_epoch[r.epoch] = r
    has_spec = draw(st.booleans())
    cancel = draw(st.none() | cancels)
    return TaskEntry(
        TID,
        SPEC if has_spec else None,
        draw(st.sampled_from([b"x", b"y"])) if has_spec else b"",
        tuple(by_epoch[e] for e in sorted(by_epoch)),
        cancel,
        draw(st.none() | checkpoints),
    )


def table(me: str, config=None, **kw):
    from populi_p2p.leases import LeaseConfig, LeaseTable

    return LeaseTable(config or LeaseConfig.local(), me, fake_sign(me), fake_verify, **kw)


def anti_entropy(a, b, now: float = 0.0, *, direct: bool = False) -> int:
    """Run one digest-first exchange initiated by `a`; return the bytes moved."""
    moved = 0
    digest = a.digest()
    moved += len(digest)
    msg = b.state_for(digest, direct=direct)
    sides = [a, b]  # the receiver of msg is sides[0]
    while msg is not None:
        moved += len(msg)
        result = sides[0].merge_state(msg, now)
        msg = result.reply
        sides.reverse()
    return moved
