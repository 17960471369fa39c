"""The lease service's parts on their own: the placement view built from records, spec
checks in the CLI and the API, and what an executor's end hands back."""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from populi_p2p.api import ApiClient, ApiError, ConflictError, make_app, serve_api
from populi_p2p.cli import _build_parser, main
from populi_p2p.cli_tasks import TaskCliError, build_spec
from populi_p2p.executor.results import START_FAILED_CODE
from populi_p2p.executor.service import TaskExited
from populi_p2p.gpu import build_report
from populi_p2p.gpu._facts import GpuDevice, HardwareFacts, Source, Vendor
from populi_p2p.leases import (
    Cancel,
    ClaimRecord,
    LeaseConfig,
    Requirements,
    TaskEntry,
    TaskKind,
    TaskResult,
    TaskSpec,
    cancel_refusal,
)
from populi_p2p.leases._entry import Phase
from populi_p2p.leases.driver.service import SubmitError, hands_back
from populi_p2p.leases.driver.view import (
    candidate,
    gpu_slots,
    spec_from,
)
from populi_p2p.leases.placement import place
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.record import Capabilities, NodeRecord, NodeStatus
from swim import Member, MemberState


def _spec(me: str, n: int) -> TaskSpec:
    return TaskSpec(TaskKind.BATCH, Requirements(), ("echo", str(n)), submitted_by=me)


########################################################################################
# The placement view built from a member and its verified record


def _record(identity: NodeIdentity, gpu: dict[str, Any] | None, status: NodeStatus) -> NodeRecord:
    return NodeRecord(
        node_id=identity.node_id, public_key=identity.public_key, name="n", address="127.0.0.1",
        port=1, software_version="t", protocol_version=1, started_at=0.0, sequence=1,
        status=status, capabilities=Capabilities(8, 32 << 30, gpu), labels={"zone": "x"},
    )  # fmt: skip


def _gpu_record(xids: tuple[int, ...] = ()) -> dict[str, Any]:
    device = GpuDevice(
        index=0, uuid="GPU-aaaa", name="H100", vendor=Vendor.NVIDIA, source=Source.NVML,
        compute_capability=(9, 0), memory_total=80 << 30, memory_used=0, memory_free=80 << 30,
        xids=xids,
    )  # fmt: skip
    return build_report(HardwareFacts(devices=(device,))).to_record()


def test_candidate_carries_capacity_health_labels_and_draining(tmp_path: Path) -> None:
    identity = NodeIdentity.load_or_create(tmp_path)
    member = Member(identity.node_id, ("127.0.0.1", 1), MemberState.ALIVE, 1, rtt=0.002)
    gpu_task = TaskSpec(
        TaskKind.TRAINING, Requirements(gpu_count=1, vram_per_gpu=40 << 30,
                                        compute_capability_min=(8, 0)),
        ("train",), submitted_by="someone",
    )  # fmt: skip
    config, rng = LeaseConfig.local(), random.Random(1)

    healthy = candidate(member, _record(identity, _gpu_record(), NodeStatus.AVAILABLE), 0.5)
    assert healthy is not None
    assert [g.compute_capability for g in healthy.gpus] == [(9, 0)]
    assert healthy.gpus[0].healthy and healthy.gpus[0].vram_allocatable > 40 << 30
    assert "zone=x" in healthy.labels and healthy.cpu_cores == 8.0
    assert healthy.rtt is None, "only the accepting node has a known RTT (0)"
    assert place(gpu_task, [healthy], config=config, rng=rng).chosen == identity.node_id

    # A fatal XID makes the GPU unhealthy: GPU work no longer lands there.
    sick = candidate(member, _record(identity, _gpu_record((79,)), NodeStatus.AVAILABLE), 0.5)
    assert sick is not None and not sick.gpus[0].healthy
    p = place(gpu_task, [sick], config=config, rng=rng)
    assert p.chosen is None and p.removed["no_gpu"] == 1

    # Draining in the signed record is seen by every node's placement.
    drained = candidate(member, _record(identity, None, NodeStatus.DRAINING), 0.5)
    assert drained is not None and drained.draining
    cpu_task = TaskSpec(TaskKind.BATCH, Requirements(), ("true",), submitted_by="x")
    assert place(cpu_task, [drained], config=config, rng=rng).removed["draining"] == 1

    # No verified record, no work; a junk GPU record offers no GPUs.
    assert candidate(member, None, 0.5) is None
    assert gpu_slots({"v": 99}) == []
    accepting = candidate(member, _record(identity, None, NodeStatus.AVAILABLE), 0.5,
                          accepting=identity.node_id)  # fmt: skip
    assert accepting is not None and accepting.rtt == 0.0


@pytest.mark.parametrize(
    "fields",
    [
        {"command": []},
        {"command": ["x"], "gpus": -1},
        {"command": ["x"], "kind": "mining"},
        {"command": ["x"], "env": {"K": "v" * 5000}},
        {"command": ["x"], "env": ["K=V"]},
        {"command": ["x"], "timeout": 0},
        {"command": ["x"], "ram": "lots"},
        "not a map",
    ],
)
def test_daemon_refuses_bad_specs(fields: Any) -> None:
    with pytest.raises(ValueError):
        spec_from(fields, "me", 0.0)


def test_daemon_refuses_vram_without_gpus_with_the_fix() -> None:
    with pytest.raises(ValueError) as info:
        spec_from({"command": ["x"], "vram": 16 << 30}, "me", 0.0)
    assert str(info.value) == "--vram needs --gpus N (the VRAM is per GPU); add --gpus 1"
    ok = spec_from({"command": ["x"], "vram": 16 << 30, "gpus": 1}, "me", 0.0)
    assert ok.requirements.vram_per_gpu == 16 << 30 and ok.requirements.gpu_count == 1


########################################################################################
# The CLI: a bad spec is one line, and nothing reaches a daemon


def _submit_args(*argv: str) -> argparse.Namespace:
    base: dict[str, Any] = {
        "gpus": 0, "vram": None, "min_cc": "0.0", "cpus": 0.0, "ram": None, "label": [],
        "prefer": [], "kind": "batch", "timeout": "1h", "retries": 2, "env": [],
        "argv": ["--", "true"], "no_network": False,
    }  # fmt: skip
    for item in argv:
        key, _, value = item.partition("=")
        base[key] = value if not isinstance(base.get(key), list) else [value]
    return argparse.Namespace(**base)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"vram": "16Gibberish"}, "--vram"),
        ({"ram": "-1GiB"}, "--vram/--ram"),
        ({"argv": ["--"]}, "no command"),
        ({"env": ["NOEQUALS"]}, "--env"),
        ({"env": ["K=" + "v" * 5000]}, "env is larger"),
        ({"gpus": -2}, "gpu_count"),
        ({"timeout": "soon"}, "--timeout"),
        ({"min_cc": "eight"}, "--min-cc"),
        ({"label": ["novalue"]}, "--label"),
        ({"retries": 99}, "retry_limit"),
        ({"vram": "16GiB"}, "--vram needs --gpus N (the VRAM is per GPU); add --gpus 1"),
    ],
)
def test_cli_bad_specs_are_one_line(change: dict[str, Any], says: str) -> None:
    args = _submit_args()
    for key, value in change.items():
        setattr(args, key, value)
    with pytest.raises(TaskCliError) as info:
        build_spec(args)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_cli_submit_refuses_before_asking_the_daemon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No daemon runs here: the error must be about the spec, not the missing daemon.
    code = main(["submit", "--state-dir", str(tmp_path), "--vram", "12 parsecs", "--", "x"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "--vram" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "leases.sqlite3").exists()
    code = main(["submit", "--state-dir", str(tmp_path), "--vram", "16GiB", "--", "x"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.splitlines() == [
        "populi-node: error: --vram needs --gpus N (the VRAM is per GPU); add --gpus 1"
    ]
    good_args = _submit_args("vram=16GiB", "label=zone=x", "env=A=b")
    good_args.gpus = 1
    good = build_spec(good_args)
    assert good["vram"] == 16 << 30 and good["labels"] == ["zone=x"] and good["env"] == {"A": "b"}
    assert good["no_network"] is False
    parsed = _build_parser().parse_args(["submit", "--no-network", "--", "true"])
    assert build_spec(parsed)["no_network"] is True


########################################################################################
# The API's task routes: status codes and one-line errors


class _Tasks:
    """An `ApiBackend` that is also a `TaskBackend`."""

    def status(self) -> dict[str, Any]:
        return {}

    def members(self) -> list[dict[str, Any]]:
        return []

    def gpus(self) -> dict[str, Any]:
        return {}

    async def probe_gpus(self) -> dict[str, Any]:
        return {}

    def request_leave(self) -> None:
        pass

    async def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        if spec.get("command") == ["slow"]:
            raise SubmitError("task t is stored on this node, but only 0 of 1 members acked")
        spec_from(spec, "me", 0.0)
        return {"id": "t", "acks": 0}

    def tasks(self) -> list[dict[str, Any]]:
        return [{"id": "t"}]

    def task(self, task_id: str) -> dict[str, Any]:
        raise KeyError(f"no single task matches {task_id!r}")

    def explain(self, task_id: str) -> dict[str, Any]:
        return {"id": task_id}

    async def cancel(self, task_id: str, operator: object = None) -> dict[str, Any]:
        if task_id == "done":
            raise ConflictError("task done already succeeded at epoch 2; nothing to cancel")
        return {"id": task_id, "cancelled": True}

    async def drain(self, handoff: bool) -> dict[str, Any]:
        return {"draining": True, "handoff": handoff, "running": 0}

    async def undrain(self) -> dict[str, Any]:
        return {"draining": False}

    async def logs(self, task_id: str, stream: object, offset: object) -> dict[str, Any]:
        return {"id": task_id, "stream": stream, "offset": offset}


async def test_task_routes(tmp_path: Path) -> None:
    sock = tmp_path / "api.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_api, make_app(_Tasks()), sock)
        client = ApiClient(sock)

        async def call(method: str, path: str, body: Any = None) -> Any:
            if method == "get":
                return await trio.to_thread.run_sync(client.get, path)
            return await trio.to_thread.run_sync(client.post, path, body)

        assert await call("post", "/v1/tasks", {"command": ["true"]}) == {"id": "t", "acks": 0}
        assert await call("get", "/v1/tasks") == [{"id": "t"}]
        assert (await call("post", "/v1/drain", {"handoff": True}))["handoff"] is True
        assert (await call("post", "/v1/tasks/abc/cancel"))["cancelled"] is True
        assert await call("get", "/v1/tasks/abc/explain") == {"id": "abc"}
        got = await call("get", "/v1/tasks/abc/logs?stream=stderr&offset=12")
        assert got == {"id": "abc", "stream": "stderr", "offset": "12"}
        assert (await call("get", "/v1/tasks/abc/logs"))["stream"] == "stdout"
        for method, path, body, says in (
            ("post", "/v1/tasks", {"command": []}, "command is empty"),
            ("post", "/v1/tasks", {"command": ["slow"]}, "only 0 of 1"),
            ("get", "/v1/tasks/zzz", None, "no single task matches"),
            ("post", "/v1/tasks/done/cancel", None, "already succeeded at epoch 2"),
            ("get", "/v1/tasks/a/b/c", None, "no such endpoint"),
        ):
            with pytest.raises(ApiError) as info:
                await call(method, path, body)
            assert says in str(info.value) and "\n" not in str(info.value)
        nursery.cancel_scope.cancel()


async def test_cancel_of_a_finished_task_is_409_and_the_cli_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import httpx

    async with trio.open_nursery() as nursery:
        await nursery.start(serve_api, make_app(_Tasks()), tmp_path / "api.sock")

        def raw_cancel(task_id: str) -> httpx.Response:
            transport = httpx.HTTPTransport(uds=str(tmp_path / "api.sock"))
            with httpx.Client(transport=transport, base_url="http://populi") as client:
                return client.post(f"/v1/tasks/{task_id}/cancel")

        refused = await trio.to_thread.run_sync(raw_cancel, "done")
        assert refused.status_code == 409
        assert refused.json() == {
            "error": "task done already succeeded at epoch 2; nothing to cancel"
        }
        code = await trio.to_thread.run_sync(main, ["cancel", "--state-dir", str(tmp_path), "done"])
        out, err = capsys.readouterr()
        assert code == 1 and out == ""
        assert err.strip().splitlines() == [
            "populi-node: error: task done already succeeded at epoch 2; nothing to cancel"
        ]
        code = await trio.to_thread.run_sync(main, ["cancel", "--state-dir", str(tmp_path), "abc"])
        assert code in (0, None) and capsys.readouterr().out == "cancelled abc\n"
        nursery.cancel_scope.cancel()


########################################################################################
# Cancel: a finished task is refused, with one line


def _claim(epoch: int, phase: Phase, code: int | None = None, before: int = 0) -> ClaimRecord:
    result = None if code is None else TaskResult(code, signature=b"r")
    return ClaimRecord(epoch, 0, "owner", b"s", phase=phase, result=result, failures_before=before)


def _entry(*claims: ClaimRecord, retries: int = 1, cancel: bool = False) -> TaskEntry:
    spec = TaskSpec(TaskKind.BATCH, Requirements(), ("x",), retry_limit=retries, submitted_by="n")
    return TaskEntry(spec.task_id(), spec, b"sig", claims, Cancel("n", b"c") if cancel else None)


def test_cancel_refusal_names_the_finished_outcome() -> None:
    done = _entry(_claim(1, Phase.RELEASED), _claim(2, Phase.SUCCEEDED, 0))
    tid = done.task_id
    assert cancel_refusal(done) == f"task {tid} already succeeded at epoch 2; nothing to cancel"
    dead = _entry(_claim(1, Phase.FAILED, 1), _claim(2, Phase.FAILED, 1, before=1))
    assert cancel_refusal(dead) == (
        f"task {tid} already failed for good at epoch 2 (2 failed attempts); nothing to cancel"
    )
    gone = _entry(_claim(1, Phase.RUNNING), cancel=True)
    assert cancel_refusal(gone) == f"task {tid} is already cancelled; nothing to cancel"
    for line in (cancel_refusal(done), cancel_refusal(dead), cancel_refusal(gone)):
        assert line is not None and "\n" not in line


@pytest.mark.parametrize(
    "claims",
    [
        (),  # pending
        (_claim(1, Phase.CLAIMED),),
        (_claim(1, Phase.RUNNING),),
        (_claim(1, Phase.RELEASED),),
        (_claim(1, Phase.FAILED, 1),),  # one failure, one retry left: it will run again
    ],
)
def test_cancel_refusal_lets_unfinished_tasks_be_cancelled(claims: tuple[ClaimRecord, ...]) -> None:
    assert cancel_refusal(_entry(*claims)) is None


########################################################################################
# The no-network flag, and what an executor's end hands back


def test_no_network_is_in_the_spec_and_old_specs_keep_their_ids() -> None:
    old = _spec("me", 1)
    isolated = attrs.evolve(old, no_network=True)
    assert len(old.to_wire()) == 9, "specs without the flag encode as before"
    assert isolated.task_id() != old.task_id(), "the flag is in the content hash"
    assert TaskSpec.from_wire(isolated.to_wire()) == isolated
    assert TaskSpec.from_wire(old.to_wire()).no_network is False
    for forged in ([*old.to_wire(), False], [*old.to_wire(), 1], [*old.to_wire(), True, True]):
        with pytest.raises(ValueError):
            TaskSpec.from_wire(forged)  # one spec, one encoding
    assert spec_from({"command": ["x"], "no_network": True}, "me", 0.0).no_network
    with pytest.raises(ValueError, match="no_network must be true or false"):
        spec_from({"command": ["x"], "no_network": "yes"}, "me", 0.0)


class _Runner:
    """A `TaskRunner` that records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        _send, self.exits = trio.open_memory_channel[TaskExited](1)

    def start(
        self,
        task_id: str,
        epoch: int,
        spec: TaskSpec,
        gpu_uuids: list[str],
        *,
        deadline: float | None = None,
    ) -> None:
        self.calls.append(("start", task_id))

    def stop(self, task_id: str, reason: str, grace: float | None = None) -> None:
        self.calls.append(("stop", task_id, reason))

    def fence(self, task_id: str, epoch: int, deadline: float) -> None:
        pass  # nothing runs here, so nothing to fence

    async def reap_leftovers(self) -> list[tuple[str, int]]:
        return []


@pytest.mark.parametrize(
    ("reason", "detail", "code", "released"),
    [
        ("shutdown", "the node shut down while the task ran", -9, True),
        ("cancelled", "handoff", -15, True),
        ("cancelled", "fenced", -9, True),
        ("cancelled", "cancelled", -15, False),
        ("exited", "exited with code 3", 3, False),
        ("start_failed", "no such program", None, False),
    ],
)
def test_node_side_losses_release_and_task_failures_post_results(
    reason: str, detail: str, code: int | None, released: bool
) -> None:
    """A shutdown, a handoff or a lapsed lease hands the epoch back (no retry used);
    anything else is the task's own end, posted as its result."""
    exited = TaskExited("t", 1, code, reason, b"", b"", 0.0, 1.0, detail)
    result = hands_back(exited)
    if released:
        assert result is None
    else:
        assert result is not None and result.exit_code == (code or START_FAILED_CODE)


def test_up_task_user_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["up", "--state-dir", str(tmp_path), "--task-user", "no-such-user-here"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1, err
    assert "--task-user no-such-user-here" in err
    assert ("no such user" in err) if os.geteuid() == 0 else ("only a daemon" in err)


@pytest.mark.parametrize("uids", ["61184", "9-1", "0-10"])
def test_up_task_uids_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], uids: str
) -> None:
    code = main(["up", "--state-dir", str(tmp_path), "--task-uids", uids])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1, err
    assert err.count("task uids") == 1 and ("FIRST-LAST" in err or "FIRST <= LAST" in err), err
