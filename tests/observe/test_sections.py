"""`observe.sections`: the dashboard's task, model and route rows (pure functions)."""

from __future__ import annotations

from typing import Any

from populi_p2p.observe.sections import (
    MAX_ROUTE_ROWS,
    MAX_TASK_ROWS,
    model_rows,
    route_rows,
    task_rows,
)

ROWS = [
    {"id": "old-done", "phase": "succeeded", "epoch": 1, "owner": "id-a", "age": 90.0,
     "finished": True, "kind": "batch", "exit_code": 0, "why": None},
    {"id": "new-done", "phase": "failed", "epoch": 2, "owner": "id-zzzzzzzzzzzzz",
     "age": 5.0, "finished": True, "kind": "batch", "exit_code": 3, "why": None},
    {"id": "waiting", "phase": "pending", "epoch": 0, "owner": None, "age": 50.0,
     "finished": False, "kind": "batch", "exit_code": None, "why": "labels=2"},
]  # fmt: skip


def test_task_rows_put_live_tasks_first_then_the_newest_ended() -> None:
    names = {"id-a": "alpha"}
    out = task_rows(ROWS, lambda n: names.get(n, "?"))
    assert [r["id"] for r in out] == ["waiting", "new-done", "old-done"]  # live first
    assert [r["owner"] for r in out] == [None, "id-zzzzzzzzz", "alpha"]  # names, else ids
    assert out[2]["owner_id"] == "id-a" and out[0]["why"] == "labels=2"
    assert out[1]["exit_code"] == 3 and out[1]["age_s"] == 5.0 and out[1]["epoch"] == 2


def test_task_rows_are_bounded_and_the_cut_keeps_live_tasks() -> None:
    assert len(task_rows(ROWS * 40, lambda n: "?")) == MAX_TASK_ROWS
    live = [{"id": f"live-{i}", "age": float(i)} for i in range(3)]
    ended = [{"id": f"done-{i}", "age": float(i), "finished": True} for i in range(10)]
    out = task_rows([*ended, *live], lambda n: "?", limit=4)
    assert [r["id"] for r in out] == ["live-0", "live-1", "live-2", "done-0"]


def test_a_task_id_is_shortened_for_the_eye_and_kept_whole_beside_it() -> None:
    (row,) = task_rows([{"id": "t" * 40, "owner": "n" * 40}], lambda n: "")
    assert row["task"] == "t" * 12 and row["id"] == "t" * 40
    assert row["owner"] == "n" * 12 and row["owner_id"] == "n" * 40  # "" is no name


def test_model_rows_name_the_serving_nodes_sorted() -> None:
    models = {
        "data": [
            {"id": "llama",
             "nodes": [{"name": "b", "kind": "llama.cpp"}, {"name": "a", "kind": "llama.cpp"}]},
            {"id": "orphan", "nodes": None},
        ]
    }  # fmt: skip
    assert model_rows(models) == [
        {"model": "llama", "served_by": "a, b", "nodes": 2, "engine": "llama.cpp"},
        {"model": "orphan", "served_by": "", "nodes": 0, "engine": ""},
    ]
    assert model_rows({}) == []


def test_route_rows_are_the_newest_first_and_bounded() -> None:
    recent: list[dict[str, Any]] = [
        {"at": float(i), "model": "m", "node": "b", "attempts": ["a: refused", "b: served"]}
        for i in range(30)
    ]
    routes = route_rows(recent)
    assert len(routes) == MAX_ROUTE_ROWS
    assert [r["at"] for r in routes[:2]] == [29.0, 28.0]  # newest first
    assert routes[-1]["at"] == 30.0 - MAX_ROUTE_ROWS
    assert routes[0]["attempts"] == "a: refused; b: served" and routes[0]["served_by"] == "b"
    assert route_rows([{"at": 1.0}])[0]["attempts"] == ""
