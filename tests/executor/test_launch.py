"""A task's PATH, and a command that cannot run (issue 20, item 9).

Tasks get a PATH of their own (not the daemon's, whose directories the task's uid may
not search), and a command that is missing or not executable ends ``start_failed``
with one line that says so, marked `final` (no retry would do better), and the same
line on the task's stderr, where `logs` and `submit --wait` show it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from populi_p2p.executor._launch import DEFAULT_PATH

from .helpers import executor, run_one, spec

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a uid per task needs root")
#: A uid per task, as root does by default, but no private /tmp: the task sees tmp_path.
OWN_UID = {"task_user": None, "namespaces": False}


def _daemon_path_with_a_closed_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The daemon's PATH starts with a directory only root may search, as
    ``/root/.local/bin`` is on many machines."""
    closed = tmp_path / "root-only" / "bin"
    closed.mkdir(parents=True)
    (tmp_path / "root-only").chmod(0o700)
    monkeypatch.setenv("PATH", f"{closed}:{os.environ.get('PATH', DEFAULT_PATH)}")
    return closed


@needs_root
async def test_a_missing_command_says_command_not_found_not_permission_denied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _daemon_path_with_a_closed_dir(tmp_path, monkeypatch)
    async with executor(tmp_path, **OWN_UID) as ex:  # a uid of its own, as root
        ended = await run_one(ex, "typo", spec("pyhton3", "-c", "pass"))
        stderr = ex.log_path("typo", "stderr").read_text()
    assert ended.reason == "start_failed" and ended.exit_code == 127
    assert ended.final, ended
    assert ended.detail == f"cannot run 'pyhton3': command not found in PATH={DEFAULT_PATH}"
    assert "Permission denied" not in ended.detail
    assert stderr == f"populi: {ended.detail}\n"


@needs_root
async def test_the_task_path_is_the_default_not_the_daemons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _daemon_path_with_a_closed_dir(tmp_path, monkeypatch)
    async with executor(tmp_path, **OWN_UID) as ex:
        ended = await run_one(ex, "path", spec("sh", "-c", 'echo "$PATH"'))
        own = await run_one(ex, "own", spec("sh", "-c", 'echo "$PATH"', PATH="/usr/bin:/bin"))
    assert ended.succeeded, ended
    assert ended.stdout_tail.decode().strip() == DEFAULT_PATH
    assert own.stdout_tail.decode().strip() == "/usr/bin:/bin"  # the spec's own wins


@needs_root
async def test_a_spec_path_with_a_closed_dir_names_it(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "tool").write_text("#!/bin/sh\necho found\n")
    (closed / "tool").chmod(0o755)
    async with executor(tmp_path, **OWN_UID) as ex:
        ended = await run_one(ex, "closed", spec("tool", PATH=f"{closed}:/usr/bin:/bin"))
    assert ended.reason == "start_failed" and ended.final, ended
    uid = int(ended.detail.rpartition("by uid ")[2].partition(":")[0])
    assert 61184 <= uid <= 65519, ended.detail
    path = f"{closed}:/usr/bin:/bin"
    shut = f"not searchable by uid {uid}: {closed}"
    assert ended.detail == f"cannot run 'tool': command not found in PATH={path}; {shut}"


@pytest.mark.parametrize(
    ("content", "mode", "says"),
    [
        ("#!/bin/sh\necho hi\n", 0o644, "not executable by uid 0 (Permission denied)"),
        ("echo hi\n", 0o755, "not executable (Exec format error): a script needs a #! line"),
        (
            "#!/no/such/shell\n",
            0o755,
            "not executable: its interpreter '/no/such/shell' was not found",
        ),
    ],
)
async def test_a_file_that_cannot_be_executed_says_why(
    tmp_path: Path, content: str, mode: int, says: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the messages name uid 0: tasks run as root here")
    program = tmp_path / "program"
    program.write_text(content)
    program.chmod(mode)
    async with executor(tmp_path) as ex:  # as root, no namespaces: tmp_path is visible
        ended = await run_one(ex, "bad", spec(str(program)))
    assert ended.reason == "start_failed" and ended.final, ended
    assert ended.detail.startswith(f"cannot run '{program}': {says}"), ended.detail


async def test_a_command_that_exits_127_itself_is_not_final(tmp_path: Path) -> None:
    async with executor(tmp_path) as ex:
        shell = await run_one(ex, "sh127", spec("sh", "-c", "exit 127"))
        missing = await run_one(ex, "nope", spec("/no/such/program-xyz"))
    assert shell.reason == "exited" and shell.exit_code == 127 and not shell.final
    assert missing.final and "command not found (No such file or directory)" in missing.detail
