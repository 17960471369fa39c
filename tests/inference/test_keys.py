"""API keys: signed by the authority, checked offline; missing, forged, foreign,
expired and revoked keys get 401, an over-rate key 429 with Retry-After, a key limited
to some models 403 for others; and all of it through a real listener."""

from __future__ import annotations

import httpx
import pytest
import trio

from populi_p2p.inference.keys import ApiKey, ApiKeyChecker, issue_api_key
from populi_p2p.testing.standin import StandinConfig
from populi_p2p.trust.revocation import Revocation, RevocationList

from .conftest import ALICE, AUTHORITY, NOW, OTHER_AUTHORITY
from .harness import Mesh, stream_chat
from .test_relay import CAROL


class Mono:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def checker(required: bool = True, clock: Mono | None = None) -> ApiKeyChecker:
    return ApiKeyChecker(AUTHORITY.public_key, required=required, clock=clock or Mono())


def test_key_round_trip_and_refusals() -> None:
    key = issue_api_key(AUTHORITY, "ci", now=NOW, models=["m"], expires_in=3600)
    c = checker()
    got = c.check(f"Bearer {key.token}", NOW)
    assert isinstance(got, ApiKey) and got.name == "ci" and got.models == ("m",)
    assert c.check("", NOW)[0] == 401  # type: ignore[index]
    assert checker(required=False).check("", NOW) is None
    assert c.check(f"Bearer {key.token}", NOW + 3600)[0] == 401  # type: ignore[index]
    foreign = issue_api_key(OTHER_AUTHORITY, "x", now=NOW).token
    assert "another cluster" in c.check(f"Bearer {foreign}", NOW)[1]  # type: ignore[index]
    forged = key.token[:-4] + ("AAAA" if not key.token.endswith("AAAA") else "BBBB")
    assert c.check(f"Bearer {forged}", NOW)[0] == 401  # type: ignore[index]
    assert c.check("Basic abc", NOW)[0] == 401  # type: ignore[index]
    assert c.refused == {"missing": 1, "expired": 1, "invalid": 2, "malformed": 1}


def test_revocation_of_an_api_key_gossips_as_a_revocation() -> None:
    key = issue_api_key(AUTHORITY, "ci", now=NOW)
    revocation = AUTHORITY.revoke(now=NOW, api_key_id=key.key_id)
    again = Revocation.from_bytes(revocation.raw, AUTHORITY.public_key)
    assert again.api_key_id == key.key_id and "API key" in again.describe()
    wire = RevocationList.of([again]).to_bytes()
    c = checker()
    c.update_revocations(RevocationList.from_bytes(wire, AUTHORITY.public_key))
    refusal = c.check(f"Bearer {key.token}", NOW)
    assert isinstance(refusal, tuple) and refusal[0] == 401 and "revoked" in refusal[1]
    # A node key revocation does not touch keys, and vice versa.
    assert not RevocationList.of([again]).is_key_revoked(ALICE.public_key)


def test_rate_limit_token_bucket() -> None:
    clock = Mono()
    key = issue_api_key(AUTHORITY, "ci", now=NOW, rate_per_minute=2)
    c = checker(clock=clock)
    auth = f"Bearer {key.token}"
    assert isinstance(c.check(auth, NOW), ApiKey)
    assert isinstance(c.check(auth, NOW), ApiKey)
    refusal = c.check(auth, NOW)
    assert isinstance(refusal, tuple) and refusal[0] == 429
    assert refusal[2] == {"retry-after": "30"}
    clock.now = 30.0
    assert isinstance(c.check(auth, NOW), ApiKey)


@pytest.mark.parametrize("bad", [{"name": ""}, {"rate_per_minute": -1}, {"expires_in": 0}])
def test_issue_refuses_bad_arguments(bad: dict[str, object]) -> None:
    args: dict[str, object] = {"name": "x", **bad}
    name = args.pop("name")
    with pytest.raises(ValueError):
        issue_api_key(AUTHORITY, name, now=NOW, **args)  # type: ignore[arg-type]


async def test_listener_demands_keys() -> None:
    import time

    key = issue_api_key(AUTHORITY, "ci", now=time.time(), rate_per_minute=2, models=["m"])
    keys = ApiKeyChecker(AUTHORITY.public_key, required=True, clock=trio.current_time)
    async with trio.open_nursery() as nursery:
        mesh = Mesh()
        await mesh.add_serving(nursery, ALICE, "alice", StandinConfig(model="m"))
        await mesh.start_front(nursery, CAROL, key_checker=keys)
        r, _, _ = await stream_chat(mesh.url, "m")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        auth = {"authorization": f"Bearer {key.token}"}
        r, text, _ = await stream_chat(mesh.url, "m", headers=auth)
        assert r.status_code == 200 and text
        r, _, _ = await stream_chat(mesh.url, "other", headers=auth)
        assert r.status_code == 403
        r, _, _ = await stream_chat(mesh.url, "m", headers=auth)
        assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
        keys.update_revocations(
            RevocationList.of([AUTHORITY.revoke(now=time.time(), api_key_id=key.key_id)])
        )
        async with httpx.AsyncClient(trust_env=False) as c:
            r = await c.get(mesh.url + "/v1/models", headers=auth)
        assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
        nursery.cancel_scope.cancel()


async def test_mounted_routes_are_served_before_the_api() -> None:
    from populi_p2p.inference._asgi import send_json

    async def metrics(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        await send_json(send, 200, {"path": scope["path"]})

    async with trio.open_nursery() as nursery:
        mesh = Mesh()
        service = await mesh.start_front(nursery, CAROL)
        service.mount("/metrics", metrics)
        service.mount_paths(lambda p: p in ("/", "/events"), metrics)
        with pytest.raises(ValueError):
            service.mount("/v1", metrics)
        async with httpx.AsyncClient(trust_env=False) as c:
            for path in ("/metrics", "/metrics/x", "/", "/events"):
                assert (await c.get(mesh.url + path)).json() == {"path": path}
            assert (await c.get(mesh.url + "/v1/models")).json()["object"] == "list"
        nursery.cancel_scope.cancel()


def test_pages_beside_the_api_take_the_same_keys() -> None:
    """The dashboard, /metrics and /events on the public listener (request_authorizer)."""
    import time

    from populi_p2p.inference.keys import request_authorizer

    assert request_authorizer(None)({"headers": []}) is True  # no keys: loopback, open
    key = issue_api_key(AUTHORITY, "ops", now=time.time())
    keys = ApiKeyChecker(AUTHORITY.public_key, required=True, clock=time.monotonic)
    authorize = request_authorizer(keys)
    bearer = [(b"authorization", f"Bearer {key.token}".encode())]
    assert authorize({"headers": [], "query_string": b""}) is False
    assert authorize({"headers": bearer, "query_string": b""}) is True
    assert authorize({"headers": [], "query_string": f"x=1&key={key.token}".encode()}) is True
    assert authorize({"headers": [(b"authorization", b"Bearer junk")]}) is False
    assert authorize({"headers": [], "path": "/static/dashboard.js"}) is True
    keys.update_revocations(
        RevocationList.of([AUTHORITY.revoke(now=time.time(), api_key_id=key.key_id)])
    )
    assert authorize({"headers": bearer, "query_string": b""}) is False
