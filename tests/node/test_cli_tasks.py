"""`populi-node submit|tasks|task|explain|cancel|logs|fetch|drain|undrain`.

Each command runs through `populi-node`'s own parser against a stand-in API client:
what it asks the daemon, what it prints and its exit code. The spec's one-line errors
are also in tests/leases/driver/test_service.py, hostile text in test_cli_terminal.py,
and `submit --wait` against real daemons in tests/mesh/test_submit_wait.py.
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from populi_p2p import cli_tasks
from populi_p2p.cli import _build_parser, main
from populi_p2p.cli_tasks import TaskCliError, _age, _named, _Output, _owner_name, build_spec
from tests.node.fake_api import FakeApi, InTurn, serve

TID = "7a5c" * 16
A, B = "a" * 64, "b" * 64
MEMBERS = [{"node_id": A, "name": "alpha"}, {"node_id": B, "name": "?"}]


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polls go round at once (each still asks the stand-in daemon)."""
    monkeypatch.setattr(cli_tasks, "WAIT_POLL", 0.0)
    monkeypatch.setattr(cli_tasks, "DRAIN_WAIT", 0.0)


def submit_args(*argv: str) -> argparse.Namespace:
    return _build_parser().parse_args(["submit", *argv])


####################################################################################
# The spec, built and checked before the daemon is asked


def test_every_flag_lands_in_the_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = submit_args(
        "--gpus", "2", "--vram", "16GiB", "--min-cc", "8.6", "--cpus", "1.5", "--ram", "1GB",
        "--label", "zone=x", "--prefer", "rack=r1", "--kind", "training", "--timeout", "90m",
        "--retries", "0", "--env", "A=b=c", "--env", "EMPTY=", "--no-network",
        "--input", "data.csv:in.csv", "--output", "out", "--", "python", "job.py", "--", "x",
    )  # fmt: skip
    assert build_spec(args) == {
        "kind": "training", "gpus": 2, "vram": 16 << 30, "min_cc": "8.6", "cpus": 1.5,
        "ram": 10**9, "labels": ["zone=x"], "prefer": ["rack=r1"], "timeout": 5400.0,
        "retries": 0, "env": {"A": "b=c", "EMPTY": ""}, "no_network": True,
        "command": ["python", "job.py", "--", "x"], "outputs": ["out"],
        "input_files": [{"path": str(tmp_path / "data.csv"), "name": "in.csv"}],
    }  # fmt: skip


def test_the_defaults_make_a_small_batch_task() -> None:
    spec = build_spec(submit_args("--", "true"))
    assert spec["kind"] == "batch" and spec["command"] == ["true"]
    assert (spec["gpus"], spec["vram"], spec["ram"], spec["min_cc"]) == (0, 0, 0, "0.0")
    assert spec["timeout"] == 3600.0 and spec["retries"] == 2 and "input_files" not in spec


def test_a_namespace_without_the_artifact_flags_still_builds() -> None:
    args = submit_args("--", "true")
    del args.input, args.output
    assert build_spec(args)["outputs"] == []


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--env", "=v", "--", "x"], "--env '=v': expected K=V"),
        (["--prefer", "=v", "--", "x"], "--prefer '=v': expected k=v"),
        (["--min-cc", "8.", "--", "x"], "--min-cc '8.': expected a version like 8.0"),
        (["--min-cc", "v8", "--", "x"], "--min-cc 'v8': expected a version like 8.0"),
        ([], "no command given: put it after --, e.g. submit -- python job.py"),
        (["--output", "../x", "--", "x"], "bad task: output '../x': a path relative to"),
    ],
)
def test_a_bad_flag_is_one_line(argv: list[str], says: str) -> None:
    with pytest.raises(TaskCliError) as info:
        build_spec(submit_args(*argv))
    assert str(info.value).startswith(says) and "\n" not in str(info.value)


def test_a_bad_spec_is_exit_1_and_never_sent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = serve(monkeypatch, cli_tasks, {})
    assert main(["submit", "--env", "NOPE", "--", "x"]) == 1
    assert api.calls == []
    assert capsys.readouterr().err == "populi-node: error: --env 'NOPE': expected K=V\n"


####################################################################################
# submit, and submit --wait


def test_submit_prints_the_id_and_returns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = serve(monkeypatch, cli_tasks, {"/v1/tasks": {"id": TID}})
    assert main(["submit", "--", "echo", "hi"]) == 0
    ((method, path, body),) = api.calls
    assert (method, path, body["command"]) == ("POST", "/v1/tasks", ["echo", "hi"])
    assert api.timeouts == [cli_tasks.SUBMIT_TIMEOUT]
    assert capsys.readouterr().out == f"{TID}\n"


def task(phase: str, epoch: int, owner: str | None, **more: Any) -> dict[str, Any]:
    ran = phase in ("running", "succeeded", "failed")
    row = {"id": TID, "phase": phase, "epoch": epoch, "owner": owner, "finished": False,
           "epochs": [{"epoch": epoch, "phase": phase}] if ran else []}  # fmt: skip
    row.update(more)
    return row


def logs(data: bytes, offset: int, done: bool) -> dict[str, Any]:
    return {"data": base64.b64encode(data).decode(), "offset": offset, "done": done}


def test_submit_wait_streams_the_output_and_exits_with_the_tasks_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    states = InTurn([
        task("pending", 0, None), task("running", 1, A),
        task("succeeded", 1, A, finished=True, exit_code=3),
    ])  # fmt: skip
    out = f"/v1/tasks/{TID}/logs?stream=stdout&offset="
    err = f"/v1/tasks/{TID}/logs?stream=stderr&offset="
    serve(monkeypatch, cli_tasks, {
        "/v1/tasks": {"id": TID}, "/v1/members": MEMBERS, f"/v1/tasks/{TID}": states,
        out + "0": logs(b"hello ", 6, False), out + "6": InTurn([logs(b"", 6, False),
                                                                 logs(b"world\n", 12, True)]),
        err + "0": logs(b"warn\n", 5, True),
    })  # fmt: skip
    assert main(["submit", "--wait", "--", "x"]) == 3
    captured = capsys.readouterr()
    assert captured.out == f"{TID}\nhello world\n"
    phases = [line.rsplit(" ", 1)[0] for line in captured.err.splitlines() if "epoch" in line]
    assert phases == ["pending epoch 0 owner -", "running epoch 1 owner alpha",
                      "succeeded epoch 1 owner alpha"]  # fmt: skip
    assert "warn" in captured.err.splitlines()


@pytest.mark.parametrize(("code", "exit"), [(0, 0), (255, 255), (256, 1), (-9, 1), (None, 1)])
def test_an_exit_code_outside_0_to_255_is_1(
    code: Any, exit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = task("failed", 1, None, finished=True, exit_code=code, epochs=[])
    serve(monkeypatch, cli_tasks,
          {"/v1/tasks": {"id": TID}, "/v1/members": [], f"/v1/tasks/{TID}": done})  # fmt: skip
    assert main(["submit", "--wait", "--", "x"]) == exit


def test_an_owner_that_cannot_be_read_is_said_once_the_task_ended(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from populi_p2p.api import ApiError

    done = task("succeeded", 1, A, finished=True, exit_code=0)
    serve(monkeypatch, cli_tasks, {
        "/v1/tasks": {"id": TID}, "/v1/members": MEMBERS, f"/v1/tasks/{TID}": done,
        f"/v1/tasks/{TID}/logs?stream=stdout&offset=0": ApiError("owner alpha is gone"),
    })  # fmt: skip
    assert main(["submit", "--wait", "--", "x"]) == 0
    assert "output not read to its end: owner alpha is gone" in capsys.readouterr().err


def test_ctrl_c_while_following_says_how_to_cancel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve(monkeypatch, cli_tasks, {
        "/v1/tasks": {"id": TID}, "/v1/members": [], f"/v1/tasks/{TID}": KeyboardInterrupt(),
    })  # fmt: skip
    assert main(["submit", "--wait", "--state-dir", str(tmp_path), "--", "x"]) == 130
    assert capsys.readouterr().err == (
        f"\nstill running: populi-node cancel {TID} --state-dir {tmp_path}\n"
    )


def test_the_output_follows_the_latest_epoch_that_ran() -> None:
    output = _Output(FakeApi({}), TID)
    assert not output.started and output.copy() is False  # nothing ran: nothing asked
    epochs = [{"epoch": 1, "phase": "failed"}, {"epoch": 2, "phase": "claimed"}]
    assert output.follow_epoch({"epochs": epochs}) is True and output.started
    assert output.follow_epoch({"epochs": epochs}) is False  # epoch 2 has not run yet
    epochs[1]["phase"] = "running"
    assert output.follow_epoch({"epochs": epochs}) is True
    assert output.follow_epoch({"epochs": epochs[:1]}) is False  # never back


####################################################################################
# Reading tasks


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.4, "0s"), (59, "59s"), (60, "1m"), (3599, "60m"), (3600, "1h"),
     (86400 * 3, "3d")],
)  # fmt: skip
def test_ages_are_one_unit(seconds: float | None, text: str) -> None:
    assert _age(seconds) == text


def test_node_ids_are_shown_as_names() -> None:
    names = {A: "alpha"}
    assert _owner_name(A, names) == "alpha"
    assert _owner_name(B, names) == B[:12]
    assert _owner_name(None, names) == _owner_name("", names) == "-"
    assert _named(f"granted by {A} and {B}", names) == f"granted by alpha and {B}"


ROWS = [
    {"id": TID, "kind": "batch", "phase": "running", "epoch": 2, "owner": A, "age": 120.0,
     "why": None},
    {"id": "9" * 64, "kind": None, "phase": "pending", "epoch": 0, "owner": None, "age": 5.0,
     "why": "no node has 4 GPUs"},
    {"id": "8" * 64, "kind": "agent", "phase": "running", "epoch": 1, "owner": B, "age": None,
     "why": ""},
]  # fmt: skip


def test_tasks_table_with_names(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    serve(monkeypatch, cli_tasks, {"/v1/tasks": ROWS, "/v1/members": MEMBERS})
    assert main(["tasks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "KIND", "PHASE", "EPOCH", "OWNER", "AGE", "WHY", "PENDING"]
    assert lines[1].split() == [TID[:12], "batch", "running", "2", "alpha", "2m"]
    assert lines[2].split() == [
        "9" * 12,
        "?",
        "pending",
        "0",
        "-",
        "5s",
        *["no", "node", "has", "4", "GPUs"],
    ]
    assert lines[3].split() == ["8" * 12, "agent", "running", "1", B[:12], "-"]  # "?": no name


@pytest.mark.parametrize(
    ("argv", "ids"),
    [
        (["--phase", "pending"], ["9" * 64]),
        (["--owner", "alpha"], [TID]),
        (["--owner", "bbbb"], ["8" * 64]),
        (["--owner", "nobody"], []),
        (["--phase", "running", "--owner", "aaa"], [TID]),
    ],
)
def test_tasks_filters_by_phase_and_owner_name_or_id_prefix(
    argv: list[str], ids: list[str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    serve(monkeypatch, cli_tasks, {"/v1/tasks": ROWS, "/v1/members": MEMBERS})
    assert main(["tasks", "--json", *argv]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == ids


def test_task_shows_its_spec_epochs_inputs_and_outputs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    detail = {
        "id": TID, "phase": "succeeded", "epoch": 2, "why": None,
        "spec": {"command": ["python", "job.py"], "kind": "batch", "requirements": {"gpus": 1},
                 "replicas": [B, A],
                 "inputs": [{"name": "in", "dir": True, "size": 10, "sha256": "c" * 64}]},
        "epochs": [{"epoch": 1, "owner": B, "phase": "failed", "exit_code": None},
                   {"epoch": 2, "owner": A, "phase": "succeeded", "exit_code": 0}],
        "result": {"exit_code": 0, "duration": 1.25, "holders": [A, B],
                   "outputs": [{"path": "out.txt", "dir": False, "size": 3, "sha256": "d" * 64}],
                   "output_tail": "done\n"},
    }  # fmt: skip
    serve(monkeypatch, cli_tasks, {f"/v1/tasks/{TID}": detail, "/v1/members": MEMBERS})
    assert main(["task", TID]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"task     {TID}",
        "phase    succeeded (epoch 2)",
        "command  python job.py",
        "kind     batch",
        'needs    {"gpus": 1}',
        f"replicas {B[:12]} alpha",
        f"input    in (dir, 10 bytes) sha256 {'c' * 16}",
        f"epoch 1: {B[:12]} failed",
        "epoch 2: alpha succeeded exit 0",
        "result   exit 0 in 1.2s",
        f"output   out.txt (file, 3 bytes) sha256 {'d' * 16} held by alpha {B[:12]}",
        "done",
        "",
    ]


def test_a_pending_task_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    detail = {"id": TID, "phase": "pending", "epoch": 0, "spec": None, "epochs": [],
              "why": "no node has 4 GPUs"}  # fmt: skip
    serve(monkeypatch, cli_tasks, {f"/v1/tasks/{TID}": detail, "/v1/members": []})
    assert main(["task", TID]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "pending  no node has 4 GPUs" and "command  " in out


def test_explain_names_the_nodes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = {"id": TID, "phase": "running", "claim": f"epoch 1 granted to {A}",
              "placement": None}  # fmt: skip
    serve(monkeypatch, cli_tasks, {f"/v1/tasks/{TID}/explain": answer, "/v1/members": MEMBERS})
    assert main(["explain", TID]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"task {TID} (running)",
        "lease:     epoch 1 granted to alpha",
        "placement: not placed by this node yet",
    ]
    assert main(["explain", TID, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == answer


####################################################################################
# Acting on tasks and on the node


def test_cancel_without_a_key_sends_no_proof(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = serve(monkeypatch, cli_tasks, {f"/v1/tasks/{TID[:8]}/cancel": {"id": TID}})
    assert main(["cancel", TID[:8]]) == 0
    assert api.calls == [("POST", f"/v1/tasks/{TID[:8]}/cancel", None)]
    assert capsys.readouterr().out == f"cancelled {TID}\n"


def test_logs_prints_from_the_start_and_follows_until_done(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = f"/v1/tasks/{TID}/logs?stream=stderr&offset="
    answers = {path + "0": logs(b"a\n", 2, False),
               path + "2": InTurn([logs(b"", 2, False), logs(b"b\n", 4, True)])}  # fmt: skip
    api = serve(monkeypatch, cli_tasks, answers)
    assert main(["logs", TID, "--stderr", "--follow"]) == 0
    assert capsys.readouterr().out == "a\nb\n"
    assert api.paths() == [path + "0", path + "2", path + "2"]
    api = serve(monkeypatch, cli_tasks, {path + "0": logs(b"a\n", 2, False),
                                         path + "2": logs(b"", 2, False)})  # fmt: skip
    assert main(["logs", TID, "--stderr"]) == 0  # without --follow: what there is now
    assert api.paths() == [path + "0", path + "2"]


def test_fetch_asks_for_the_whole_id_into_an_absolute_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"dir": False, "to": str(tmp_path / "out.txt"), "size": 3, "sha256": "e" * 64},
            {"dir": True, "to": str(tmp_path / "d"), "size": 9, "sha256": "f" * 64}]  # fmt: skip
    api = serve(monkeypatch, cli_tasks, {
        f"/v1/tasks/{TID[:6]}": {"id": TID}, "/v1/artifacts/fetch": {"outputs": rows},
    })  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(["fetch", TID[:6]]) == 0
    assert api.calls[-1] == ("POST", "/v1/artifacts/fetch", {"task": TID, "to": str(tmp_path)})
    assert api.timeouts[-1] == cli_tasks.FETCH_TIMEOUT
    assert capsys.readouterr().out.splitlines() == [
        f"file {tmp_path / 'out.txt'}  3 bytes  sha256 {'e' * 16}",
        f"dir  {tmp_path / 'd'}  9 bytes  sha256 {'f' * 16}",
    ]


def test_drain_and_undrain(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = serve(monkeypatch, cli_tasks, {"/v1/drain": {"running": 2}, "/v1/undrain": {}})
    assert main(["drain"]) == 0 and main(["drain", "--handoff"]) == 0 and main(["undrain"]) == 0
    assert [(m, p, b) for m, p, b in api.calls] == [
        ("POST", "/v1/drain", {"handoff": False}),
        ("POST", "/v1/drain", {"handoff": True}),
        ("POST", "/v1/undrain", None),
    ]
    assert capsys.readouterr().out.splitlines() == [
        "draining: no new work lands here",
        "draining: no new work lands here, handing off 2 running",
        "taking work again",
    ]
