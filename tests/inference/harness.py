"""In-process inference nodes on loopback: real stand-in engines, real peer APIs with
signed calls, real `InferenceService`s; the mesh view is a plain dict the test edits
(so "suspect" or "dead" is one assignment, not a wait for SWIM)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import trio

from populi_p2p.inference._asgi import serve_tcp
from populi_p2p.inference._tls import tls_context
from populi_p2p.inference.engines import EngineService
from populi_p2p.inference.keys import ApiKeyChecker
from populi_p2p.inference.peer_api import PeerApi, PeerRoutes
from populi_p2p.inference.peer_auth import PeerCallSigner, PeerCallVerifier
from populi_p2p.inference.peer_client import PeerClient
from populi_p2p.inference.route import Candidate
from populi_p2p.inference.service import InferenceService
from populi_p2p.leases.reliability import Outcome
from populi_p2p.testing.standin import StandinConfig, StandinEngine

from .conftest import AUTHORITY, CERTS, keys

ALL = list(CERTS)  # node ids of ALICE and BOB (enrolled)


@attrs.define
class Member:
    node_id: str
    name: str
    state: str = "alive"
    models: dict[str, Any] = attrs.field(factory=dict)
    peer: tuple[str, int] | None = None
    engine_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    node_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    engine: StandinEngine | None = None
    engine_url: str = ""
    engines: EngineService | None = None

    def kill(self) -> None:
        """As kill -9: the engine and the peer API go at once, no goodbye."""
        self.engine_scope.cancel()
        self.node_scope.cancel()


class Mesh:
    """Members by node id; `front` is the accepting node's service."""

    def __init__(self) -> None:
        self.members: dict[str, Member] = {}
        self.front: InferenceService | None = None
        self.front_port = 0

    def view(self) -> list[Candidate]:
        return [
            Candidate(m.node_id, m.name, m.state, False, m.models, rtt=0.001)
            for m in self.members.values()
        ]

    def address_of(self, node: str) -> tuple[str, int] | None:
        m = self.members.get(node)
        return None if m is None else m.peer

    async def add_serving(
        self, nursery: trio.Nursery, identity: Any, name: str, config: StandinConfig
    ) -> Member:
        """A member with a stand-in engine, its own service and peer API."""
        member = Member(identity.node_id, name)
        self.members[identity.node_id] = member
        engine = member.engine = StandinEngine(config)

        async def serve_engine(task_status: trio.TaskStatus[int]) -> None:
            with member.engine_scope:
                await serve_tcp(engine.app, "127.0.0.1", 0, logger_name="t",
                                task_status=task_status)  # fmt: skip

        engine_port = await nursery.start(serve_engine)
        member.engine_url = f"http://127.0.0.1:{engine_port}"

        async def publish(name: str, value: dict[str, Any] | None) -> None:
            member.models = value or {}

        engines = EngineService([f"http://127.0.0.1:{engine_port}"], publish, interval=0.2)
        member.engines = engines
        routes = PeerRoutes()
        service = InferenceService(
            identity.node_id, view=self.view, address_of=self.address_of, peer_client=None,
            engines=engines, listen=None,
        )  # fmt: skip
        service.register_peer_routes(routes)
        api = PeerApi(PeerCallVerifier(keys(identity), identity.node_id, clock=time.time),
                      routes, host="127.0.0.1", port=0)  # fmt: skip

        async def serve_node(task_status: trio.TaskStatus[int]) -> None:
            with member.node_scope:
                async with trio.open_nursery() as inner:
                    inner.start_soon(engines.run)
                    port = await inner.start(api.run)
                    task_status.started(port)

        port = await nursery.start(serve_node)
        member.peer = ("127.0.0.1", port)
        with trio.fail_after(5):
            while not member.models:
                await trio.sleep(0.01)  # the engine's first poll (bounded)
        return member

    async def start_front(
        self, nursery: trio.Nursery, identity: Any, *, stall_timeout: float | None = None,
        key_checker: ApiKeyChecker | None = None, first_token_timeout: float | None = None,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> InferenceService:  # fmt: skip
        self.members[identity.node_id] = Member(identity.node_id, "front")
        client = PeerClient(PeerCallSigner(identity, CERTS[identity.node_id], clock=time.time))
        service = InferenceService(
            identity.node_id, view=self.view, address_of=self.address_of, peer_client=client,
            engines=None, listen=("127.0.0.1", 0), keys=key_checker, stall_timeout=stall_timeout,
            state_of=lambda n: self.members[n].state if n in self.members else None,
            on_outcome=on_outcome,
        )  # fmt: skip
        if first_token_timeout is not None:
            service.relay.first_token_timeout = first_token_timeout
        self.front_port = await nursery.start(service.run)
        self.front = service
        return service

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.front_port}"


async def stream_chat(
    url: str, model: str, *, on_token: Any = None, headers: dict[str, str] | None = None,
    path: str = "/v1/chat/completions",
) -> tuple[httpx.Response, str, list[str]]:  # fmt: skip
    """POST a streamed request; (response, text, raw data lines). `on_token(i)` after each."""
    body: dict[str, Any] = {"model": model, "stream": True}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "count"}]
    else:
        body["prompt"] = "count:"
    text: list[str] = []
    lines: list[str] = []
    async with (
        httpx.AsyncClient(timeout=30, trust_env=False, verify=tls_context()) as client,
        client.stream("POST", url + path, json=body, headers=headers) as r,
    ):
        if r.status_code != 200:
            await r.aread()
            return r, "", []
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            lines.append(line[6:])
            if line[6:] == "[DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                continue
            choice = chunk["choices"][0]
            piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            if piece:
                text.append(piece)
                if on_token is not None:
                    await on_token(len(text))
    return r, "".join(text), lines


def words(n: int) -> str:
    return "".join(f"w{i} " for i in range(n))


_ = AUTHORITY
