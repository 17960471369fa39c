"""`populi_p2p.leases._cancel`: who may cancel a task, the operator proof's wire form,
and the line a refused canceller sees."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.leases._cancel import (
    OPERATOR_CERTIFICATE_BYTES_MAX,
    SIGNED_AT_MAX,
    OperatorProof,
    cancel_refusal_line,
    may_cancel,
    no_operators,
    operator_cancel_bytes,
)

from .helpers import SPEC, TID

PROOF = OperatorProof(b"cert", 5, b"s" * 64)


def test_the_accepting_node_may_cancel_without_a_proof() -> None:
    assert may_cancel(TID, SPEC, SPEC.submitted_by, None, no_operators, fresh=True) is None


def test_another_node_without_a_proof_may_not() -> None:
    assert may_cancel(TID, SPEC, "other", None, no_operators, fresh=True) == (
        "not the accepting node, and no operator key"
    )
    # Without the spec nobody can tell who accepted it: not even the real submitter.
    assert may_cancel(TID, None, SPEC.submitted_by, None, no_operators, fresh=True) is not None


@pytest.mark.parametrize("fresh", [True, False])
def test_a_proof_is_judged_by_the_check_it_is_handed(fresh: bool) -> None:
    asked: list[tuple[str, OperatorProof, bool]] = []

    def check(task_id: str, proof: OperatorProof, fresh: bool) -> str | None:
        asked.append((task_id, proof, fresh))
        return None if proof == PROOF else "refused"

    assert may_cancel(TID, None, "other", PROOF, check, fresh=fresh) is None
    other = OperatorProof(b"cert", 6, b"s" * 64)
    assert may_cancel(TID, SPEC, "other", other, check, fresh=fresh) == "refused"
    assert asked == [(TID, PROOF, fresh), (TID, other, fresh)]
    assert may_cancel(TID, SPEC, "other", PROOF, no_operators, fresh=fresh) == (
        "this node checks no operator keys"
    )


proofs = st.builds(
    OperatorProof,
    st.binary(min_size=1, max_size=OPERATOR_CERTIFICATE_BYTES_MAX),
    st.integers(0, SIGNED_AT_MAX),
    st.binary(min_size=64, max_size=64),
)


@given(proofs)
def test_the_wire_form_round_trips(proof: OperatorProof) -> None:
    assert OperatorProof.from_wire(proof.to_wire()) == proof


@given(proofs, proofs)
def test_the_sort_key_is_a_total_order_on_distinct_proofs(
    a: OperatorProof, b: OperatorProof
) -> None:
    assert (a.sort_key() == b.sort_key()) == (a == b)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("proof", r"is \[certificate, signed_at, signature\]"),
        ([b"c", 1], r"is \[certificate, signed_at, signature\]"),
        ([b"", 1, b"s" * 64], "certificate is 1..256 bytes"),
        ([b"c" * 257, 1, b"s" * 64], "certificate is 1..256 bytes"),
        (["c", 1, b"s" * 64], "certificate is 1..256 bytes"),
        ([b"c", -1, b"s" * 64], "signed_at is Unix seconds"),
        ([b"c", SIGNED_AT_MAX + 1, b"s" * 64], "signed_at is Unix seconds"),
        ([b"c", True, b"s" * 64], "signed_at is Unix seconds"),
        ([b"c", 1, b"s" * 63], "signature is 64 bytes"),
    ],
)
def test_a_bad_wire_proof_says_which_part_is_wrong(raw: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        OperatorProof.from_wire(raw)


def test_what_an_operator_signs_names_the_task_and_the_time() -> None:
    signed = operator_cancel_bytes(TID, 100)
    assert signed != operator_cancel_bytes(TID, 101)
    assert signed != operator_cancel_bytes("00" * 32, 100)
    with pytest.raises(ValueError):
        operator_cancel_bytes("not hex", 100)


def test_the_refusal_line_says_who_may_cancel_and_how() -> None:
    line = cancel_refusal_line(TID, SPEC, "expired")
    assert "\n" not in line
    assert TID in line and SPEC.submitted_by[:16] in line and "(expired)" in line
    assert "--operator-key" in line
    assert "()" not in cancel_refusal_line(TID, SPEC)
