"""cgroup v2 for tasks, where the node may use it: detect, never assume.

A per-task cgroup gives the kernel's own memory limit (``memory.max``, with OOM kills
counted in ``memory.events``), a CPU rate (``cpu.max``), exact CPU accounting
(``cpu.stat``) and a kill that no ``setsid`` escapes (``cgroup.kill``). The node may use
it only when some cgroup it can write already has the ``memory`` controller enabled for
its children (``cgroup.subtree_control``): systemd's ``Delegate=yes`` or a container
runtime set up that way. cgroup v2 forbids enabling controllers in a cgroup that holds
processes, so the node does not move itself around to make one; the operator can name
a prepared parent (``ExecutorConfig.cgroup_parent``). `probe` tries for real (it makes
and removes a child) and says why not otherwise; the executor then uses rlimits.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

__all__ = ["CgroupParent", "TaskCgroup", "probe"]

_CPU_PERIOD_US = 100_000


def _own_cgroup() -> Path | None:
    """Our cgroup v2 directory, from /proc/self/cgroup and /proc/self/mountinfo."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    rel = next((ln[3:] for ln in lines if ln.startswith("0::")), None)
    if rel is None:
        return None
    for line in mounts:
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return Path(left.split()[4]) / rel.lstrip("/")
    return None


@attrs.frozen
class CgroupParent:
    """A cgroup whose children get the memory (and maybe cpu) controller."""

    path: Path
    cpu: bool  # whether ``cpu.max`` is available to children

    def create(self, name: str) -> TaskCgroup:
        """Make the task's cgroup; raises `OSError` when the kernel refuses."""
        path = self.path / name
        path.mkdir(mode=0o755)
        return TaskCgroup(path, self.cpu)


@attrs.frozen
class TaskCgroup:
    """One task's cgroup: set limits, read usage, kill everything, remove."""

    path: Path
    cpu: bool

    def limit(self, memory: int | None, cpus: float) -> None:
        if memory is not None:
            (self.path / "memory.max").write_text(str(memory))
            try:
                (self.path / "memory.swap.max").write_text("0")
            except OSError:
                pass  # no swap accounting: the memory limit still holds
        if self.cpu and cpus > 0:
            quota = max(1000, int(cpus * _CPU_PERIOD_US))
            (self.path / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}")

    def oom_kills(self) -> int:
        return _keyed(self.path / "memory.events").get("oom_kill", 0)

    def cpu_time(self) -> float:
        return _keyed(self.path / "cpu.stat").get("usage_usec", 0) / 1e6

    def kill(self) -> None:
        """SIGKILL every process in the cgroup (kernel 5.14+); silent where missing."""
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:
            pass

    def remove(self) -> bool:
        try:
            self.path.rmdir()
        except OSError:
            return False
        return True


def _keyed(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def probe(parent: Path | None = None) -> tuple[CgroupParent | None, str]:
    """Find a cgroup the node may use for tasks, trying for real; (None, why) if none."""
    base = parent if parent is not None else _own_cgroup()
    if base is None:
        return None, "no cgroup v2 hierarchy is mounted"
    try:
        enabled = (base / "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        return None, f"cannot read {base}/cgroup.subtree_control: {exc.strerror}"
    if "memory" not in enabled:
        return None, f"the memory controller is not enabled for children of {base}"
    candidate = CgroupParent(base, "cpu" in enabled)
    try:
        trial = candidate.create(f"populi-probe-{os.getpid()}")
    except OSError as exc:
        return None, f"cannot make a cgroup under {base}: {exc.strerror}"
    try:
        trial.limit(1 << 30, 0.0)
    except OSError as exc:
        return None, f"cannot set memory.max under {base}: {exc.strerror}"
    finally:
        trial.remove()
    return candidate, f"cgroup v2 under {base}"
