"""Peer-call signatures: genuine calls pass; forged, altered, stale, replayed, revoked
and foreign calls are refused with the right reason."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.inference.peer_auth import H_CERT, H_SIG, H_TS, NonceCache, PeerAuthError

from .conftest import (
    ALICE,
    AUTHORITY,
    BOB,
    MALLORY,
    NOW,
    OTHER_AUTHORITY,
    Clock,
    keys,
    signer,
    verifier,
)


def _call(body: bytes = b'{"x":1}', path: str = "/peer/v1/echo") -> tuple[dict[str, str], bytes]:
    return signer(ALICE, Clock()).headers("POST", path, body, BOB.node_id), body


def test_genuine_call_names_the_caller() -> None:
    headers, body = _call()
    assert verifier(BOB, Clock()).verify("POST", "/peer/v1/echo", headers, body) == ALICE.node_id


@pytest.mark.parametrize(
    ("method", "path", "body", "callee_is_bob"),
    [
        ("GET", "/peer/v1/echo", b'{"x":1}', True),  # method changed
        ("POST", "/peer/v1/other", b'{"x":1}', True),  # path changed
        ("POST", "/peer/v1/echo", b'{"x":2}', True),  # body changed
        ("POST", "/peer/v1/echo", b'{"x":1}', False),  # sent to another callee
    ],
)
def test_altered_call_is_bad_signature(
    method: str, path: str, body: bytes, callee_is_bob: bool
) -> None:
    headers, _ = _call()
    target = BOB if callee_is_bob else ALICE
    with pytest.raises(PeerAuthError) as info:
        verifier(target, Clock()).verify(method, path, headers, body)
    assert info.value.reason == "bad_signature"


def test_replay_is_refused_once_seen() -> None:
    headers, body = _call()
    v = verifier(BOB, Clock())
    v.verify("POST", "/peer/v1/echo", headers, body)
    with pytest.raises(PeerAuthError) as info:
        v.verify("POST", "/peer/v1/echo", headers, body)
    assert info.value.reason == "replay"


@pytest.mark.parametrize("offset", [-31.0, 31.0, 3600.0])
def test_stale_timestamp(offset: float) -> None:
    headers, body = _call()
    with pytest.raises(PeerAuthError) as info:
        verifier(BOB, Clock(NOW + offset)).verify("POST", "/peer/v1/echo", headers, body)
    assert info.value.reason == "stale"


def test_unenrolled_and_foreign_authority() -> None:
    foreign = OTHER_AUTHORITY.enroll(MALLORY.public_key, now=NOW - 60).raw
    headers = signer(MALLORY, Clock(), foreign).headers("POST", "/p", b"", BOB.node_id)
    with pytest.raises(PeerAuthError) as info:
        verifier(BOB, Clock()).verify("POST", "/p", headers, b"")
    assert info.value.reason == "bad_certificate"


def test_borrowed_certificate_is_refused() -> None:
    """Mallory presents Alice's certificate with her own key: not the caller's."""
    headers = signer(MALLORY, Clock(), base64.b64decode(
        signer(ALICE, Clock()).headers("GET", "/", b"", BOB.node_id)[H_CERT]
    )).headers("GET", "/p", b"", BOB.node_id)  # fmt: skip
    with pytest.raises(PeerAuthError) as info:
        verifier(BOB, Clock()).verify("GET", "/p", headers, b"")
    assert info.value.reason == "bad_certificate"


def test_revoked_caller() -> None:
    from populi_p2p.inference.peer_auth import PeerCallVerifier
    from populi_p2p.trust.revocation import RevocationList

    revoked = RevocationList.of([AUTHORITY.revoke(now=NOW, node_public_key=ALICE.public_key)])
    v = PeerCallVerifier(keys(BOB, revoked), BOB.node_id, clock=Clock())
    headers, body = _call()
    with pytest.raises(PeerAuthError) as info:
        v.verify("POST", "/peer/v1/echo", headers, body)
    assert info.value.reason == "revoked"


def test_cached_certificate_is_still_checked_for_revocation_on_every_call() -> None:
    from populi_p2p.inference.peer_auth import PeerCallVerifier
    from populi_p2p.trust.revocation import RevocationList

    envelope = keys(BOB)  # one envelope verifier, revoked later
    v = PeerCallVerifier(envelope, BOB.node_id, clock=Clock())
    headers, body = _call()
    assert v.verify("POST", "/peer/v1/echo", headers, body) == ALICE.node_id
    envelope.update_revocations(
        RevocationList.of([AUTHORITY.revoke(now=NOW, node_public_key=ALICE.public_key)])
    )
    headers, body = _call()  # a fresh nonce, the same (now cached) certificate
    with pytest.raises(PeerAuthError) as info:
        v.verify("POST", "/peer/v1/echo", headers, body)
    assert info.value.reason == "revoked"


@given(st.dictionaries(st.sampled_from(["x-populi-caller", H_CERT, H_TS, "x-populi-nonce", H_SIG]),
                       st.text(max_size=64)))  # fmt: skip
def test_garbage_headers_never_crash(headers: dict[str, str]) -> None:
    with pytest.raises(PeerAuthError):
        verifier(BOB, Clock()).verify("GET", "/", headers, b"")


def test_nonce_cache_is_bounded_and_forgets_old() -> None:
    cache = NonceCache(window=30.0, max_entries=2)
    cache.add(b"a", 0.0)
    cache.add(b"b", 1.0)
    with pytest.raises(PeerAuthError) as info:
        cache.add(b"c", 2.0)
    assert info.value.reason == "busy"
    cache.add(b"c", 100.0)  # a and b are past twice the window: forgotten
    assert len(cache) == 1
