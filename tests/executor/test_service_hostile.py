"""Hostile arguments to `start`: each ends in `start_failed` with a reason, never a crash,
and nothing is written outside the tasks directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.executor.service import _WRAPPER, ExecutorConfig, ExecutorService

from .helpers import next_exit, spec

_VALID_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")

bad_ids = st.text(max_size=200).filter(lambda s: not _VALID_ID.fullmatch(s)) | st.sampled_from(
    ["..", "../../etc", "a/b", "", "x" * 129, "id\x00", "ок"]
)
bad_epochs = st.integers(max_value=-1) | st.integers(min_value=1 << 62) | st.sampled_from([True])
bad_gpus = st.lists(st.sampled_from(["GPU-1,GPU-2", "", "a b", "x" * 97, "GPU-\n"]), min_size=1)


async def _start_and_wait(tmp: Path, task_id: Any, epoch: Any, gpus: Any) -> tuple[str, str]:
    service = ExecutorService(ExecutorConfig(tasks_dir=tmp / "tasks", task_user="root"))
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        service.start(task_id, epoch, spec("true"), gpus)
        ended = await next_exit(service)
        nursery.cancel_scope.cancel()
    assert service.running() == {}
    return ended.reason, ended.detail


@settings(max_examples=60)
@given(task_id=bad_ids)
def test_bad_task_ids_fail_to_start(tmp_path_factory: pytest.TempPathFactory, task_id: str) -> None:
    tmp = tmp_path_factory.mktemp("ids")
    reason, detail = trio.run(_start_and_wait, tmp, task_id, 1, [])
    assert reason == "start_failed" and "task id" in detail
    assert list((tmp / "tasks").iterdir()) == []  # nothing made, anywhere
    assert sorted(p.name for p in tmp.iterdir()) == ["tasks"]


@settings(max_examples=30)
@given(epoch=bad_epochs)
def test_bad_epochs_fail_to_start(tmp_path_factory: pytest.TempPathFactory, epoch: int) -> None:
    tmp = tmp_path_factory.mktemp("epochs")
    reason, detail = trio.run(_start_and_wait, tmp, "t", epoch, [])
    assert reason == "start_failed" and "epoch" in detail


@settings(max_examples=30)
@given(gpus=bad_gpus)
def test_bad_gpu_uuids_fail_to_start(
    tmp_path_factory: pytest.TempPathFactory, gpus: list[str]
) -> None:
    tmp = tmp_path_factory.mktemp("gpus")
    reason, detail = trio.run(_start_and_wait, tmp, "t", 1, gpus)
    assert reason == "start_failed" and "gpu" in detail


def test_log_path_refuses_bad_ids_and_unknown_tasks(tmp_path: Path) -> None:
    service = ExecutorService(ExecutorConfig(tasks_dir=tmp_path, task_user="root"))
    with pytest.raises(ValueError, match="not a task id"):
        service.log_path("../etc")
    with pytest.raises(FileNotFoundError, match="has not run"):
        service.log_path("never")


#: A Python that `nobody` may run (the test's own may sit under a 0700 home).
_SYSTEM_PY = "/usr/bin/python3"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start the wrapper as nobody")
@pytest.mark.skipif(not os.path.exists(_SYSTEM_PY), reason=f"no {_SYSTEM_PY} for nobody to run")
def test_the_wrapper_isolates_the_network_for_a_non_root_daemon_or_says_why_not() -> None:
    """As a non-root daemon would: a user namespace plus a network namespace, or a clear refusal."""
    spec_r, spec_w = os.pipe()
    status_r, status_w = os.pipe()
    control_r, control_w = os.pipe()  # held open: the "daemon" lives while it runs
    code = "import socket; print(socket.if_nameindex())"
    instructions = {"argv": [_SYSTEM_PY, "-c", code], "env": {}, "no_network": True}
    os.write(spec_w, json.dumps(instructions).encode())
    os.close(spec_w)
    done = subprocess.run(
        [_SYSTEM_PY, "-I", "-S", _WRAPPER, str(spec_r), str(status_w), str(control_r)],
        pass_fds=(spec_r, status_w, control_r),
        user="nobody",
        capture_output=True,
        cwd="/",
        timeout=60,
    )
    for fd in (spec_r, status_w, control_r, control_w):
        os.close(fd)
    status = os.read(status_r, 4096)
    os.close(status_r)
    if status != b"ok\n":
        assert done.returncode == 127 and b"refusing to run the task with network" in status
    else:
        # Only a loopback interface: the host's interfaces are out of reach.
        assert done.returncode == 0 and done.stdout.strip() == b"[(1, 'lo')]", done
