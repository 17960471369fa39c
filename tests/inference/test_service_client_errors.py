"""A client's mistake is the client's answer, through the real listener and real peer
calls (issue 18, row 7): a bad request is a 400 naming the field, and no engine sees
it, no node is tried, no reliability changes. An engine's 4xx (local or through a peer)
is passed back as it is, with no failover and no reliability lost; a peer API's own
refusal (401) is a node fault and fails over."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from populi_p2p.inference._asgi import serve_tcp
from populi_p2p.inference.engines import EngineService
from populi_p2p.inference.route import Candidate
from populi_p2p.inference.service import InferenceService
from populi_p2p.leases.config import LeaseConfig
from populi_p2p.leases.reliability import Outcome, prior_reliability
from populi_p2p.testing.standin import StandinConfig, StandinEngine

from .conftest import ALICE, BOB
from .harness import Mesh, stream_chat, words
from .test_relay import CAROL

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "count"}]
PRIOR = f"reliability={prior_reliability(LeaseConfig()):.3f};"

#: (path, body, the field the 400 names): the issue's three, and their kin.
BAD: list[tuple[str, dict[str, Any], str | None]] = [
    (CHAT, {"model": "m", "messages": USER, "stream": "false"}, "stream"),
    (CHAT, {"model": "m", "messages": USER, "max_tokens": "abc"}, "max_tokens"),
    (CHAT, {"model": "m", "messages": USER, "temperature": "hot"}, "temperature"),
    (CHAT, {"model": "m", "messages": USER, "stream": "true", "max_tokens": 0}, "stream"),
    (CHAT, {"model": "m", "messages": USER, "max_tokens": -1}, "max_tokens"),
    (CHAT, {"model": "m", "messages": USER, "n": 3}, "n"),
    (CHAT, {"model": "m", "messages": USER, "stop": [1, 2]}, "stop"),
    (CHAT, {"model": "m", "messages": USER, "top_p": 7}, "top_p"),
    (CHAT, {"model": "m"}, "messages"),
    (CHAT, {"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    (COMPLETIONS, {"model": "m"}, "prompt"),
    (COMPLETIONS, {"model": "m", "prompt": "x", "stream": 1}, "stream"),
    (COMPLETIONS, {"model": "m", "prompt": ["a", "b"]}, "prompt"),
]


async def _mesh(nursery: trio.Nursery, outcomes: list[Outcome], **kw: Any) -> Mesh:
    mesh = Mesh()
    await mesh.add_serving(nursery, ALICE, "alice", kw.pop("a", StandinConfig(model="m")))
    await mesh.add_serving(nursery, BOB, "bob", kw.pop("b", StandinConfig(model="m")))
    await mesh.start_front(nursery, CAROL, on_outcome=outcomes.append, **kw)
    return mesh


def _engines_saw(mesh: Mesh) -> int:
    return sum(m.engine.requests for m in mesh.members.values() if m.engine is not None)


async def test_each_bad_request_is_a_400_and_no_node_is_tried() -> None:
    outcomes: list[Outcome] = []
    async with trio.open_nursery() as nursery:
        mesh = await _mesh(nursery, outcomes)
        assert mesh.front is not None
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            for path, body, param in BAD:
                r = await client.post(mesh.url + path, json=body)
                assert r.status_code == 400, (body, r.text)
                error = r.json()["error"]
                assert error["type"] == "invalid_request_error" and error["code"] is None
                assert error["param"] == param and error["message"].startswith(param), error
                assert "x-populi-node" not in r.headers  # routed nowhere
            for raw in (b"[" * 100_000, b"[1, 2]", b"{"):
                r = await client.post(mesh.url + CHAT, content=raw)
                assert r.status_code == 400
                assert "not a JSON object" in r.text or "nested too deeply" in r.text
            assert _engines_saw(mesh) == 0
            assert outcomes == [] and mesh.front.recent_routes() == []
            # The nodes rank as before: a good request finds them at the prior.
            r = await client.post(mesh.url + CHAT, json={"model": "m", "messages": USER})
            assert r.status_code == 200 and PRIOR in r.headers["x-populi-route"]
            assert [o.success for o in outcomes] == [True]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_engines_4xx_through_a_peer_is_the_clients_answer(streamed: bool) -> None:
    """vLLM's answer to more tokens than the context: a 400, passed back as it is."""
    outcomes: list[Outcome] = []
    async with trio.open_nursery() as nursery:
        mesh = await _mesh(nursery, outcomes)
        assert mesh.front is not None
        body = {"model": "m", "messages": USER, "max_tokens": 5000, "stream": streamed}
        first = mesh.front.decide("m")[0].order[0]  # before: the route counts live load
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            r = await client.post(mesh.url + CHAT, json=body)
        assert r.status_code == 400
        error = r.json()["error"]
        assert "maximum context length is 4096 tokens" in error["message"]
        assert error["param"] == "max_tokens"
        assert r.headers["x-populi-node"] == first
        assert _engines_saw(mesh) == 1  # no failover
        assert outcomes == []  # no reliability lost
        with trio.fail_after(5):  # the log is written once the answer has gone out
            while "attempts" not in mesh.front.recent_routes()[-1]:
                await trio.sleep(0.01)
        name = mesh.members[first].name
        assert mesh.front.recent_routes()[-1]["attempts"] == [f"{name}: client error (400)"]
        nursery.cancel_scope.cancel()


async def test_an_engines_4xx_on_the_node_itself_is_the_clients_answer() -> None:
    outcomes: list[Outcome] = []
    engine = StandinEngine(StandinConfig(model="m", context_length=64))
    section: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_tcp(engine.app, "127.0.0.1", 0, logger_name="t",
                                          task_status=task_status)
        )  # fmt: skip

        async def publish(name: str, value: dict[str, Any] | None) -> None:
            section.clear()
            section.update(value or {})

        engines = EngineService([f"http://127.0.0.1:{port}"], publish, interval=0.2)
        service = InferenceService(
            CAROL.node_id, view=lambda: [Candidate(CAROL.node_id, "carol", "alive", False,
                                                   dict(section), is_self=True)],
            address_of=lambda _: None, peer_client=None, engines=engines,
            listen=("127.0.0.1", 0), on_outcome=outcomes.append,
        )  # fmt: skip
        nursery.start_soon(engines.run)
        api = await nursery.start(service.run)
        with trio.fail_after(5):
            while not section:
                await trio.sleep(0.01)  # the engine's first poll (bounded)
        url = f"http://127.0.0.1:{api}"
        r, _, _ = await stream_chat(url, "m", path=COMPLETIONS)
        assert r.status_code == 200 and [o.success for o in outcomes] == [True]
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            r = await client.post(url + COMPLETIONS, json={"model": "m", "prompt": "x",
                                                           "max_tokens": 65})  # fmt: skip
        assert r.status_code == 400 and "maximum context length is 64" in r.text
        assert r.headers["x-populi-node"] == CAROL.node_id
        assert [o.success for o in outcomes] == [True]  # nothing added
        assert engine.requests == 2
        nursery.cancel_scope.cancel()


async def test_a_peer_apis_own_refusal_is_a_node_fault_and_fails_over() -> None:
    """The first node's address leads to the other's peer API, which refuses a call
    signed for someone else (401): unlike an engine's 4xx, that is the node's fault."""
    outcomes: list[Outcome] = []
    async with trio.open_nursery() as nursery:
        mesh = await _mesh(nursery, outcomes)
        assert mesh.front is not None
        first, second = mesh.front.decide("m")[0].order
        mesh.members[first].peer = mesh.members[second].peer
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            r = await client.post(mesh.url + CHAT, json={"model": "m", "messages": USER})
        assert r.status_code == 200 and r.headers["x-populi-node"] == second
        attempts = mesh.front.recent_routes()[-1]["attempts"]
        assert attempts[0].startswith(
            f"{mesh.members[first].name}: refused: its peer API answered 401: "
        ), attempts
        assert [(o.node, o.success) for o in outcomes] == [(first, False), (second, True)]
        nursery.cancel_scope.cancel()


async def test_a_4xx_to_a_continuation_costs_no_reliability() -> None:
    """Alice stalls mid-stream; bob refuses the continuation (more tokens than its
    context): the stream ends with an error event, and only alice lost reliability."""
    outcomes: list[Outcome] = []
    async with trio.open_nursery() as nursery:
        mesh = await _mesh(
            nursery, outcomes, a=StandinConfig(model="m", tokens=30, stall_at=5),
            b=StandinConfig(model="m", tokens=30, context_length=20), stall_timeout=0.3,
        )  # fmt: skip
        assert mesh.front is not None
        if mesh.front.decide("m")[0].order[0] != ALICE.node_id:
            mesh.members[BOB.node_id].models = {"m": {"inflight": 3}}  # alice ranks first
        body = {"model": "m", "messages": USER, "max_tokens": 30, "stream": True}
        with trio.fail_after(10):
            async with (
                httpx.AsyncClient(trust_env=False, timeout=10) as client,
                client.stream("POST", mesh.url + CHAT, json=body) as r,
            ):
                lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        text = "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content") or "" for line in lines[:-1]
        )
        assert r.status_code == 200 and text == words(5)
        assert "no other node could continue" in lines[-1]
        attempts = mesh.front.recent_routes()[-1]["attempts"]
        assert "stall" in attempts[0]
        assert attempts[1] == "bob: client error (400) to the continuation"
        assert [(o.node, o.success) for o in outcomes] == [(ALICE.node_id, False)]
        nursery.cancel_scope.cancel()
