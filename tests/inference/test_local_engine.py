"""`LocalEngine` without an engine for the model asked: a 503 the caller can read as
a stream, as it reads an engine's answer (a peer call for a model this node does not
serve used to break on `httpx.StreamConsumed` instead of answering 503)."""

from __future__ import annotations

import json

from populi_p2p.inference.local_engine import PEER_PREFIX, LocalEngine
from populi_p2p.inference.peer_api import PeerRequest


async def test_a_peer_call_for_a_model_served_nowhere_here_is_a_readable_503() -> None:
    engine = LocalEngine(None)
    try:
        body = json.dumps({"model": "nope", "messages": []}).encode()
        request = PeerRequest("caller", "POST", f"{PEER_PREFIX}/chat/completions", "", body)
        answer = await engine.serve_peer(request)
        assert answer.status == 503
        assert not isinstance(answer.body, bytes)
        data = b"".join([chunk async for chunk in answer.body])
        error = json.loads(data)["error"]
        assert "engine_unavailable" in json.dumps(error)
        assert "nope" in error["message"]
    finally:
        await engine.aclose()
