"""Routing and failover through real loopback sockets: a stream lands on the only node
serving the model; a node killed mid-stream, or stalled, or declared suspect, hands the
stream to the next node with no repeated and no lost text and exactly one [DONE]; a
failure before the first byte moves on at once; errors say what to do."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from populi_p2p.testing.standin import StandinConfig
from populi_p2p.trust.identity import NodeIdentity

from .conftest import ALICE, AUTHORITY, BOB, CERTS, NOW
from .harness import Mesh, stream_chat, words

# A third enrolled member for the front node.
CAROL = NodeIdentity.from_seed(b"c" * 32)
CERTS.setdefault(CAROL.node_id, AUTHORITY.enroll(CAROL.public_key, now=NOW - 60, serial=7).raw)


async def _mesh(nursery: trio.Nursery, a: StandinConfig, b: StandinConfig, **kw: object) -> Mesh:
    mesh = Mesh()
    await mesh.add_serving(nursery, ALICE, "alice", a)
    await mesh.add_serving(nursery, BOB, "bob", b)
    await mesh.start_front(nursery, CAROL, **kw)  # type: ignore[arg-type]
    return mesh


async def test_model_only_one_node_serves_lands_there() -> None:
    async with trio.open_nursery() as nursery:
        mesh = await _mesh(nursery, StandinConfig(model="big", tokens=12),
                           StandinConfig(model="small", tokens=12))  # fmt: skip
        r, text, lines = await stream_chat(mesh.url, "big")
        assert r.headers["x-populi-node"] == ALICE.node_id
        assert r.headers["x-populi-route"].startswith("loaded;")
        assert text == words(12) and lines.count("[DONE]") == 1 and lines[-1] == "[DONE]"
        alice = mesh.members[ALICE.node_id].engines
        assert alice is not None
        facts = alice.section()["big"]  # type: ignore[index]
        assert facts["tps"] > 0 and facts["inflight"] == 0  # observed by the serving node
        r, text, _ = await stream_chat(mesh.url, "small", path="/v1/completions")
        assert r.headers["x-populi-node"] == BOB.node_id and text == words(12)
        assert mesh.front is not None
        assert [e["node"] for e in mesh.front.recent_routes()] == ["alice", "bob"]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_killed_mid_stream_continues_on_the_next_node(path: str) -> None:
    async with trio.open_nursery() as nursery:
        cfg = StandinConfig(model="m", tokens=40, delay=0.005)
        mesh = await _mesh(nursery, cfg, cfg)
        first: list[str] = []

        async def kill_at_10(i: int) -> None:
            if i == 10:
                serving = mesh.members[first[0]] if first else None
                assert serving is not None
                serving.kill()

        async def run() -> None:
            nonlocal result
            result = await stream_chat(mesh.url, "m", on_token=kill_at_10, path=path)

        result = None
        # The front orders alice and bob by node id at equal scores; find the first.
        decision, _ = mesh.front.decide("m")  # type: ignore[union-attr]
        first.append(decision.order[0])
        with trio.fail_after(10):
            await run()
        assert result is not None
        _, text, lines = result
        assert text == words(40), text
        assert lines.count("[DONE]") == 1 and lines[-1] == "[DONE]"
        routes = mesh.front.recent_routes()  # type: ignore[union-attr]
        assert "broken" in routes[-1]["attempts"][0] and routes[-1]["done"]
        nursery.cancel_scope.cancel()


async def test_stall_moves_on_and_suspect_moves_on() -> None:
    async with trio.open_nursery() as nursery:
        stalls = StandinConfig(model="m", tokens=30, stall_at=5)
        fine = StandinConfig(model="m", tokens=30)
        mesh = Mesh()
        await mesh.add_serving(nursery, ALICE, "alice", stalls)
        await mesh.add_serving(nursery, BOB, "bob", fine)
        await mesh.start_front(nursery, CAROL, stall_timeout=0.3)
        # Make alice first whatever the ids: bob is far away.
        mesh.members[BOB.node_id].state = "alive"
        decision, _ = mesh.front.decide("m")  # type: ignore[union-attr]
        if decision.order[0] != ALICE.node_id:
            mesh.members[BOB.node_id].models = {"m": {"inflight": 3}}
        with trio.fail_after(10):
            _, text, lines = await stream_chat(mesh.url, "m")
        assert text == words(30) and lines.count("[DONE]") == 1
        assert "stall" in mesh.front.recent_routes()[-1]["attempts"][0]  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()


async def test_suspect_node_gets_no_new_requests_and_errors_explain() -> None:
    """A suspect node serves only as the last resort: while an alive one can, never;
    when it is the only one, rather than a refusal. Dead nodes never."""
    async with trio.open_nursery() as nursery:
        mesh = await _mesh(nursery, StandinConfig(model="m"), StandinConfig(model="m"))
        mesh.members[ALICE.node_id].state = "suspect"
        for _ in range(5):
            r, _, _ = await stream_chat(mesh.url, "m")
            assert r.headers["x-populi-node"] == BOB.node_id
        mesh.members[BOB.node_id].state = "dead"
        r, text, _ = await stream_chat(mesh.url, "m")
        assert r.status_code == 200 and text == words(20)
        assert r.headers["x-populi-node"] == ALICE.node_id
        assert r.headers["x-populi-route"].startswith("suspect;")
        mesh.members[ALICE.node_id].state = "dead"
        r, _, _ = await stream_chat(mesh.url, "m")
        assert r.status_code == 503
        message = r.json()["error"]["message"]
        assert "alice: dead" in message and "bob: dead" in message
        mesh.members[ALICE.node_id].state = "suspect"
        r, _, _ = await stream_chat(mesh.url, "nope")
        assert r.status_code == 404 and "the mesh has: m" not in r.json()["error"]["message"]
        mesh.members[ALICE.node_id].state = "alive"
        r, _, _ = await stream_chat(mesh.url, "nope")
        assert r.status_code == 404 and "the mesh has: m" in r.json()["error"]["message"]
        async with httpx.AsyncClient(trust_env=False) as c:
            models = (await c.get(mesh.url + "/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["m"]
        assert [n["name"] for n in models["data"][0]["nodes"]] == ["alice"]
        nursery.cancel_scope.cancel()


async def test_engine_error_before_first_byte_retries_next_at_once() -> None:
    async with trio.open_nursery() as nursery:
        mesh = await _mesh(nursery, StandinConfig(model="m", error=True),
                           StandinConfig(model="m", error=True))  # fmt: skip
        r, _, _ = await stream_chat(mesh.url, "m")
        assert r.status_code == 503 and "every capable node failed" in r.json()["error"]["message"]
        bad = mesh.members[ALICE.node_id].engine
        assert bad is not None
        bad.config = StandinConfig(model="m")  # alice recovers; bob still fails
        mesh.members[BOB.node_id].engine.config = StandinConfig(model="m", error=True)  # type: ignore[union-attr]
        for _ in range(2):
            start = trio.current_time()
            r, text, _ = await stream_chat(mesh.url, "m")
            assert r.status_code == 200 and text == words(20)
            assert r.headers["x-populi-node"] == ALICE.node_id
            assert trio.current_time() - start < 2.0
        nursery.cancel_scope.cancel()


async def test_declared_suspect_mid_stream_moves_without_waiting_for_a_stall() -> None:
    async with trio.open_nursery() as nursery:
        mesh = Mesh()
        await mesh.add_serving(nursery, ALICE, "alice", StandinConfig(model="m", stall_at=5))
        await mesh.add_serving(nursery, BOB, "bob", StandinConfig(model="m", tokens=20))
        await mesh.start_front(nursery, CAROL, stall_timeout=60.0)
        mesh.members[BOB.node_id].models = {"m": {"inflight": 3}}  # alice ranks first

        async def suspect_alice(i: int) -> None:
            if i == 5:
                mesh.members[ALICE.node_id].state = "suspect"

        with trio.fail_after(5):  # far below the 60 s stall timeout
            r, text, lines = await stream_chat(mesh.url, "m", on_token=suspect_alice)
        assert r.headers["x-populi-node"] == ALICE.node_id
        assert text == words(20) and lines.count("[DONE]") == 1
        attempts = mesh.front.recent_routes()[-1]["attempts"]  # type: ignore[union-attr]
        assert "no longer alive" in attempts[0] and attempts[1] == "bob: served"
        nursery.cancel_scope.cancel()


async def test_no_node_left_ends_with_a_clear_error_event() -> None:
    async with trio.open_nursery() as nursery:
        mesh = Mesh()
        await mesh.add_serving(nursery, ALICE, "alice", StandinConfig(model="m", delay=0.005))
        await mesh.start_front(nursery, CAROL)

        async def kill(i: int) -> None:
            if i == 3:
                mesh.members[ALICE.node_id].kill()

        with trio.fail_after(5):
            _, text, lines = await stream_chat(mesh.url, "m", on_token=kill)
        assert text == words(3)
        assert "[DONE]" not in lines
        assert "no other node could continue" in lines[-1]
        nursery.cancel_scope.cancel()


async def test_a_failover_chooses_again_from_the_view_as_it_is_then() -> None:
    """The issue's lost stream: bob was out of the view for a moment just as the
    request came (then suspect; here dead, which no route takes), so a route fixed
    before the first byte held alice alone, and alice's death then ended the stream
    although bob was back. The route is chosen again at the failover."""
    async with trio.open_nursery() as nursery:
        cfg = StandinConfig(model="m", tokens=30, delay=0.005)
        mesh = await _mesh(nursery, cfg, cfg)
        mesh.members[BOB.node_id].state = "dead"
        decision, _ = mesh.front.decide("m")  # type: ignore[union-attr]
        assert decision.order == (ALICE.node_id,)

        async def bob_back_then_kill_alice(i: int) -> None:
            if i == 10:
                mesh.members[BOB.node_id].state = "alive"
                mesh.members[ALICE.node_id].kill()

        entry = await _alice_to_bob(mesh, bob_back_then_kill_alice)
        assert entry["order"] == ["alice"]  # the decision at the start
        nursery.cancel_scope.cancel()


async def _alice_to_bob(mesh: Any, on_token: Any) -> dict[str, Any]:
    """A 30-word stream that alice starts and bob finishes (`on_token` kills alice):
    whole, with one [DONE]. Its route log entry."""
    with trio.fail_after(10):
        r, text, lines = await stream_chat(mesh.url, "m", on_token=on_token)
    assert r.headers["x-populi-node"] == ALICE.node_id
    assert text == words(30), text
    assert lines.count("[DONE]") == 1 and lines[-1] == "[DONE]"
    entry: dict[str, Any] = mesh.front.recent_routes()[-1]
    assert "broken" in entry["attempts"][0] and entry["attempts"][1] == "bob: served"
    return entry


async def test_a_failover_to_the_only_other_node_while_it_is_suspect_continues_there() -> None:
    """The real-engine failover lost 1 stream of 40: the serving node was killed while
    the only other one, just restarted, was suspect for a moment. The suspect node is
    now the last resort: the stream continues there, and its staying suspect does not
    cut it (only its being declared dead, or a stall, would)."""
    async with trio.open_nursery() as nursery:
        cfg = StandinConfig(model="m", tokens=30, delay=0.005)
        mesh = await _mesh(nursery, cfg, cfg)
        mesh.members[BOB.node_id].state = "suspect"

        async def kill_alice(i: int) -> None:
            if i == 10:
                mesh.members[ALICE.node_id].kill()

        await _alice_to_bob(mesh, kill_alice)
        assert mesh.members[BOB.node_id].state == "suspect"  # all along
        nursery.cancel_scope.cancel()


async def test_route_header_says_when_a_continuation_cannot_be_exact() -> None:
    """A stream that may move to an engine not known to continue a partial answer
    (here: records saying Ollama) is marked ``continuation=inexact``; with stand-ins
    only (which continue), and on a whole answer (never continued), it is not."""
    async with trio.open_nursery() as nursery:
        cfg = StandinConfig(model="m", tokens=4)
        mesh = await _mesh(nursery, cfg, cfg)
        r, text, _ = await stream_chat(mesh.url, "m")
        assert text == words(4) and "continuation" not in r.headers["x-populi-route"]
        for node in (ALICE.node_id, BOB.node_id):
            facts = dict(mesh.members[node].models["m"], kind="ollama")
            mesh.members[node].models = {"m": facts}
        r, text, _ = await stream_chat(mesh.url, "m")
        assert text == words(4)
        assert r.headers["x-populi-route"].endswith(";continuation=inexact")
        body = {"model": "m", "messages": [{"role": "user", "content": "count"}]}
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            whole = await client.post(mesh.url + "/v1/chat/completions", json=body)
        assert whole.status_code == 200 and "continuation" not in whole.headers["x-populi-route"]
        nursery.cancel_scope.cancel()
