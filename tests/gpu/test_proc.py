"""`gpu._proc.run_tool`: a vendor tool run with a bound on time and output, never raising."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from populi_p2p.gpu import _proc
from populi_p2p.gpu._proc import CommandResult, find_tool, run_tool


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_stdout_of_a_tool_that_succeeds() -> None:
    assert run_tool(python("print('{\"gpus\": []}')"), 30) == CommandResult('{"gpus": []}\n')


def test_a_missing_tool_says_so() -> None:
    result = run_tool(["/nonexistent/nvidia-smi", "-q"], 30)
    assert result == CommandResult(error="/nonexistent/nvidia-smi: not found", missing=True)


def test_a_failing_tool_gives_its_first_stderr_line() -> None:
    code = "import sys; print('partial'); sys.stderr.write('NVML: driver gone\\nmore\\n'); exit(9)"
    result = run_tool(python(code), 30)
    assert result.error == f"{sys.executable}: exit status 9: NVML: driver gone"
    assert result.stdout == "partial\n" and not result.missing


def test_a_silent_failure_names_only_the_status() -> None:
    result = run_tool(python("exit(2)"), 30)
    assert result.error == f"{sys.executable}: exit status 2"


def test_a_wedged_tool_is_killed_at_the_timeout() -> None:
    result = run_tool(python("import time; time.sleep(60)"), 0.5)
    assert result.error == f"{sys.executable}: timed out after 0.5s"


def test_a_tool_that_cannot_run_is_one_line(tmp_path: Path) -> None:
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    result = run_tool([str(script)], 30)
    assert result.error == f"{script}: Permission denied" and not result.missing


def test_output_is_bounded_and_bad_utf8_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_proc, "MAX_OUTPUT", 4)
    result = run_tool(python("import sys; sys.stdout.buffer.write(b'\\xffabcdef')"), 30)
    assert result == CommandResult("\ufffdabc")


def test_find_tool_prefers_the_explicit_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert find_tool("nvidia-smi", "/opt/nvidia-smi") == "/opt/nvidia-smi"
    tool = tmp_path / "rocm-smi"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_tool("rocm-smi") == str(tool)  # looked up on PATH now
    assert find_tool("amd-smi") is None
