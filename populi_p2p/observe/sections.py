"""The dashboard's work sections, as flat rows: tasks, models and recent inference
routes (`ObserveView.provide`).

Pure functions of what the services already answer (the lease table's rows, the model
catalogue, the request log), so each is tested alone. Names where a person reads, ids
kept beside them; every section is bounded, so one snapshot stays small however much
work the mesh holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

__all__ = ["MAX_ROUTE_ROWS", "MAX_TASK_ROWS", "model_rows", "route_rows", "task_rows"]

#: Most task rows in one snapshot: every unfinished task first, then the latest ended.
MAX_TASK_ROWS: Final = 50
#: Most recent routes in one snapshot, newest first.
MAX_ROUTE_ROWS: Final = 20


def task_rows(
    rows: Iterable[Mapping[str, Any]],
    name_of: Callable[[str], str],
    limit: int = MAX_TASK_ROWS,
) -> list[dict[str, Any]]:
    """The lease table's rows (`LeaseService.rows`) for the page: running and pending
    first, then the most recent ended, newest first; the owner as a name (`name_of`:
    "?" when unknown, then the start of its id is shown) and its id in ``owner_id``."""
    live = [r for r in rows if not r.get("finished")]
    ended = [r for r in rows if r.get("finished")]
    newest_first = sorted(ended, key=lambda r: r.get("age") or 0.0)
    out = []
    for r in [*sorted(live, key=lambda r: r.get("age") or 0.0), *newest_first][:limit]:
        owner = r.get("owner")
        name = name_of(owner) if owner else None
        out.append(
            {
                "task": str(r.get("id", ""))[:12],
                "id": r.get("id"),
                "kind": r.get("kind"),
                "phase": r.get("phase"),
                "epoch": r.get("epoch"),
                # A name once the owner's record verified here; its id's start before.
                "owner": name if name not in ("", "?") else (owner or "")[:12] or None,
                "owner_id": owner,
                "age_s": r.get("age"),
                "exit_code": r.get("exit_code"),
                "why": r.get("why"),
            }
        )
    return out


def model_rows(models: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``/v1/models`` (the catalogue: what alive members serve) as one row per model,
    with the names of the nodes serving it."""
    out = []
    for m in models.get("data", []):
        nodes = m.get("nodes") or []
        out.append(
            {
                "model": m.get("id"),
                "served_by": ", ".join(sorted(str(n.get("name") or "?") for n in nodes)),
                "nodes": len(nodes),
                "engine": ", ".join(sorted({str(n.get("kind")) for n in nodes if n.get("kind")})),
            }
        )
    return out


def route_rows(recent: list[dict[str, Any]], limit: int = MAX_ROUTE_ROWS) -> list[dict[str, Any]]:
    """The request log (`RequestLog.recent`, oldest first) as the newest `limit` rows:
    when, which model, the node that served it (a name), what was tried."""
    out = []
    for entry in reversed(recent[-limit:]):
        attempts = entry.get("attempts") or []
        out.append(
            {
                "at": entry.get("at"),
                "model": entry.get("model"),
                "served_by": entry.get("node"),
                "stream": entry.get("stream"),
                "tokens": entry.get("tokens"),
                "attempts": "; ".join(str(a) for a in attempts),
                "decision_ms": entry.get("decision_ms"),
            }
        )
    return out
