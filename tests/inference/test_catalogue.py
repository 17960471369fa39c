"""`ModelCatalogue`: ``/v1/models`` and the errors that say why no node serves a model."""

from __future__ import annotations

from populi_p2p.inference.catalogue import ModelCatalogue
from populi_p2p.inference.route import Candidate, RouteDecision

LLAMA = {"kind": "llama.cpp", "ctx": 8192}


def candidate(node: str, state: str = "alive", **models: dict[str, object]) -> Candidate:
    return Candidate(f"id-{node}", node, state, False, models)


VIEW = [
    candidate("b", llama=LLAMA),
    candidate("a", llama={"kind": "vllm", "ctx": 0}, qwen={}),
    candidate("dead", "dead", ghost=LLAMA),
]


def test_models_lists_what_alive_members_serve_sorted() -> None:
    out = ModelCatalogue(lambda: VIEW).models()
    assert out["object"] == "list"
    assert [m["id"] for m in out["data"]] == ["llama", "qwen"]  # not the dead one's
    llama = out["data"][0]
    assert llama["object"] == "model" and llama["owned_by"] == "populi"
    assert llama["nodes"] == [
        {"node": "id-b", "name": "b", "kind": "llama.cpp", "context_length": 8192},
        {"node": "id-a", "name": "a", "kind": "vllm", "context_length": None},  # 0: unknown
    ]


def test_an_unknown_model_is_404_listing_what_the_mesh_has() -> None:
    nothing = RouteDecision("mistral", (), {}, {}, {})
    status, body = ModelCatalogue.no_route("mistral", nothing, VIEW)
    assert status == 404
    assert body["error"]["code"] == "model_not_found"
    assert body["error"]["message"].endswith("the mesh has: llama, qwen")
    status, body = ModelCatalogue.no_route("mistral", nothing, [])
    assert "none (no engine is attached)" in body["error"]["message"]


def test_a_served_model_with_no_eligible_node_is_503_with_each_reason() -> None:
    ruled_out = {"id-b": "draining", "id-a": "breaker open", "id-x": "not serving it"}
    decision = RouteDecision("llama", (), {}, ruled_out, {})
    status, body = ModelCatalogue.no_route("llama", decision, VIEW)
    assert status == 503 and body["error"]["type"] == "no_capable_node"
    # Only nodes serving the model, by name, sorted by id.
    assert "(a: breaker open; b: draining)" in body["error"]["message"]
