"""The executor with real processes: environment, limits, stopping, logs.

Every wait is on an exit event or on output the task wrote; no sleep synchronises.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import time
from pathlib import Path

import attrs
import pytest
import trio

from populi_p2p.executor._cgroup import probe
from populi_p2p.executor.service import TaskLimits

from .helpers import alive as _alive
from .helpers import children, executor, next_exit, python, run_one, spec

MiB = 1 << 20


async def test_child_sees_its_env_gpus_and_workdir(tmp_path: Path) -> None:
    code = (
        "import json, os; open('made', 'w').write('x');"
        "print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd()}))"
    )
    async with executor(tmp_path) as ex:
        ended = await run_one(ex, "t1", python(code, FOO="bar"), gpus=["GPU-aaa", "GPU-bbb"])
        plain = await run_one(ex, "t2", python(code))
    assert ended.succeeded, ended
    seen = json.loads(ended.stdout_tail)
    assert seen["env"]["FOO"] == "bar"
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-aaa,GPU-bbb"
    assert seen["env"]["POPULI_TASK_ID"] == "t1"
    # The daemon's own environment does not leak into the task (not even its PATH).
    assert "PYTEST_CURRENT_TEST" not in seen["env"]
    work = tmp_path / "tasks" / "t1" / "1" / "work"
    assert seen["cwd"] == str(work)
    assert stat.S_IMODE(work.stat().st_mode) == 0o700
    assert (work / "made").read_text() == "x"
    assert json.loads(plain.stdout_tail)["env"]["CUDA_VISIBLE_DEVICES"] == ""


async def test_tails_are_bounded_and_full_output_stays_on_disk(tmp_path: Path) -> None:
    code = (
        "import sys; sys.stdout.write('o' * 100000 + 'END-OUT');"
        "sys.stderr.write('e' * 100000 + 'END-ERR')"
    )
    async with executor(tmp_path, tail_bytes=4096) as ex:
        ended = await run_one(ex, "tails", python(code))
        out_path = ex.log_path("tails")
        err_path = ex.log_path("tails", "stderr")
    assert ended.succeeded
    assert len(ended.stdout_tail) == 4096 and ended.stdout_tail.endswith(b"END-OUT")
    assert len(ended.stderr_tail) == 4096 and ended.stderr_tail.endswith(b"END-ERR")
    assert out_path.stat().st_size == 100007
    assert err_path.read_bytes().endswith(b"END-ERR")


async def test_timeout_stops_the_task(tmp_path: Path) -> None:
    async with executor(tmp_path) as ex:
        ended = await run_one(ex, "slow", spec("sleep", "60", timeout=0.5))
    assert ended.reason == "timeout" and not ended.succeeded
    assert ended.exit_code == -signal.SIGTERM
    assert ended.ended_at - ended.started_at < 10


async def test_memory_limit_fails_the_task_and_the_node_goes_on(tmp_path: Path) -> None:
    async with executor(tmp_path) as ex:
        ended = await run_one(
            ex,
            "hog",
            python("b = bytearray(512 * 1024 * 1024)"),
            limits=TaskLimits(memory=128 * MiB),
        )
        after = await run_one(ex, "next", python("print('fine')"))
    assert ended.reason == "memory", ended
    assert after.succeeded and after.stdout_tail == b"fine\n"


async def test_watchdog_stops_a_group_over_its_memory(tmp_path: Path) -> None:
    # A GPU task gets no RLIMIT_AS (CUDA maps far more than it uses), so here the
    # watchdog on the group's resident memory must catch it.
    code = "import time\nb = [b'x' * (16 << 20) for _ in range(12)]\ntime.sleep(60)"
    async with executor(tmp_path) as ex:
        ended = await run_one(
            ex, "rss", python(code), gpus=["GPU-x"], limits=TaskLimits(memory=100 * MiB)
        )
    assert ended.reason == "memory", ended
    assert ended.exit_code == -signal.SIGKILL


async def test_cpu_time_limit(tmp_path: Path) -> None:
    async with executor(tmp_path) as ex:
        ended = await run_one(ex, "spin", python("while True: pass"), limits=TaskLimits(cpu_time=1))
    assert ended.reason == "cpu", ended


async def test_stop_kills_the_whole_group_within_the_grace_period(tmp_path: Path) -> None:
    # Both the shell and its background child ignore SIGTERM: only SIGKILL ends them.
    script = 'trap "" TERM; sleep 300 & echo $!; wait; wait'
    async with executor(tmp_path, grace_period=1.0) as ex:
        ex.start("grp", 1, spec("sh", "-c", script), [])
        out = b""
        async for chunk in ex.follow_log("grp"):
            out += chunk
            if out.endswith(b"\n"):
                break
        grandchild = int(out)
        assert _alive(grandchild)
        asked = time.monotonic()
        ex.stop("grp", "cancelled by the test")
        ended = await next_exit(ex)
        took = time.monotonic() - asked
    assert ended.reason == "cancelled" and ended.detail == "cancelled by the test"
    assert ended.exit_code == -signal.SIGKILL
    assert not _alive(grandchild)
    assert took < 1.0 + 3.0


async def test_no_network_cannot_reach_a_loopback_listener(tmp_path: Path) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    code = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
        "except OSError as e:\n"
        "    print(e); sys.exit(3)\n"
        "print('connected')"
    )
    async with executor(tmp_path) as ex:
        control = await run_one(ex, "net", python(code))
        isolated = await run_one(ex, "nonet", python(code), limits=TaskLimits(no_network=True))
        # The spec's own flag (``submit --no-network``) asks for the same isolation.
        by_spec = await run_one(ex, "nonet2", attrs.evolve(python(code), no_network=True))
    for listener in listeners:
        await listener.aclose()
    assert control.succeeded and control.stdout_tail == b"connected\n"
    if isolated.reason == "start_failed":
        pytest.skip(f"this machine cannot make network namespaces: {isolated.detail}")
    assert isolated.exit_code == 3, isolated
    assert by_spec.exit_code == 3, by_spec


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_runs_as_a_uid_of_its_own_when_root(tmp_path: Path) -> None:
    async with executor(tmp_path, task_user=None, task_uids=(61200, 61210)) as ex:
        ended = await run_one(ex, "who", spec("sh", "-c", "id -u; id -G; touch made && echo wrote"))
        assert ex.running() == {}
    assert ended.succeeded, ended
    uid, groups, wrote = ended.stdout_tail.decode().split("\n")[:3]
    assert 61200 <= int(uid) <= 61210
    assert groups.split() == [uid]  # its own gid; root's supplementary groups are dropped
    assert wrote == "wrote"
    work = tmp_path / "tasks" / "who" / "1" / "work"
    assert (work / "made").stat().st_uid == int(uid)
    # Sealed at the end: the next task given this uid cannot enter it.
    assert (work.stat().st_uid, work.stat().st_mode & 0o777) == (0, 0o700)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_runs_as_the_named_task_user_when_root(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    async with executor(tmp_path, task_user="nobody") as ex:
        ended = await run_one(ex, "who", spec("sh", "-c", "id -u; id -G; touch made && echo wrote"))
    assert ended.succeeded, ended
    uid, groups, wrote = ended.stdout_tail.decode().split("\n")[:3]
    assert int(uid) == nobody.pw_uid
    assert groups.split() == [str(nobody.pw_gid)]  # root's supplementary groups are dropped
    assert wrote == "wrote"
    assert (tmp_path / "tasks" / "who" / "1" / "work" / "made").stat().st_uid == nobody.pw_uid


async def test_follow_log_streams_output_as_it_is_written(tmp_path: Path) -> None:
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    code = f"print('first', flush=True)\nopen({str(fifo)!r}).read()\nprint('second')"
    seen: list[bytes] = []
    async with executor(tmp_path) as ex:
        ex.start("stream", 1, python(code), [])
        async for chunk in ex.follow_log("stream"):
            seen.append(chunk)
            if b"".join(seen) == b"first\n":
                # The task is blocked until we write: "first" was streamed while it ran.
                assert "stream" in ex.running()
                await trio.to_thread.run_sync(fifo.write_text, "go")
        ended = await next_exit(ex)
    assert ended.succeeded
    assert b"".join(seen) == b"first\nsecond\n"


async def test_a_missing_command_is_start_failed(tmp_path: Path) -> None:
    async with executor(tmp_path) as ex:
        ended = await run_one(ex, "nope", spec("/no/such/program-xyz", "arg"))
        again = await run_one(ex, "nope", spec("true"))  # same id and epoch: fenced
    assert ended.reason == "start_failed" and ended.exit_code == 127
    assert "/no/such/program-xyz" in ended.detail and "No such file" in ended.detail
    assert again.reason == "start_failed" and "already ran here" in again.detail
    assert ex.statistics()["start_failed"] == 2


@pytest.mark.parametrize(
    ("command", "env", "says"),
    [
        (("echo", "nul\x00byte"), {}, "null byte"),
        (("true",), {"A=B": "x"}, "environment variable"),
        (("",), {}, "cannot run ''"),
    ],
)
async def test_unrunnable_arguments_are_start_failed(
    tmp_path: Path, command: tuple[str, ...], env: dict[str, str], says: str
) -> None:
    async with executor(tmp_path) as ex:
        ended = await run_one(ex, "odd", attrs.evolve(spec(*command), env=env))
    assert ended.reason == "start_failed" and says in ended.detail, ended


async def test_shutdown_kills_running_tasks(tmp_path: Path) -> None:
    async with executor(tmp_path) as ex:
        ex.start("left", 1, spec("sh", "-c", "echo up; exec sleep 300"), [])
        async for chunk in ex.follow_log("left"):
            if chunk:
                break
        pid = ex.running()["left"].pid
        assert pid is not None and _alive(pid)
    # The executor's nursery was cancelled: the task was killed and reported.
    assert not _alive(pid)
    ended = ex.exits.receive_nowait()
    assert ended.reason == "shutdown"
    with pytest.raises(trio.EndOfChannel):  # the stream ends with the service
        ex.exits.receive_nowait()


@pytest.fixture
def usable_cgroup() -> None:
    """Skip (from sync code, so pytest keeps the reason) where the probe says no."""
    parent, why = probe()
    if parent is None:
        pytest.skip(f"no usable cgroup v2 here: {why}")


@pytest.mark.usefixtures("usable_cgroup")
async def test_cgroup_limits_when_the_node_may_use_them(tmp_path: Path) -> None:
    async with executor(tmp_path) as ex:
        ended = await run_one(
            ex, "cg", python("b = b'x' * (512 << 20)"), limits=TaskLimits(memory=128 * MiB)
        )
        assert ex.limiter_detail.startswith("cgroup")
    assert ended.reason == "memory", ended


async def test_cgroup_path_against_a_fake_hierarchy(tmp_path: Path) -> None:
    """The cgroup code path with files standing in for the kernel's: limits written, the
    wrapper joins, an OOM kill counted in memory.events ends the task as `memory`."""
    fake = tmp_path / "cg"
    fake.mkdir()
    (fake / "cgroup.subtree_control").write_text("cpu memory\n")
    async with executor(tmp_path, cgroup_parent=fake) as ex:
        assert ex.limiter_detail == f"cgroup v2 under {fake}"
        task = spec("sh", "-c", "echo up; exec sleep 300", cpus=0.5)
        ex.start("cg", 1, task, [], limits=TaskLimits(memory=64 * MiB))
        async for chunk in ex.follow_log("cg"):
            if chunk:
                break
        cgroup = fake / "task-cg-1"
        assert ex.running()["cg"].limiter == "cgroup"
        assert (cgroup / "memory.max").read_text() == str(64 * MiB)
        assert (cgroup / "cpu.max").read_text() == "50000 100000"
        # The command joins, not its wrapper (the wrapper's memory is not the task's).
        wrapper = ex.running()["cg"].pid
        assert wrapper is not None
        assert (cgroup / "cgroup.procs").read_text() == str(children(wrapper)[0])
        (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
        ended = await next_exit(ex)
    assert ended.reason == "memory" and ended.exit_code == -signal.SIGKILL
    assert (cgroup / "cgroup.kill").read_text() == "1"


async def test_running_shows_the_limits_and_a_stop_before_spawn_runs_nothing(
    tmp_path: Path,
) -> None:
    async with executor(tmp_path, use_cgroup=False) as ex:
        task = spec("sh", "-c", "echo ran > ran", timeout=100.0, cpus=2.0)
        ex.start("early", 3, task, [], limits=TaskLimits(memory=64 * MiB, no_network=True))
        view = ex.running()["early"]
        ex.stop("early", "changed my mind")  # before the supervisor could spawn anything
        ended = await next_exit(ex)
    assert (view.epoch, view.pid, view.memory_limit) == (3, None, 64 * MiB)
    assert view.cpu_time_limit == 200.0  # timeout * cpu_cores when not given
    assert view.no_network and view.limiter == "rlimit" and view.user == "root"
    assert view.workdir == str(tmp_path / "tasks" / "early" / "3" / "work")
    assert ended.reason == "cancelled" and ended.exit_code is None
    assert not (tmp_path / "tasks" / "early" / "3" / "work" / "ran").exists()
