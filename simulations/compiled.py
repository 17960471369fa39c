"""The optional compiled build: swim/'s and the engine's hot modules compiled by mypyc.

The simulator spends its time in the swim core's per-packet path and in its own event
loop, both plain Python. mypyc (shipped with the project's mypy) compiles those modules,
unchanged, to C extensions. They keep their behaviour, so a run gives the same digest
compiled or not; only the speed differs (docs/simulations.md, "Speed"). The
interpreted sources stay the supported path: the daemon runs them, and the build is
only for long simulations.

    python -m simulations.compiled              # build (or rebuild) build/mypyc
    populi-sim --compiled run demo --members 1000 --duration 300
    make compiled; make test-compiled           # the same, and the swim and simulator tests on it

The build is a copy of swim/ and simulations/ under ``build/mypyc`` with the modules
below compiled in place, stamped with a hash of the sources, mypy's version and
Python's: it is rebuilt whenever one changes, never run stale. It needs a C compiler and
Python's headers.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["BUILD", "MODULES", "CompileError", "build", "is_current", "run_compiled"]

#: The repository root (the build copies its swim/ and simulations/).
_ROOT = Path(__file__).resolve().parents[1]
#: Where the build goes (ignored by git, as all of build/).
BUILD = _ROOT / "build" / "mypyc"
#: The compiled modules: swim's per-packet path and the engine's event loop. The rest
#: (configuration, attrs classes with validators, the runner, reports) stays
#: interpreted in the copy: compiling it would gain nothing measurable.
MODULES = (
    "swim/_math.py", "swim/awareness.py", "swim/broadcast.py", "swim/probe.py",
    "swim/suspicion.py", "swim/wire.py", "swim/_records.py", "swim/_core.py",
    "swim/_pulling.py", "swim/_rumors.py", "swim/_probing.py", "swim/_anti_entropy.py",
    "swim/_timers.py", "swim/_invariants.py", "swim/_membership.py",
    "simulations/_engine.py", "simulations/_invariants.py", "simulations/_rng.py",
)  # fmt: skip
_PACKAGES = ("swim", "simulations")
_MYPY_INI = "[mypy]\nstrict = True\nignore_missing_imports = True\n"


class CompileError(Exception):
    """The build failed; the message says why in one line."""


def _sources(root: Path) -> list[Path]:
    files: list[Path] = []
    for package in _PACKAGES:
        files.extend(sorted((root / package).rglob("*.py")))
        files.extend(sorted((root / package).rglob("*.toml")))
    return files


def _stamp(root: Path) -> str:
    """A hash of what the build is made from: the sources, the module list, mypy, Python."""
    try:
        from mypy.version import __version__ as mypy_version
    except ImportError:
        mypy_version = "none"
    digest = hashlib.sha256()
    digest.update(f"{sys.version}\n{mypy_version}\n{' '.join(MODULES)}\n".encode())
    for path in _sources(root):
        digest.update(f"{path.relative_to(root)}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def is_current(target: Path = BUILD, root: Path = _ROOT) -> bool:
    """Whether `target` holds a build of the sources under `root` as they are now."""
    stamp = target / "stamp"
    return stamp.is_file() and stamp.read_text() == _stamp(root)


def build(target: Path = BUILD, *, root: Path = _ROOT, quiet: bool = False) -> Path:
    """Build the compiled copy of the sources under `root` in `target` unless it is
    current; returns `target`.

    Raises:
        CompileError: mypyc or the C compiler failed (the last line of its output).
    """
    if is_current(target, root):
        return target
    stamp = _stamp(root)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    for path in _sources(root):
        copy = staging / path.relative_to(root)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, copy)
    (staging / "mypy.ini").write_text(_MYPY_INI)
    if not quiet:
        print(f"compiling {len(MODULES)} modules with mypyc into {target} ...", flush=True)
    command = [sys.executable, "-m", "mypyc", *MODULES]
    done = subprocess.run(command, cwd=staging, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        last = lines[-1] if lines else "no output"
        raise CompileError(
            f"mypyc failed (exit {done.returncode}): {last} (it needs a C compiler and "
            f"Python's headers; the whole output: cd {staging} && {' '.join(command)})"
        )
    shutil.rmtree(staging / "build", ignore_errors=True)  # mypyc's object files
    (staging / "stamp").write_text(stamp)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def run_compiled(main: str, argv: Sequence[str], target: Path = BUILD) -> int:
    """Run `main` (a module name, as ``python -m``, or a script's path ending in .py) with
    `argv` on the compiled build (built first if needed), in a child process; returns its
    exit status. The child finds the build's path in ``$POPULI_MYPYC_BUILD``."""
    try:
        build(target)
    except CompileError as exc:
        print(f"--compiled: {exc}", file=sys.stderr)
        return 2
    # The build goes first on sys.path, ahead of the sources (and of the working
    # directory, which may be the repository root).
    run = "run_path(main" if main.endswith(".py") else "run_module(main, alter_sys=True"
    code = (
        "import runpy, sys; target, main = sys.argv[1:3]; del sys.argv[1:3]; "
        f"sys.path.insert(0, target); runpy.{run}, run_name='__main__')"
    )
    command = [sys.executable, "-c", code, str(target), main, *argv]
    env = dict(os.environ, POPULI_MYPYC_BUILD=str(target))
    return subprocess.run(command, env=env, check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m simulations.compiled [TARGET]`: build it; exit 2 when that fails."""
    args = list(sys.argv[1:] if argv is None else argv)
    target = Path(args[0]) if args else BUILD
    try:
        build(target)
    except CompileError as exc:
        print(f"simulations.compiled: {exc}", file=sys.stderr)
        return 2
    print(f"compiled build current: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
