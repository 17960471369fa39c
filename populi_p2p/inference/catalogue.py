"""What the mesh serves, as this node sees it: ``GET /v1/models`` and the errors that
list the models or say why each candidate was ruled out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .openai_errors import openai_error
from .route import Candidate, RouteDecision

__all__ = ["ModelCatalogue"]


class ModelCatalogue:
    """Args: view: the mesh as this node sees it, one `Candidate` per member."""

    def __init__(self, view: Callable[[], list[Candidate]]) -> None:
        self._view = view

    def models(self) -> dict[str, Any]:
        """``/v1/models``: every model some alive member serves, with those members."""
        served: dict[str, list[dict[str, Any]]] = {}
        for c in self._view():
            if c.state != "alive":
                continue
            for model, facts in c.models.items():
                served.setdefault(model, []).append(
                    {
                        "node": c.node_id,
                        "name": c.name,
                        "kind": facts.get("kind"),
                        "context_length": facts.get("ctx") or None,
                    }
                )
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "owned_by": "populi", "nodes": nodes}
                for m, nodes in sorted(served.items())
            ],
        }

    @staticmethod
    def no_route(
        model: str, decision: RouteDecision, view: list[Candidate]
    ) -> tuple[int, dict[str, Any]]:
        """(status, body) when no node can serve `model`: 404 listing the models the
        mesh has, or 503 saying why each node serving it was ruled out."""
        everywhere = sorted({m for c in view if c.state == "alive" for m in c.models})
        if not any(model in c.models for c in view):
            known = ", ".join(everywhere) if everywhere else "none (no engine is attached)"
            return 404, openai_error(
                f"model {model!r} is not served by any node of the mesh; the mesh has: {known}",
                "invalid_request_error",
                "model_not_found",
            )
        names = {c.node_id: c.name for c in view}
        why = "; ".join(
            f"{names.get(n, n)}: {r}"
            for n, r in sorted(decision.ruled_out.items())
            if any(model in c.models for c in view if c.node_id == n)
        )
        return 503, openai_error(
            f"no node can serve {model!r} now ({why}). Retry shortly, or attach an engine"
            " serving it (populi-node up --engine URL).",
            "no_capable_node",
        )
