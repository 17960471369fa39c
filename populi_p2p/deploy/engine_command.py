"""The one place that says how a deployed replica's engine is started.

`engine_command` turns (engine kind, model file, model id, port, context length,
GPUs) into the argv the executor runs. The kinds:

- ``llama-server``: llama.cpp's own server (``make`` builds it; docs/inference.md),
  found next to the daemon's Python (``.venv/bin``) or on the daemon's ``PATH``;
- ``llama-cpp-python``: ``python -m llama_cpp.server`` with the daemon's Python;
- ``standin``: the stand-in engine (`populi_p2p.testing.standin`), for tests and the
  demo: it checks the model file is readable and serves deterministic words.

``auto`` (the default of ``up --deploy-engine``) takes the first of ``llama-server``
and ``llama-cpp-python`` found on this node, and says so in one line when none is.

The engine runs as the node's task user, which may not reach the daemon's files:
`reachable_by_others` says whether it can run a binary where it is (else the runner
gives it a copy in its work directory, see `deploy/runner.py`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

__all__ = [
    "ENGINE_KINDS",
    "EngineNotFound",
    "engine_command",
    "llama_server_binary",
    "reachable_by_others",
    "resolve_engine",
]

ENGINE_KINDS: Final = ("auto", "llama-server", "llama-cpp-python", "standin")
#: Daemon environment variables passed on to a stand-in engine (tests set them).
STANDIN_ENV_PREFIX: Final = "POPULI_STANDIN_"


class EngineNotFound(Exception):
    """No engine of the asked kind on this node (one line: what to install or pass)."""


#: Directories a task may see as its own (the executor's mount namespace gives each task
#: a private ``/tmp``): a binary there is not the daemon's binary for the task.
PRIVATE_DIRS: Final = ("/tmp", "/var/tmp")


def reachable_by_others(path: Path) -> bool:
    """Whether any user may run `path`: every directory on the way searchable and the
    file executable by others, and not under a directory a task sees as its own."""
    path = path.resolve()
    if any(path.is_relative_to(d) for d in PRIVATE_DIRS):
        return False
    try:
        return all(_mode(p) & 0o001 for p in (path, *path.parents))
    except OSError:
        return False


def _mode(path: Path) -> int:
    return os.stat(path).st_mode


def llama_server_binary() -> str | None:
    """The ``llama-server`` binary this node deploys with, or None."""
    return _llama_server()


def _llama_server() -> str | None:
    """The binary `up --gguf` would run (`find_llama_server`), or None."""
    from ..inference.llama_server import LlamaServerError, find_llama_server

    try:
        return str(find_llama_server())
    except LlamaServerError:
        return None


def resolve_engine(kind: str) -> str:
    """The concrete engine kind for `kind` (``auto`` picks what is installed).

    Raises:
        EngineNotFound: the kind is unknown, or nothing it names is installed.
    """
    if kind not in ENGINE_KINDS:
        raise EngineNotFound(f"--deploy-engine {kind}: one of {', '.join(ENGINE_KINDS)}")
    has_python = importlib.util.find_spec("llama_cpp") is not None
    if kind == "auto":
        if _llama_server() is not None:
            return "llama-server"
        if has_python:
            return "llama-cpp-python"
        raise EngineNotFound(
            "no engine to deploy with on this node: build llama-server (make) or install"
            " llama-cpp-python[server], or start the daemon with --deploy-engine standin"
        )
    if kind == "llama-server" and _llama_server() is None:
        raise EngineNotFound("llama-server is not on this node (build it with make)")
    if kind == "llama-cpp-python" and not has_python:
        raise EngineNotFound("llama-cpp-python is not installed (pip install llama-cpp-python)")
    return kind


def engine_command(
    kind: str,
    model_path: Path,
    model_id: str,
    port: int,
    *,
    ctx: int = 0,
    gpus: int = 0,
    environ: Mapping[str, str] | None = None,
    binary: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) that serve `model_path` as `model_id` on
    ``127.0.0.1:port``. `kind` is a resolved kind (`resolve_engine`); `binary` the
    ``llama-server`` to run (default: the one found here).

    ``llama-server`` runs as ``up --gguf`` runs it (`llama_server_argv`): ``--jinja``
    (the model's own chat template) and no web UI; ``-c`` only when a context length
    was asked (the engine's default otherwise, 4096 for this llama.cpp)."""
    host, path = ["--host", "127.0.0.1", "--port", str(port)], str(model_path)
    if kind == "llama-server":
        binary = binary or _llama_server() or "llama-server"
        argv = [binary, "-m", path, "--alias", model_id, *host, "--jinja", "--no-webui"]
        if ctx:
            argv += ["-c", str(ctx)]
        return [*argv, "-ngl", "999" if gpus else "0"], {}
    if kind == "llama-cpp-python":
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", path,
                "--model_alias", model_id, *host, "--interrupt_requests", "False"]  # fmt: skip
        if ctx:
            argv += ["--n_ctx", str(ctx)]
        return [*argv, "--n_gpu_layers", "-1" if gpus else "0"], {}
    if kind == "standin":
        env = environ if environ is not None else os.environ
        passed = {k: v for k, v in env.items() if k.startswith(STANDIN_ENV_PREFIX)}
        argv = [sys.executable, "-m", "populi_p2p.testing.standin", "--model", model_id,
                "--model-file", path, *host]  # fmt: skip
        return argv, passed
    raise EngineNotFound(f"unknown engine kind {kind!r}")
