"""`populi-node model add|ls|rm|pull`, `deploy`, `deployments`, `undeploy`.

Each command runs through `populi-node`'s own parser against a stand-in API client:
what it asks the daemon, what it prints, and its exit code.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from populi_p2p import cli_models
from populi_p2p.cli import main
from populi_p2p.cli_models import _size, progress_line
from tests.node.fake_api import InTurn, serve

HASH = "ab" * 32


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polls go round at once (each still asks the stand-in daemon)."""
    monkeypatch.setattr(cli_models, "PULL_POLL", 0.0)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536 * 1024, "1.5 MiB"),
        (5 << 30, "5.0 GiB"), (2048 << 30, "2048.0 GiB"), (2.5, "2 B"), ("12", "0 B"),
        (None, "0 B"),
    ],
)  # fmt: skip
def test_sizes_are_shown_in_binary_units_up_to_gib(n: object, text: str) -> None:
    assert _size(n) == text


def test_a_progress_line_says_how_far_how_fast_and_from_whom() -> None:
    row = {
        "name": "m.gguf", "state": "fetching", "done": 3, "chunks": 12, "size": 3 << 30,
        "rate": 5 * 2**20,
        "holders": {"a": {"skipped": False}, "b": {"skipped": True}, "c": {}},
    }  # fmt: skip
    assert progress_line(row) == (
        "m.gguf fetching  25.0% of 3.0 GiB at 5.0 MiB/s from 2 holder(s), 1 skipped"
    )
    bare = {"name": "x\x1b[2J", "state": "queued"}  # nothing known yet; a hostile name
    assert progress_line(bare) == "x\\x1b[2J queued   0.0% of 0 B at 0.0 MiB/s from 0 holder(s)"


def test_model_add_sends_the_resolved_path_and_prints_the_blob(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")
    row = {"name": "tiny.gguf", "hash": HASH, "size": 2048}
    api = serve(monkeypatch, cli_models, {"/v1/blobs/add": row})
    monkeypatch.chdir(tmp_path)
    assert main(["model", "add", "tiny.gguf"]) == 0
    assert api.calls == [("POST", "/v1/blobs/add", {"path": str(model), "name": "tiny.gguf"})]
    assert api.timeouts == [cli_models.ADD_TIMEOUT]  # copying a big file takes a while
    assert capsys.readouterr().out == f"tiny.gguf {HASH} 2.0 KiB\n"
    assert main(["model", "add", str(model), "--name", "llama"]) == 0
    assert api.calls[-1][2]["name"] == "llama"


def test_model_add_of_no_file_is_one_line_and_asks_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = serve(monkeypatch, cli_models, {})
    assert main(["model", "add", str(tmp_path)]) == 1
    assert api.calls == []
    assert capsys.readouterr().err == (
        f"populi-node: error: {tmp_path} is not a file (give a model file, e.g. model.gguf)\n"
    )


BLOBS = {
    "local": [
        {"name": "a.gguf", "hash": "1" * 64, "size": 1 << 20, "complete": True,
         "holders": ["x", "y"], "pins": ["t1", "t2", "t3"]},
        {"name": "b.gguf", "hash": "2" * 64, "size": 10, "complete": False, "holders": [],
         "pins": []},
    ],
    "mesh": [{"names": ["c", "d"], "hash": "3" * 64, "size": 3 << 30, "holders": ["z"]}],
    "used": 1 << 20,
    "quota": 0,
}  # fmt: skip


def test_model_ls_lists_local_and_mesh_blobs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    serve(monkeypatch, cli_models, {"/v1/blobs": BLOBS})
    assert main(["model", "ls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "HASH", "SIZE", "WHERE", "PINNED", "BY"]
    assert lines[1].split() == ["a.gguf", "1" * 16, "1.0", "MiB", "local+2", "t1,t2"]
    assert lines[2].split() == ["b.gguf", "2" * 16, "10", "B", "partial"]
    assert lines[3].split() == ["c,d", "3" * 16, "3.0", "GiB", "1", "holder(s)"]
    assert lines[4] == "used 1.0 MiB of no quota"
    serve(monkeypatch, cli_models, {"/v1/blobs": dict(BLOBS, quota=2 << 30)})
    assert main(["model", "ls"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "used 1.0 MiB of 2.0 GiB"


def test_model_ls_json_is_what_the_daemon_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    serve(monkeypatch, cli_models, {"/v1/blobs": BLOBS})
    assert main(["model", "ls", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == BLOBS


def test_model_rm(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    api = serve(monkeypatch, cli_models, {"/v1/blobs/rm": {"name": "a.gguf", "hash": HASH}})
    assert main(["model", "rm", "a.gguf"]) == 0
    assert api.calls == [("POST", "/v1/blobs/rm", {"blob": "a.gguf"})]
    assert capsys.readouterr().out == f"removed a.gguf {HASH}\n"


def pull_row(state: str, done: int, **more: Any) -> dict[str, Any]:
    row = {"name": "a.gguf", "hash": HASH, "state": state, "done": done, "chunks": 4,
           "size": 4 << 20, "rate": 0, "holders": {"x": {}}}  # fmt: skip
    row.update(more)
    return row


def test_model_pull_polls_the_progress_until_done(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    progress = InTurn([pull_row("fetching", 2), pull_row("done", 4)])
    api = serve(
        monkeypatch, cli_models,
        {"/v1/blobs/pull": pull_row("queued", 0), f"/v1/blobs/progress?blob={HASH}": progress},
    )  # fmt: skip
    assert main(["model", "pull", "a.gguf"]) == 0
    assert api.paths() == ["/v1/blobs/pull", *[f"/v1/blobs/progress?blob={HASH}"] * 2]
    assert api.calls[0][2] == {"blob": "a.gguf"}
    lines = capsys.readouterr().out.splitlines()  # not a terminal: one line per poll
    assert [line.split()[1:3] for line in lines] == [
        ["queued", "0.0%"], ["fetching", "50.0%"], ["done", "100.0%"]
    ]  # fmt: skip


def test_a_failed_pull_exits_1_with_the_daemons_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = pull_row("failed", 1, error="no holder answered")
    progress = f"/v1/blobs/progress?blob={HASH}"
    serve(monkeypatch, cli_models, {"/v1/blobs/pull": pull_row("fetching", 0), progress: failed})
    assert main(["model", "pull", "a.gguf"]) == 1
    assert capsys.readouterr().err == "populi-node: error: no holder answered\n"


def test_pull_no_wait_starts_it_and_returns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = serve(monkeypatch, cli_models, {"/v1/blobs/pull": pull_row("queued", 0)})
    assert main(["model", "pull", "a.gguf", "--no-wait"]) == 0
    assert api.paths() == ["/v1/blobs/pull"]
    assert "queued" in capsys.readouterr().out


DEPLOYED = {"name": "tiny", "tasks": ["t1", "t2"], "blob": HASH, "size": 1 << 20}


def replicas(*states: str) -> dict[str, Any]:
    rows = [{"index": i, "state": s, "node": f"n{i}" if s == "serving" else None,
             "task": f"task{i}" * 4} for i, s in enumerate(states)]  # fmt: skip
    return {"deployments": [{"name": "other", "replicas": []}, {"name": "tiny", "replicas": rows}]}


def test_deploy_sends_the_spec_and_returns_at_once_without_wait(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = serve(monkeypatch, cli_models, {"/v1/deploy": DEPLOYED})
    argv = ["deploy", "tiny.gguf", "--replicas", "2", "--gpus", "1", "--vram", "8GiB"]
    assert main([*argv, "--ctx", "4096", "--as", "tiny"]) == 0
    assert api.calls == [(
        "POST", "/v1/deploy",
        {"model": "tiny.gguf", "replicas": 2, "gpus": 1, "vram": 8 << 30, "ctx": 4096,
         "name": "tiny"},
    )]  # fmt: skip
    assert api.timeouts == [cli_models.DEPLOY_TIMEOUT]
    assert capsys.readouterr().out == (
        f"deployed tiny: 2 replica(s) of blob {HASH[:16]} (1.0 MiB)\n"
    )


def test_deploy_with_a_bad_vram_is_one_line_and_asks_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = serve(monkeypatch, cli_models, {})
    assert main(["deploy", "m", "--vram", "lots"]) == 1
    assert api.calls == []
    err = capsys.readouterr().err
    assert (
        err.startswith("populi-node: error: --vram: invalid size 'lots'") and err.count("\n") == 1
    )


def test_deploy_wait_prints_each_change_until_every_replica_serves(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    states = InTurn([replicas("placing", "placing"), replicas("placing", "placing"),
                     replicas("serving", "placing"), replicas("serving", "serving")])  # fmt: skip
    serve(monkeypatch, cli_models, {"/v1/deploy": DEPLOYED, "/v1/deployments": states})
    assert main(["deploy", "tiny", "--replicas", "2", "--wait", "600"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "#0 placing, #1 placing", "#0 serving, #1 placing", "#0 serving, #1 serving"
    ]  # fmt: skip


def test_deploy_wait_gives_up_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    serve(monkeypatch, cli_models,
          {"/v1/deploy": DEPLOYED, "/v1/deployments": replicas("serving", "placing")})  # fmt: skip
    assert main(["deploy", "tiny", "--wait", "0"]) == 1
    assert capsys.readouterr().err == (
        "populi-node: error: not every replica serves after 0 s (see populi-node deployments)\n"
    )


def test_a_deployment_not_listed_yet_is_not_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    serve(monkeypatch, cli_models,
          {"/v1/deploy": DEPLOYED, "/v1/deployments": {"deployments": []}})  # fmt: skip
    assert main(["deploy", "tiny", "--wait", "0"]) == 1


def test_deployments_table_json_and_none(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    serve(monkeypatch, cli_models, {"/v1/deployments": replicas("serving", "placing")})
    assert main(["deployments"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines] == [
        ["MODEL", "REPLICA", "NODE", "TASK", "STATE"],
        ["tiny", "#0", "n0", "task0task0ta", "serving"],
        ["tiny", "#1", "-", "task1task1ta", "placing"],
    ]
    assert main(["deployments", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == replicas("serving", "placing")
    serve(monkeypatch, cli_models, {"/v1/deployments": {"deployments": []}})
    assert main(["deployments"]) == 0
    assert capsys.readouterr().out == "no deployments (populi-node deploy NAME --replicas N)\n"


def test_undeploy(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    api = serve(monkeypatch, cli_models, {"/v1/undeploy": {"name": "tiny", "cancelled": [1, 2]}})
    assert main(["undeploy", "tiny"]) == 0
    assert api.calls == [("POST", "/v1/undeploy", {"name": "tiny"})]
    assert capsys.readouterr().out == "undeployed tiny: 2 replica(s) stopped\n"


def test_the_daemons_refusal_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    serve(monkeypatch, cli_models, {})  # every path: "no answer", as an ApiError
    assert main(["model", "rm", "x"]) == 1
    assert capsys.readouterr().err == "populi-node: error: no answer for POST /v1/blobs/rm\n"


def test_the_socket_is_in_the_state_dir(tmp_path: Path) -> None:
    client = cli_models._client(argparse.Namespace(state_dir=tmp_path), timeout=7.0)
    assert client.socket_path == tmp_path / "api.sock"
