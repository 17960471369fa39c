"""The executor's value types: the limits' validation, the end reasons, `succeeded`."""

from __future__ import annotations

import attrs
import pytest

from populi_p2p.executor._types import EXIT_REASONS, TaskExited, TaskLimits


def _exited(code: int | None, reason: str) -> TaskExited:
    return TaskExited("t", 1, code, reason, b"", b"", 0.0, 1.0)


def test_task_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="memory"):
        TaskLimits(memory=0)
    with pytest.raises(ValueError, match="cpu_time"):
        TaskLimits(cpu_time=-1.0)


@pytest.mark.parametrize("bad", [0, -1, 0.0, "1", float("nan")])
@pytest.mark.parametrize("field", ["memory", "cpu_time"])
def test_each_limit_is_positive_or_none(field: str, bad: object) -> None:
    with pytest.raises(ValueError, match=f"{field} must be positive or None, got"):
        TaskLimits(**{field: bad})


def test_limits_default_to_deriving_from_the_spec() -> None:
    assert TaskLimits() == TaskLimits(memory=None, cpu_time=None, no_network=False)
    assert TaskLimits(memory=1, cpu_time=0.5).cpu_time == 0.5
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        TaskLimits().memory = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("code", "reason", "succeeded"),
    [
        (0, "exited", True),
        (1, "exited", False),
        (-9, "exited", False),
        (0, "timeout", False),  # a limit struck as it exited 0
        (0, "cancelled", False),
        (None, "start_failed", False),
    ],
)
def test_only_the_commands_own_zero_exit_succeeds(
    code: int | None, reason: str, succeeded: bool
) -> None:
    assert reason in EXIT_REASONS
    assert _exited(code, reason).succeeded is succeeded


def test_the_reasons_are_the_documented_ones() -> None:
    """The lease service and the CLI key on these words; the set only grows."""
    assert {
        "exited", "timeout", "memory", "cpu", "cancelled", "shutdown", "start_failed", "outputs",
    } == EXIT_REASONS  # fmt: skip
