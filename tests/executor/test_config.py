"""`ExecutorConfig`: its defaults, converters and one-line refusals of bad bounds."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from populi_p2p.executor._config import TAIL_BYTES_MAX, ExecutorConfig


def test_config_rejects_bad_values_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="grace_period"):
        ExecutorConfig(tasks_dir=tmp_path, grace_period=0)
    with pytest.raises(ValueError, match="tail_bytes"):
        ExecutorConfig(tasks_dir=tmp_path, tail_bytes=-1)


@pytest.mark.parametrize(
    ("field", "accepted", "refused"),
    [
        ("grace_period", [0.001, 300], [0, -1, 300.5]),
        ("fence_grace", [0, 300], [-0.1, 301]),
        ("tail_bytes", [0, TAIL_BYTES_MAX], [-1, TAIL_BYTES_MAX + 1]),
        ("poll_interval", [0.01, 10], [0.009, 10.5]),
        ("exits_buffer", [1, 10_000], [0, -5]),
    ],
)
def test_each_bound_holds_at_its_edges(
    tmp_path: Path, field: str, accepted: list[float], refused: list[float]
) -> None:
    for value in accepted:
        assert getattr(ExecutorConfig(tasks_dir=tmp_path, **{field: value}), field) == value
    for value in refused:
        with pytest.raises(ValueError, match=f"^{field} must be") as caught:
            ExecutorConfig(tasks_dir=tmp_path, **{field: value})
        assert "\n" not in str(caught.value)


def test_fence_grace_is_validated(tmp_path: Path) -> None:
    assert ExecutorConfig(tasks_dir=tmp_path).fence_grace == 1.0
    with pytest.raises(ValueError, match="fence_grace"):
        ExecutorConfig(tasks_dir=tmp_path, fence_grace=-1)


def test_an_empty_task_user_is_refused_and_none_or_a_name_kept(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="task_user must be a user name"):
        ExecutorConfig(tasks_dir=tmp_path, task_user="")
    assert ExecutorConfig(tasks_dir=tmp_path).task_user is None
    assert ExecutorConfig(tasks_dir=tmp_path, task_user="nobody").task_user == "nobody"


def test_paths_are_converted(tmp_path: Path) -> None:
    config = ExecutorConfig(tasks_dir=str(tmp_path), cgroup_parent=str(tmp_path / "cg"))
    assert config.tasks_dir == tmp_path and isinstance(config.tasks_dir, Path)
    assert config.cgroup_parent == tmp_path / "cg"
    assert ExecutorConfig(tasks_dir=tmp_path).cgroup_parent is None


def test_the_docs_state_the_kill_grace_the_code_uses() -> None:
    grace = attrs.fields(ExecutorConfig).grace_period.default
    docs = Path(__file__).resolve().parents[2] / "docs"
    assert f"SIGKILL {grace:g} s later" in (docs / "operations.md").read_text()
    assert f"| `grace_period` | {grace:.1f} s |" in (docs / "executor.md").read_text()
