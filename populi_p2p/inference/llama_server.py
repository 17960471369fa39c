"""llama.cpp's ``llama-server``, started by the node on a GGUF file (``--gguf``).

``--engine URL`` attaches an engine someone else runs; ``--gguf [NAME=]FILE.gguf``
makes the node run one itself: `LlamaServer` starts ``llama-server`` on 127.0.0.1 with
port 0, reads the port it took from its log, and hands the URL to the engine service,
which polls it like any other engine (the model enters the record once it has loaded).
The server is ours to stop: it is killed when the node stops, dies with the node
(``PR_SET_PDEATHSIG``, so a kill -9 of the daemon leaves no orphan serving), and is
started again (same port, growing delay) if it exits on its own.

Why llama.cpp's own server: it continues a final assistant message (the prefix is
appended to the rendered prompt), so a stream moved to another node at temperature 0
continues the same text; llama-cpp-python's server starts a new answer instead
(docs/inference.md, "Which engines continue a partial answer").

The binary: ``--llama-server PATH``, else ``$POPULI_LLAMA_SERVER``, else
``llama-server`` beside the running Python (``make engine`` puts a CPU-only build in
``.venv/bin``), else the first on ``PATH``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import attrs
import trio

from .._log import event, get_logger

__all__ = [
    "LLAMA_SERVER_ENV",
    "GgufSpec",
    "LlamaServer",
    "LlamaServerError",
    "find_llama_server",
    "llama_server_argv",
    "parse_gguf",
]

#: Environment variable naming the ``llama-server`` binary.
LLAMA_SERVER_ENV: Final = "POPULI_LLAMA_SERVER"
#: Seconds a fresh ``llama-server`` may take to open its port (it loads the model after).
START_TIMEOUT: Final = 60.0
#: Restart delays after the server exits on its own: doubles from the first to the last.
RESTART_DELAY_MIN: Final = 1.0
RESTART_DELAY_MAX: Final = 30.0
#: Bytes of the server's log kept for an error message.
TAIL_BYTES: Final = 2000
_LISTENING: Final = re.compile(rb"HTTP server is listening, hostname: [^,]*, port: (\d+)")
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
_PR_SET_PDEATHSIG: Final = 1
_log = get_logger("engine")


class LlamaServerError(Exception):
    """``llama-server`` could not be found or started (one line, says what to do)."""


@attrs.frozen
class GgufSpec:
    """One ``--gguf`` value: the model id to serve `path` as."""

    name: str
    path: Path


def parse_gguf(text: str) -> GgufSpec:
    """``NAME=FILE.gguf`` or ``FILE.gguf`` (the name is then the file's stem).

    Raises:
        ValueError: no such file, or a name that is not a model id.
    """
    name, sep, path_text = text.partition("=")
    if not sep:
        name, path_text = "", text
    path = Path(path_text).expanduser()
    name = name or path.stem
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a model name (letters, digits, '._:/-', at most 128): "
            "give one as NAME=FILE.gguf"
        )
    if not path.is_file():
        raise ValueError(f"{str(path)!r} is not a file (give [NAME=]FILE.gguf)")
    return GgufSpec(name, path.resolve())


def find_llama_server(explicit: str | None = None) -> Path:
    """The ``llama-server`` binary to run.

    Raises:
        LlamaServerError: none found; says how to get one.
    """
    wanted = explicit or os.environ.get(LLAMA_SERVER_ENV)
    if wanted:
        path = Path(wanted).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise LlamaServerError(f"llama-server {str(path)!r} is not an executable file")
    beside = Path(sys.executable).parent / "llama-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    raise LlamaServerError(
        "llama-server not found: run `make engine` (builds llama.cpp's server into "
        f".venv/bin), or name one with --llama-server PATH or ${LLAMA_SERVER_ENV}"
    )


def llama_server_argv(
    binary: Path, spec: GgufSpec, *, port: int = 0, threads: int | None = None,
    extra: Sequence[str] = (),
) -> list[str]:  # fmt: skip
    """``llama-server`` on loopback serving `spec` under its name.

    ``--jinja`` renders the model's own chat template (the legacy renderer knows only
    built-in templates and falls back to ChatML for any other); the web UI is off
    (nobody browses a mesh engine).
    """
    argv = [
        str(binary), "--model", str(spec.path), "--alias", spec.name,
        "--host", "127.0.0.1", "--port", str(port), "--jinja", "--no-webui",
    ]  # fmt: skip
    if threads is not None:
        argv += ["--threads", str(threads), "--threads-batch", str(threads)]
    return [*argv, *extra]


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """In the child before exec: SIGKILL when the daemon's main thread ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)


class LlamaServer:
    """One ``llama-server`` process for one GGUF, kept running while `run` runs.

    Args:
        binary: the ``llama-server`` to run (`find_llama_server`).
        spec: the model file and the name it is served as.
        log_path: where the server's output goes (truncated at each start).
        threads: CPU threads (None: llama.cpp's default, every core).
        extra: more ``llama-server`` flags.
    """

    def __init__(
        self, binary: Path, spec: GgufSpec, log_path: Path, *, threads: int | None = None,
        extra: Sequence[str] = (),
    ) -> None:  # fmt: skip
        self.binary = binary
        self.spec = spec
        self.log_path = log_path
        self._threads = threads
        self._extra = tuple(extra)
        #: ``http://127.0.0.1:PORT`` once the first start opened its port.
        self.url: str | None = None
        #: The running process's id (None between runs).
        self.pid: int | None = None
        self.starts = 0

    def tail(self) -> str:
        """The end of the server's log (for an error message)."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(max(0, self.log_path.stat().st_size - TAIL_BYTES))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the server, report its URL (`task_status`), restart it if it exits.

        Raises:
            LlamaServerError: the first start failed (the binary would not run, or
                the server exited or did not open its port within `START_TIMEOUT`).
        """
        port, delay = 0, RESTART_DELAY_MIN
        while True:
            with self._spawn(port) as proc:
                try:
                    port = await self._await_port(proc)
                except LlamaServerError:
                    if self.url is None:
                        raise
                    event(_log, 40, "engine.llama_server.start_failed", model=self.spec.name,
                          tail=self.tail()[-300:])  # fmt: skip
                else:
                    if self.url is None:
                        self.url = f"http://127.0.0.1:{port}"
                        task_status.started(self.url)
                    event(_log, 20, "engine.llama_server.started", model=self.spec.name,
                          url=self.url, pid=proc.pid)  # fmt: skip
                    started = trio.current_time()
                    code = await _wait(proc)
                    if trio.current_time() - started >= RESTART_DELAY_MAX:
                        delay = RESTART_DELAY_MIN  # it served a while: not a crash loop
                    event(_log, 30, "engine.llama_server.exited", model=self.spec.name,
                          code=code, tail=self.tail()[-300:])  # fmt: skip
            await trio.sleep(delay)
            delay = min(2 * delay, RESTART_DELAY_MAX)

    @contextlib.contextmanager
    def _spawn(self, port: int) -> Iterator[subprocess.Popen[bytes]]:
        """The process, killed and reaped on the way out (cancelled or not)."""
        argv = llama_server_argv(
            self.binary, self.spec, port=port, threads=self._threads, extra=self._extra
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.log_path.open("wb") as log:
                # In this (the main) thread: the death signal follows the thread that
                # forked, and trio's worker threads come and go.
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent, start_new_session=True,
                )  # fmt: skip
        except OSError as exc:
            raise LlamaServerError(f"cannot run {argv[0]!r}: {exc.strerror}") from None
        self.starts += 1
        self.pid = proc.pid
        try:
            yield proc
        finally:
            self.pid = None
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    async def _await_port(self, proc: subprocess.Popen[bytes]) -> int:
        """The port from the server's log, polled until `START_TIMEOUT`."""
        with trio.move_on_after(START_TIMEOUT):
            while proc.poll() is None:
                found = _LISTENING.search(self.log_path.read_bytes()[:65536])
                if found:
                    return int(found.group(1))
                await trio.sleep(0.05)
            raise LlamaServerError(
                f"llama-server for {self.spec.name!r} exited ({proc.returncode}) before "
                f"opening its port: {self.tail()[-300:]!r}"
            )
        raise LlamaServerError(
            f"llama-server for {self.spec.name!r} did not open its port in "
            f"{START_TIMEOUT:.0f} s (see {self.log_path})"
        )


async def _wait(proc: subprocess.Popen[bytes]) -> int:
    """Its exit code, waiting on a pidfd (no thread, no polling)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # gone already (or no pidfd): poll
        while proc.poll() is None:
            await trio.sleep(0.5)
        return proc.returncode
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)
    return proc.wait()
