"""`python -m populi_p2p.demo`: its arguments, its waits, its bookkeeping and its exits.

The demo itself (six real daemons) runs in tests/mesh/test_demo.py; here its pieces run
without a daemon: the wait on a fake clock, the processes stood in for.
"""

from __future__ import annotations

import signal
import types
from pathlib import Path
from typing import Any

import pytest

from populi_p2p import demo
from populi_p2p.api import ApiError
from populi_p2p.demo import DemoError, _Demo, _pause, _wait


class Clock:
    """`time` as the demo's waits see it: `sleep` moves the clock, nothing waits."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(demo, "time", types.SimpleNamespace(monotonic=fake.monotonic,
                                                             sleep=fake.sleep))  # fmt: skip
    return fake


def test_a_wait_returns_the_first_truthy_answer_and_rides_out_api_errors(clock: Clock) -> None:
    answers: list[Any] = [ApiError("not up yet"), None, {}, {"node": 1}, "too late"]

    def condition() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert _wait(condition, "the node") == {"node": 1}
    assert clock.slept == [0.1, 0.1, 0.1] and answers == ["too late"]


def test_a_wait_gives_up_after_its_timeout_naming_what_it_waited_for(clock: Clock) -> None:
    calls = []
    with pytest.raises(DemoError) as info:
        _wait(lambda: calls.append(clock.now), "node3 to start", timeout=2.0)
    assert str(info.value) == "timed out after 2 s waiting for node3 to start"
    assert 20 <= len(calls) <= 22 and calls[-1] > 102.0


def test_an_error_that_is_not_the_apis_is_not_swallowed(clock: Clock) -> None:
    def condition() -> bool:
        raise DemoError("node1 exited at start")

    with pytest.raises(DemoError, match="node1 exited at start"):
        _wait(condition, "node1")


class Stdin:
    def __init__(self, tty: bool) -> None:
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("stdin", [None, Stdin(tty=False)])
def test_no_pause_without_a_terminal(stdin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", stdin)
    monkeypatch.setattr("builtins.input", lambda _prompt: pytest.fail("asked"))
    _pause("press Enter")


def test_a_pause_in_a_terminal_waits_for_enter_and_an_eof_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prompts: list[str] = []

    def ask(prompt: str) -> str:
        prompts.append(prompt)
        raise EOFError

    monkeypatch.setattr("sys.stdin", Stdin(tty=True))
    monkeypatch.setattr("builtins.input", ask)
    _pause("press Enter to kill node3")
    assert prompts == ["press Enter to kill node3 "]


class Proc:
    """A `Popen` stood in for: it exits when killed."""

    def __init__(self, pid: int, running: bool = True) -> None:
        self.pid = pid
        self.code: int | None = None if running else 0
        self.signals: list[int] = []
        self.waited = 0

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.code = -sig

    def wait(self, timeout: float | None = None) -> int | None:
        self.waited += 1
        return self.code


def test_the_demo_keeps_track_of_its_nodes(tmp_path: Path) -> None:
    d = _Demo(tmp_path, nodes=6)
    d.procs = {"node1": Proc(1), "node2": Proc(2), "node3": Proc(3)}
    d.ids = {"node1": "a" * 64, "node2": "b" * 64}
    d.kill("node2")
    assert d.procs["node2"].signals == [signal.SIGKILL]
    assert d.alive() == ["node1", "node3"]
    assert d.name_of("a" * 64) == "node1"
    assert d.name_of("c" * 64) == "c" * 12  # not one of ours
    assert d.name_of(None) == "-"
    assert d.env["PYTHONPATH"].split(":")[0] == str(Path(demo.__file__).resolve().parents[1])


def test_stop_kills_what_still_runs_and_closes_the_relay(tmp_path: Path) -> None:
    d = _Demo(tmp_path, nodes=6)
    running, exited, engine = Proc(1), Proc(2, running=False), Proc(3)
    d.procs = {"node1": running, "node2": exited}
    d.engines = [engine]
    closed: list[bool] = []
    d.relay = types.SimpleNamespace(close=lambda: closed.append(True))
    d.stop()
    assert running.signals == [signal.SIGKILL] and engine.signals == [signal.SIGKILL]
    assert exited.signals == [] and closed == [True]
    assert (running.waited, exited.waited, engine.waited) == (1, 1, 1)


def test_views_are_each_nodes_member_states(tmp_path: Path) -> None:
    d = _Demo(tmp_path, nodes=6)
    rows = {"node1": [{"node_id": "a", "state": "alive"}, {"node_id": "c", "state": "dead"}]}
    d.clients = {n: types.SimpleNamespace(get=lambda _p, n=n: rows[n]) for n in rows}
    assert d.views(["node1"]) == {"node1": {"a": "alive", "c": "dead"}}


####################################################################################
# main: arguments, exits, and the temporary directory


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--nodes", "5"], "--nodes must be at least 6"),
        (["--long-task", "0.5"], "--long-task must be 1 to 600 seconds"),
        (["--long-task", "601"], "--long-task must be 1 to 600 seconds"),
    ],
)
def test_bad_arguments_exit_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        demo.main(argv)
    assert info.value.code == 2 and says in capsys.readouterr().err


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, Any]]:
    """`_Demo.run` and `stop` stood in for; temporary directories made in tmp_path.
    The run does what `outcome` (the first item) says."""
    seen: list[tuple[str, Any]] = [("outcome", None)]
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))

    def run(self: _Demo) -> None:
        seen.append(("run", (self.root, self.count, self.long_task)))
        (self.root / "node1.log").write_text("log")
        outcome = seen[0][1]
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(_Demo, "run", run)
    monkeypatch.setattr(_Demo, "stop", lambda self: seen.append(("stop", self.root)))
    return seen


def test_a_good_run_exits_0_and_removes_its_directory(
    runs: list[tuple[str, Any]], tmp_path: Path
) -> None:
    assert demo.main(["--nodes", "7", "--long-task", "3"]) == 0
    (_, (root, nodes, long_task)), stop = runs[1:]
    assert root.parent == tmp_path and root.name.startswith("populi-demo-")
    assert (nodes, long_task) == (7, 3.0) and stop == ("stop", root)
    assert not root.exists()


def test_keep_keeps_the_directory(
    runs: list[tuple[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(["--keep"]) == 0
    root = runs[1][1][0]
    assert (root / "node1.log").exists()
    assert capsys.readouterr().err == f"kept {root}\n"


def test_a_failed_step_exits_1_and_keeps_the_logs(
    runs: list[tuple[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    runs[0] = ("outcome", DemoError("timed out after 40 s waiting for node3"))
    assert demo.main([]) == 1
    root = runs[1][1][0]
    assert runs[2] == ("stop", root) and (root / "node1.log").exists()
    assert capsys.readouterr().err.splitlines() == [
        f"demo failed: timed out after 40 s waiting for node3 (logs in {root})",
        f"kept {root}",
    ]


def test_ctrl_c_exits_130_and_still_cleans_up(runs: list[tuple[str, Any]]) -> None:
    runs[0] = ("outcome", KeyboardInterrupt())
    assert demo.main([]) == 130
    root = runs[1][1][0]
    assert runs[2] == ("stop", root) and not root.exists()
