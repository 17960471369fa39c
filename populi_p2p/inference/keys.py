"""API keys: capability tokens the cluster authority signs and every node verifies
offline.

A key is ``pk-populi-`` + base64url(``body || signature``), `body` the canonical
msgpack array::

    [1, authority_key_id (bin 8), key_id (bin 16), name, [model, ...] (empty: any),
     rate_per_minute (0: unlimited), issued_at, expires_at|nil]

signed by the authority over ``b"populi/apikey/v1" + body`` (its own context, so a key
can never pass for a certificate or a revocation). No server is asked: a node checks
the signature, the expiry and the gossiped revocation list (a revocation of kind "API
key", `ClusterAuthority.revoke(api_key_id=...)`), so a revoked key is refused on every
node once the revocation has gossiped (one round). Rate limits are per key and per
node (a token bucket of `rate_per_minute`): a client spreading requests over N nodes
gets up to N times the rate; the docs say so.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any, Final

import attrs

from ..trust._codec import CodecError, pack_canonical, split_signed, unpack_strict
from ..trust.authority import ClusterAuthority
from ..trust.certificate import AUTHORITY_KEY_ID_BYTES, authority_key_id
from ..trust.identity import verify_signature
from ..trust.revocation import API_KEY_ID_BYTES, RevocationList

__all__ = ["API_KEY_PREFIX", "ApiKey", "ApiKeyChecker", "ApiKeyError", "Refusal", "issue_api_key"]

API_KEY_CONTEXT: Final = b"populi/apikey/v1"
API_KEY_PREFIX: Final = "pk-populi-"
API_KEY_VERSION: Final = 1
MAX_TOKEN_CHARS: Final = 4096
MAX_KEY_MODELS: Final = 32
#: Parsed keys kept (a cache: parsing verifies a signature).
KEY_CACHE: Final = 1024


class ApiKeyError(Exception):
    """A token is not a valid key of this cluster."""


@attrs.frozen
class ApiKey:
    key_id: bytes
    name: str
    models: tuple[str, ...]
    rate_per_minute: int
    issued_at: int
    expires_at: int | None
    token: str = attrs.field(repr=False)

    @classmethod
    def from_token(cls, token: str, authority_public_key: bytes) -> ApiKey:
        """Verify and decode. Raises `ApiKeyError` (one line)."""
        if not token.startswith(API_KEY_PREFIX) or len(token) > MAX_TOKEN_CHARS:
            raise ApiKeyError(f"not a populi API key (they start with {API_KEY_PREFIX})")
        try:
            raw = base64.urlsafe_b64decode(token[len(API_KEY_PREFIX) :] + "==")
            body, signature = split_signed(raw)
            fields = unpack_strict(body)
        except (binascii.Error, ValueError, CodecError):
            raise ApiKeyError("the API key is damaged (copy it again)") from None
        if not (isinstance(fields, list) and len(fields) == 8):
            raise ApiKeyError("the API key is damaged (copy it again)")
        version, akid, key_id, name, models, rate, issued, expires = fields
        if not (
            version == API_KEY_VERSION
            and isinstance(akid, bytes) and len(akid) == AUTHORITY_KEY_ID_BYTES
            and isinstance(key_id, bytes) and len(key_id) == API_KEY_ID_BYTES
            and isinstance(name, str) and isinstance(models, list)
            and all(isinstance(m, str) for m in models) and len(models) <= MAX_KEY_MODELS
            and type(rate) is int and rate >= 0 and type(issued) is int
            and (expires is None or type(expires) is int)
        ):  # fmt: skip
            raise ApiKeyError("the API key is damaged (copy it again)")
        if akid != authority_key_id(authority_public_key):
            raise ApiKeyError("the API key is from another cluster")
        if not verify_signature(authority_public_key, API_KEY_CONTEXT, body, signature):
            raise ApiKeyError("the API key's signature does not verify")
        return cls(key_id, name, tuple(models), rate, issued, expires, token)


def issue_api_key(
    authority: ClusterAuthority,
    name: str,
    *,
    now: float,
    models: Sequence[str] = (),
    rate_per_minute: int = 0,
    expires_in: float | None = None,
) -> ApiKey:
    """Sign a new API key. Raises ValueError on a bad argument."""
    if not 0 < len(name) <= 64:
        raise ValueError("--name is 1 to 64 characters")
    if rate_per_minute < 0 or len(models) > MAX_KEY_MODELS:
        raise ValueError(f"--rate is not negative; at most {MAX_KEY_MODELS} --models")
    if expires_in is not None and expires_in <= 0:
        raise ValueError("--expires must be positive")
    key_id = os.urandom(API_KEY_ID_BYTES)
    expires = None if expires_in is None else int(now + expires_in)
    body = pack_canonical([API_KEY_VERSION, authority.key_id, key_id, name, list(models),
                           rate_per_minute, int(now), expires])  # fmt: skip
    raw = authority.sign_statement(API_KEY_CONTEXT, body)
    token = API_KEY_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return ApiKey(key_id, name, tuple(models), rate_per_minute, int(now), expires, token)


#: (HTTP status, message, extra headers).
Refusal = tuple[int, str, dict[str, str]]


class ApiKeyChecker:
    """Checks the ``Authorization: Bearer`` key of each request.

    Args:
        authority_public_key: the cluster authority.
        revocations: the current revocation list (update with `update_revocations`).
        required: whether a request without a key is refused.
        clock: monotonic seconds, for the rate limiter.
    """

    def __init__(
        self,
        authority_public_key: bytes,
        *,
        revocations: RevocationList | None = None,
        required: bool,
        clock: Callable[[], float],
    ) -> None:
        self._authority = authority_public_key
        self._revocations = revocations if revocations is not None else RevocationList()
        self.required = required
        self._clock = clock
        self._cache: OrderedDict[str, ApiKey] = OrderedDict()
        self._buckets: dict[bytes, tuple[float, float]] = {}  # key id -> (tokens, at)
        self.refused: dict[str, int] = {}

    def update_revocations(self, revocations: RevocationList) -> None:
        self._revocations = revocations

    def _refuse(self, reason: str, status: int, message: str, **headers: str) -> Refusal:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        return status, message, headers

    def check(self, authorization: str, now_real: float) -> ApiKey | Refusal | None:
        """The key (or None when none is needed and none given), or a refusal."""
        if not authorization:
            if not self.required:
                return None
            return self._refuse("missing", 401,
                "this API needs a key: send Authorization: Bearer pk-populi-... (create one"
                " with populi-node cluster apikey create --name NAME)")  # fmt: skip
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return self._refuse("malformed", 401, "send the key as Authorization: Bearer KEY")
        token = token.strip()
        key = self._cache.get(token)
        if key is None:
            try:
                key = ApiKey.from_token(token, self._authority)
            except ApiKeyError as exc:
                return self._refuse("invalid", 401, f"invalid API key: {exc}")
            self._cache[token] = key
            if len(self._cache) > KEY_CACHE:
                self._cache.popitem(last=False)
        if self._revocations.is_api_key_revoked(key.key_id):
            return self._refuse("revoked", 401, f"API key {key.name!r} has been revoked"
                                " (ask the cluster operator for a new one)")  # fmt: skip
        if key.expires_at is not None and now_real >= key.expires_at:
            return self._refuse("expired", 401, f"API key {key.name!r} has expired"
                                " (ask the cluster operator for a new one)")  # fmt: skip
        if key.rate_per_minute:
            wait = self._take(key)
            if wait > 0:
                return self._refuse("rate", 429,
                    f"rate limit of {key.rate_per_minute} requests/min for key {key.name!r}"
                    f" reached: retry in {math.ceil(wait)} s",
                    **{"retry-after": str(math.ceil(wait))})  # fmt: skip
        return key

    def _take(self, key: ApiKey) -> float:
        """Take one request from `key`'s bucket: 0, or seconds until one is available."""
        now = self._clock()
        capacity = float(key.rate_per_minute)
        per_second = capacity / 60.0
        tokens, at = self._buckets.get(key.key_id, (capacity, now))
        tokens = min(capacity, tokens + (now - at) * per_second)
        if tokens >= 1.0:
            self._buckets[key.key_id] = (tokens - 1.0, now)
            return 0.0
        self._buckets[key.key_id] = (tokens, now)
        return (1.0 - tokens) / per_second


def request_authorizer(keys: ApiKeyChecker | None) -> Callable[[MutableMapping[str, Any]], bool]:
    """An ASGI `authorize(scope)` hook for read-only pages served beside the API (the
    dashboard, /metrics, /events): the same key rule as the API itself.

    A browser's `EventSource` cannot send headers, so a ``?key=pk-populi-...`` query
    parameter is accepted too (docs/observability.md says what that costs).
    """

    def authorize(scope: MutableMapping[str, Any]) -> bool:
        if keys is None or str(scope.get("path", "")).startswith("/static/"):
            return True  # the page's own CSS and script hold nothing about the mesh
        authorization = ""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                authorization = value.decode("latin-1")
        if not authorization:
            query = scope.get("query_string", b"")
            for part in (query if isinstance(query, bytes) else b"").split(b"&"):
                if part.startswith(b"key="):
                    authorization = "Bearer " + part[4:].decode("latin-1")
        checked = keys.check(authorization, time.time())
        return checked is None or isinstance(checked, ApiKey)

    return authorize
