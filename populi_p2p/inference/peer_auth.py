"""Signed node-to-node HTTP calls ("peer calls"): the request signature and its check.

Every peer call carries five headers (wire format, version 1)::

    x-populi-caller  the caller's node id
    x-populi-cert    the caller's enrollment certificate, base64 (standard, padded)
    x-populi-ts      the caller's realtime, Unix milliseconds (decimal)
    x-populi-nonce   16 random bytes, hex
    x-populi-sig     Ed25519 signature, base64, by the certificate's key, over
                     b"populi/peer-call/v1" + msgpack([method, target, ts, nonce,
                     sha256(body), callee_node_id])

`target` is the request path with its query string. The callee checks, in order, from
the headers alone (`check_headers`, before it reads a byte of the body): the headers
are present and well formed; the certificate is from the cluster authority, in scope,
unexpired and not revoked (the same `PeerVerifier` the packet envelope uses, so no new
crypto); its key is the caller's id; the timestamp is within `freshness_window` of the
callee's clock; the nonce was not seen in that window. Then, with the body read against
its limit (`check_body`): the signature, and the nonce is remembered.

Limits, honestly: only the *request* is signed. The response is not, so its integrity
and the confidentiality of both directions rely on the overlay (WireGuard/Tailscale).
Without an overlay (plain LAN), anyone on the path can read prompts and completions and
alter responses; they cannot make calls in a member's name.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Final, Literal

import attrs

from overlay.verifier import CredentialError, PeerCredential, PeerVerifier

from ..trust._codec import pack_canonical
from ..trust.certificate import EnrollmentCertificate
from ..trust.identity import NodeIdentity, node_id_from_public_key

__all__ = [
    "PEER_CALL_CONTEXT",
    "NonceCache",
    "PeerAuthError",
    "PeerCallSigner",
    "PeerCallVerifier",
    "PendingCall",
]

#: Signature context of a peer call (see `identity.verify_signature`).
PEER_CALL_CONTEXT: Final = b"populi/peer-call/v1"
#: Header names. ONLY APPEND: they are part of the protocol.
H_CALLER: Final = "x-populi-caller"
H_CERT: Final = "x-populi-cert"
H_TS: Final = "x-populi-ts"
H_NONCE: Final = "x-populi-nonce"
H_SIG: Final = "x-populi-sig"
#: Default: how far a call's timestamp may be from the callee's clock, seconds.
FRESHNESS_WINDOW: Final = 30.0
#: Default: how many nonces the callee remembers (calls beyond it within the window
#: are refused as `busy` rather than remembered unboundedly).
NONCE_CACHE_MAX: Final = 65536
_NONCE_BYTES: Final = 16
_MAX_CERT_HEADER: Final = 8192
#: How many parsed certificates the callee keeps (their authority signature checked
#: once; expiry and revocation are still checked on every call).
CERT_CACHE_MAX: Final = 256

PeerAuthReason = Literal[
    "missing",
    "malformed",
    "bad_certificate",
    "revoked",
    "bad_signature",
    "stale",
    "replay",
    "busy",
]


class PeerAuthError(Exception):
    """A peer call was refused; `reason` is one of `PeerAuthReason`."""

    def __init__(self, reason: PeerAuthReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: PeerAuthReason = reason


def _message(method: str, target: str, ts: int, nonce: bytes, body: bytes, callee: str) -> bytes:
    return pack_canonical(
        [method.upper(), target, ts, nonce, hashlib.sha256(body).digest(), callee]
    )


class PeerCallSigner:
    """Signs this node's outgoing peer calls.

    Args:
        identity: this node's key.
        certificate: this node's enrollment certificate bytes.
        clock: realtime, Unix seconds.
        nonce: a source of random bytes (injected for tests).
    """

    def __init__(
        self,
        identity: NodeIdentity,
        certificate: bytes,
        *,
        clock: Callable[[], float],
        nonce: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self._identity = identity
        self._cert_b64 = base64.b64encode(certificate).decode()
        self._clock = clock
        self._nonce = nonce

    @property
    def node_id(self) -> str:
        return self._identity.node_id

    def headers(self, method: str, target: str, body: bytes, callee: str) -> dict[str, str]:
        """The five auth headers for one call to node `callee`."""
        ts = int(self._clock() * 1000)
        nonce = self._nonce(_NONCE_BYTES)
        sig = self._identity.sign(
            PEER_CALL_CONTEXT, _message(method, target, ts, nonce, body, callee)
        )
        return {
            H_CALLER: self._identity.node_id,
            H_CERT: self._cert_b64,
            H_TS: str(ts),
            H_NONCE: nonce.hex(),
            H_SIG: base64.b64encode(sig).decode(),
        }


class NonceCache:
    """Nonces seen within the freshness window, bounded.

    A nonce older than the window needs no memory: its timestamp is refused anyway.
    When the cache is full of fresh nonces the call is refused (`busy`) instead of
    forgetting one that could then be replayed.
    """

    def __init__(self, window: float, max_entries: int) -> None:
        self._window = window
        self._max = max_entries
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, nonce: bytes) -> bool:
        """Whether `nonce` was used (a check before any body is read; `add` decides)."""
        return nonce in self._seen

    def add(self, nonce: bytes, now: float) -> None:
        """Remember `nonce` (seen at `now`). Raises `PeerAuthError` replay or busy."""
        horizon = now - 2 * self._window
        while self._seen:
            oldest, at = next(iter(self._seen.items()))
            if at >= horizon:
                break
            del self._seen[oldest]
        if self.seen(nonce):
            raise PeerAuthError("replay", "this nonce was already used")
        if len(self._seen) >= self._max:
            raise PeerAuthError("busy", "too many calls within the freshness window")
        self._seen[nonce] = now


@attrs.frozen
class PendingCall:
    """A call whose headers passed `PeerCallVerifier.check_headers`; its body is next."""

    caller: str
    method: str
    target: str
    ts: int
    nonce: bytes
    signature: bytes
    public_key: bytes


class PeerCallVerifier:
    """Checks incoming peer calls against the cluster's certificates and revocations.

    Args:
        verifier: the envelope's `PeerVerifier` (`EnvelopeKeys`): certificate loading,
            admission (authority, scope, expiry, revocation) and signature checks.
        node_id: this node's id (calls must name it as the callee).
        clock: realtime, Unix seconds.
        freshness_window: seconds a call's timestamp may differ from `clock()`.
        max_nonces: the nonce cache bound.
    """

    def __init__(
        self,
        verifier: PeerVerifier,
        node_id: str,
        *,
        clock: Callable[[], float],
        freshness_window: float = FRESHNESS_WINDOW,
        max_nonces: int = NONCE_CACHE_MAX,
    ) -> None:
        self._verifier = verifier
        self._node_id = node_id
        self._clock = clock
        self._window = freshness_window
        self._nonces = NonceCache(freshness_window, max_nonces)
        self._certs: OrderedDict[str, PeerCredential] = OrderedDict()

    def _load(self, cert_b64: str, raw_cert: bytes) -> PeerCredential:
        """The certificate, parsed and its authority signature checked once per
        distinct certificate (an LRU of `CERT_CACHE_MAX`): a peer call costs one
        signature check, not two. Raises `CredentialError`."""
        credential = self._certs.get(cert_b64)
        if credential is not None:
            self._certs.move_to_end(cert_b64)
            return credential
        credential = self._verifier.load(raw_cert)
        self._certs[cert_b64] = credential
        if len(self._certs) > CERT_CACHE_MAX:
            self._certs.popitem(last=False)
        return credential

    def verify(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> str:
        """The caller's node id, if the call is genuine and fresh (`check_headers`, then
        `check_body`).

        Args:
            headers: lower-case header names to values.

        Raises:
            PeerAuthError: the call is refused (the reason says why).
        """
        return self.check_body(self.check_headers(method, target, headers), body)

    def check_headers(self, method: str, target: str, headers: Mapping[str, str]) -> PendingCall:
        """Everything but the body's signature: the headers are well formed, the
        certificate is the cluster's, unexpired, unrevoked and the caller's, the
        timestamp is fresh and the nonce unseen. Only then is a body worth reading.

        Raises:
            PeerAuthError: the call is refused (the reason says why).
        """
        try:
            caller, cert_b64 = headers[H_CALLER], headers[H_CERT]
            ts_text, nonce_hex, sig_b64 = headers[H_TS], headers[H_NONCE], headers[H_SIG]
        except KeyError as exc:
            raise PeerAuthError("missing", f"header {exc.args[0]} is missing") from None
        if len(cert_b64) > _MAX_CERT_HEADER or not ts_text.isdigit() or len(ts_text) > 16:
            raise PeerAuthError("malformed", "certificate too long or timestamp not a number")
        try:
            raw_cert = base64.b64decode(cert_b64, validate=True)
            nonce = bytes.fromhex(nonce_hex)
            signature = base64.b64decode(sig_b64, validate=True)
        except (binascii.Error, ValueError):
            raise PeerAuthError("malformed", "bad base64 or hex in the auth headers") from None
        if len(nonce) != _NONCE_BYTES:
            raise PeerAuthError("malformed", f"the nonce is {_NONCE_BYTES} bytes")
        now = self._clock()
        try:
            credential = self._load(cert_b64, raw_cert)
            if not isinstance(credential, EnrollmentCertificate):
                raise CredentialError("bad_certificate", "not an enrollment certificate")
            public_key = credential.node_public_key
            self._verifier.admit(credential, public_key, now)
        except CredentialError as exc:
            reason: PeerAuthReason = "revoked" if exc.reason == "revoked" else "bad_certificate"
            raise PeerAuthError(reason, str(exc)) from None
        if node_id_from_public_key(public_key) != caller:
            raise PeerAuthError("bad_certificate", "the certificate is not the caller's")
        ts = int(ts_text)
        if abs(ts / 1000 - now) > self._window:
            raise PeerAuthError(
                "stale", f"timestamp {ts / 1000 - now:+.1f} s from this node's clock"
            )
        if self._nonces.seen(nonce):
            raise PeerAuthError("replay", "this nonce was already used")
        return PendingCall(caller, method, target, ts, nonce, signature, public_key)

    def check_body(self, call: PendingCall, body: bytes) -> str:
        """The caller's node id once the signature over the call and `body` holds and
        the nonce is remembered.

        Raises:
            PeerAuthError: bad signature, replay, or busy.
        """
        message = _message(call.method, call.target, call.ts, call.nonce, body, self._node_id)
        if not self._verifier.verify(call.public_key, PEER_CALL_CONTEXT, message, call.signature):
            raise PeerAuthError("bad_signature", "the signature does not match the request")
        self._nonces.add(call.nonce, self._clock())
        return call.caller
