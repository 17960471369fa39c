"""`TaskRunner`, the lease service's whole view of whatever runs processes: each runner
of the node (the executor, the deployment runner, the artifact runner) offers every
member of it, with the same parameters (mypy checks the call sites; this checks the
runners the node stacks at run time, where a keyword that drifted would only fail
when that call is made)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from populi_p2p.artifacts.runner import ArtifactRunner
from populi_p2p.deploy.runner import DeploymentRunner
from populi_p2p.executor import _types, runner
from populi_p2p.executor.service import ExecutorService

RUNNERS = [ExecutorService, DeploymentRunner, ArtifactRunner]
METHODS = ["start", "stop", "fence", "reap_leftovers"]


def _parameters(method: Callable[..., object]) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()]


def test_the_protocol_is_the_documented_one() -> None:
    members = {n for n in vars(runner.TaskRunner) if not n.startswith("_")}
    assert members >= set(METHODS)
    assert "exits" in runner.TaskRunner.__annotations__
    assert inspect.iscoroutinefunction(runner.TaskRunner.reap_leftovers)
    assert runner.TaskExited is _types.TaskExited  # one type, re-exported for runners


@pytest.mark.parametrize("implementation", RUNNERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", METHODS)
def test_each_runner_takes_what_the_protocol_passes(implementation: type, name: str) -> None:
    """Every parameter of the protocol is there, in the same place, of the same kind and
    default; a runner may take more keywords only if they have defaults."""
    wanted = _parameters(getattr(runner.TaskRunner, name))
    method = getattr(implementation, name)
    offered = _parameters(method)
    keyword = inspect.Parameter.KEYWORD_ONLY
    assert [p for p in offered if p[1] is not keyword] == [
        p for p in wanted if p[1] is not keyword
    ], (implementation.__name__, name)
    keywords = {p[0]: p for p in offered if p[1] is keyword}
    for parameter in (p for p in wanted if p[1] is keyword):
        assert keywords.pop(parameter[0], None) == parameter, (implementation.__name__, name)
    for extra_name, _, default in keywords.values():
        assert default is not inspect.Parameter.empty, (name, extra_name)
    protocol_async = inspect.iscoroutinefunction(getattr(runner.TaskRunner, name))
    assert inspect.iscoroutinefunction(method) == protocol_async


def test_the_check_sees_a_drifted_runner() -> None:
    class Drifted:
        def stop(self, task_id: str, why: str, grace: float | None = None) -> None: ...

    with pytest.raises(AssertionError):
        test_each_runner_takes_what_the_protocol_passes(Drifted, "stop")
