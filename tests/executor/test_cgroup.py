"""cgroup v2 for tasks, against files standing in for the kernel's: `probe` says why
not in one line or tries for real, limits are written as the kernel reads them, usage
is read back, and a missing file never raises."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from populi_p2p.executor import _cgroup
from populi_p2p.executor._cgroup import CgroupParent, TaskCgroup, probe


def _hierarchy(tmp_path: Path, controllers: str) -> Path:
    base = tmp_path / "cg"
    base.mkdir()
    (base / "cgroup.subtree_control").write_text(controllers + "\n")
    return base


def test_probe_finds_a_parent_with_the_memory_controller_and_cleans_up(tmp_path: Path) -> None:
    base = _hierarchy(tmp_path, "cpuset cpu io memory pids")
    parent, why = probe(base)
    assert parent == CgroupParent(base, cpu=True)
    assert why == f"cgroup v2 under {base}"
    # The trial child was made and limited for real. The kernel's would go with the
    # rmdir; a fake one keeps the file written, which shows the trial happened.
    trials = [p for p in base.iterdir() if p.name.startswith("populi-probe-")]
    assert len(trials) == 1 and (trials[0] / "memory.max").read_text() == str(1 << 30)


def test_probe_without_cpu_gives_children_no_cpu_limit(tmp_path: Path) -> None:
    parent, _ = probe(_hierarchy(tmp_path, "memory"))
    assert parent is not None and not parent.cpu


@pytest.mark.parametrize(
    ("controllers", "why"),
    [
        (None, "cannot read {base}/cgroup.subtree_control: No such file or directory"),
        ("cpu io pids", "the memory controller is not enabled for children of {base}"),
        ("", "the memory controller is not enabled for children of {base}"),
    ],
)
def test_probe_says_why_not_in_one_line(tmp_path: Path, controllers: str | None, why: str) -> None:
    base = _hierarchy(tmp_path, controllers) if controllers is not None else tmp_path / "none"
    assert probe(base) == (None, why.format(base=base))


def test_probe_says_when_no_child_can_be_made(tmp_path: Path) -> None:
    base = _hierarchy(tmp_path, "memory")
    (base / f"populi-probe-{os.getpid()}").mkdir()  # the kernel refuses
    parent, why = probe(base)
    assert parent is None and why == f"cannot make a cgroup under {base}: File exists"


def test_probe_without_a_hierarchy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cgroup, "_own_cgroup", lambda: None)
    assert probe() == (None, "no cgroup v2 hierarchy is mounted")


def test_our_own_cgroup_is_found_where_cgroup2_is_mounted() -> None:
    mounts = Path("/proc/self/mountinfo").read_text()
    own = _cgroup._own_cgroup()
    if " - cgroup2 " not in mounts:
        assert own is None
        return
    assert own is not None and own.is_dir(), own
    assert (own / "cgroup.procs").exists()


def test_limits_are_written_as_the_kernel_reads_them(tmp_path: Path) -> None:
    task = CgroupParent(tmp_path, cpu=True).create("task-a-1")
    assert task == TaskCgroup(tmp_path / "task-a-1", cpu=True)
    task.limit(64 << 20, 1.5)
    assert (task.path / "memory.max").read_text() == str(64 << 20)
    assert (task.path / "memory.swap.max").read_text() == "0"  # no swapping past it
    assert (task.path / "cpu.max").read_text() == "150000 100000"
    task.limit(None, 0.001)  # the smallest quota the kernel takes is 1 ms
    assert (task.path / "cpu.max").read_text() == "1000 100000"


def test_no_cpu_limit_without_the_controller_or_a_rate(tmp_path: Path) -> None:
    CgroupParent(tmp_path, cpu=False).create("a").limit(1 << 20, 2.0)
    assert not (tmp_path / "a" / "cpu.max").exists()
    CgroupParent(tmp_path, cpu=True).create("b").limit(None, 0.0)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == []


def test_create_refuses_an_existing_cgroup(tmp_path: Path) -> None:
    CgroupParent(tmp_path, cpu=False).create("a")
    with pytest.raises(FileExistsError):
        CgroupParent(tmp_path, cpu=False).create("a")


def test_usage_is_read_from_the_keyed_files(tmp_path: Path) -> None:
    task = TaskCgroup(tmp_path, cpu=True)
    assert task.oom_kills() == 0 and task.cpu_time() == 0.0  # no files yet: nothing used
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\njunk\nx y\n")
    assert task.oom_kills() == 2
    assert task.cpu_time() == 2.5


def test_kill_writes_the_kill_file_and_remove_says_whether_it_went(tmp_path: Path) -> None:
    task = CgroupParent(tmp_path, cpu=False).create("a")
    task.kill()
    assert (task.path / "cgroup.kill").read_text() == "1"
    assert not task.remove()  # not empty: the kernel's rmdir would refuse too
    (task.path / "cgroup.kill").unlink()
    assert task.remove() and not task.path.exists()
    task.kill()  # gone: silent
    assert not task.remove()
