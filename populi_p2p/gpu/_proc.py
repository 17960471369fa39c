"""Running a vendor command-line tool with a bound on time and output.

The CLI-based probes (``nvidia-smi``, ``rocm-smi``, ``amd-smi``, ``system_profiler``)
share this so each gets the same guarantees: the tool is found on ``PATH`` at probe time
(a driver installed after the daemon started is picked up), it is killed when it runs
past ``timeout`` (a wedged driver makes ``nvidia-smi`` hang for minutes), and failures
come back as a one-line message, never an exception.
"""

from __future__ import annotations

import shutil
import subprocess

import attrs

#: Output beyond this is ignored: a probe's JSON for 16 GPUs is well under 1 MiB.
MAX_OUTPUT = 4 * 1024 * 1024


@attrs.frozen
class CommandResult:
    stdout: str = ""
    error: str | None = None
    missing: bool = False


def find_tool(name: str, explicit: str | None = None) -> str | None:
    """``explicit`` if given, else ``name`` looked up on ``PATH`` now."""
    return explicit if explicit is not None else shutil.which(name)


def run_tool(argv: list[str], timeout: float) -> CommandResult:
    """Run ``argv`` and return its stdout, or an error line. Never raises."""
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return CommandResult(error=f"{argv[0]}: not found", missing=True)
    except subprocess.TimeoutExpired:
        return CommandResult(error=f"{argv[0]}: timed out after {timeout:g}s")
    except OSError as exc:
        return CommandResult(error=f"{argv[0]}: {exc.strerror or exc}")
    out = proc.stdout[:MAX_OUTPUT].decode("utf-8", "replace")
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout)[:MAX_OUTPUT].decode("utf-8", "replace").strip()
        first = detail.splitlines()[0] if detail else ""
        return CommandResult(
            stdout=out, error=f"{argv[0]}: exit status {proc.returncode}: {first}".rstrip(": ")
        )
    return CommandResult(stdout=out)
