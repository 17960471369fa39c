"""`overlay.verifier`: the refusal a verifier raises, and its reason, which says how
the packet is counted."""

from __future__ import annotations

import pytest

from overlay.verifier import NODE_ID_LENGTH, SIGNATURE_BYTES, CredentialError


@pytest.mark.parametrize("reason", ["bad_certificate", "revoked"])
def test_a_refusal_carries_its_reason_and_says_it(reason: str) -> None:
    error = CredentialError(reason, "serial 7")  # type: ignore[arg-type]
    assert error.reason == reason
    assert str(error) == f"{reason}: serial 7"


def test_a_refusal_without_detail_is_its_reason_alone() -> None:
    assert str(CredentialError("revoked")) == "revoked"


def test_the_envelope_sizes_are_ed25519_and_a_16_character_id() -> None:
    assert SIGNATURE_BYTES == 64
    assert NODE_ID_LENGTH == 16
