"""A stand-in inference engine: the OpenAI API's shape, deterministic text, and
controllable faults, for tests and the demo.

The text is ``w0 w1 w2 ...`` (one word per token), so a client can check a stream has
no repeated and no lost token. A continuation (an assistant message last, or a prompt
that already ends with words) resumes at the next index, as a real model continuing
its own prefix would.

Run: ``python -m populi_p2p.testing.standin --port 8081 --model tiny --tokens 50``.
Like a real engine it refuses a request it cannot serve with a 400: a ``max_tokens``
that is not a positive integer, or more than its context length (vLLM's answer).
``--slots N`` serves at most N requests at once (the rest wait, as in llama.cpp's
server) and says so at ``GET /props`` (``total_slots``, llama.cpp's field).
Faults: ``--delay`` seconds per token, ``--error`` (every completion is a 500),
``--crash-at K`` (the process exits after token K, mid-stream), ``--stall-at K``
(stops sending after token K but keeps the connection). Each also reads an env var
``POPULI_STANDIN_<FLAG>`` so a test can set it for a process it does not start.

As a deployed replica's engine (`populi_p2p.deploy.engine_command`): ``--model-file``
is read whole before it listens, as a real engine loads its model (a file it cannot
read ends it with one line), after ``--load-delay`` seconds; ``--history DIR`` writes
the probe's lines (``tests/history/probe.py``: a lock held while it lives, ``start``,
and ``end`` at SIGTERM) for the task it runs as, so the history checker sees each run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import trio

from ..inference._asgi import (
    BodyTooLarge,
    Receive,
    Scope,
    Send,
    lifespan,
    read_body,
    send_json,
    send_stream,
    serve_tcp,
)

__all__ = ["StandinConfig", "StandinEngine", "main"]

_WORD = re.compile(r"w(\d+)\s*$")


@attrs.frozen
class StandinConfig:
    model: str = "standin"
    tokens: int = 20
    delay: float = 0.0
    error: bool = False
    crash_at: int | None = None
    stall_at: int | None = None
    context_length: int = 4096
    #: Requests served at once (0: no limit, and no ``/props``).
    slots: int = 0


def _start_index(prefix: str) -> int:
    match = _WORD.search(prefix)
    return int(match.group(1)) + 1 if match else 0


class StandinEngine:
    """The ASGI app. `requests` counts completions served (tests read it)."""

    def __init__(self, config: StandinConfig) -> None:
        self.config = config
        self.requests = 0
        self._slots = trio.Semaphore(config.slots) if config.slots > 0 else None

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path in ("/health", "/v1/health"):
            await send_json(send, 200, {"status": "ok"})
        elif method == "GET" and path == "/props" and self.config.slots > 0:
            await send_json(send, 200, {"total_slots": self.config.slots})
        elif method == "GET" and path == "/v1/models":
            await send_json(send, 200, {"object": "list", "data": [{
                "id": self.config.model, "object": "model", "owned_by": "standin",
                "meta": {"n_ctx_train": self.config.context_length},
            }]})  # fmt: skip
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            try:
                body = json.loads(await read_body(receive, 1 << 22))
            except (BodyTooLarge, ValueError):
                await send_json(send, 400, {"error": {"message": "bad body"}})
                return
            if self._slots is None:
                await self._complete(send, path.endswith("chat/completions"), body)
                return
            async with self._slots:
                await self._complete(send, path.endswith("chat/completions"), body)
        else:
            await send_json(send, 404, {"error": {"message": f"no route {path}"}})

    async def _complete(self, send: Send, chat: bool, body: dict[str, Any]) -> None:
        cfg = self.config
        self.requests += 1
        if cfg.error:
            await send_json(send, 500, {"error": {"message": "stand-in engine error"}})
            return
        refusal = _refusal(body, cfg.context_length)
        if refusal is not None:
            await send_json(send, 400, {"error": {
                "message": refusal, "type": "invalid_request_error", "param": "max_tokens",
                "code": None,
            }})  # fmt: skip
            return
        if chat:
            messages = body.get("messages") or [{}]
            last = messages[-1] if isinstance(messages[-1], dict) else {}
            prefix = str(last.get("content", "")) if last.get("role") == "assistant" else ""
        else:
            prefix = str(body.get("prompt", ""))
        start = _start_index(prefix)
        limit = int(body.get("max_tokens") or cfg.tokens)
        words = [f"w{i} " for i in range(start, max(start, min(cfg.tokens, start + limit)))]
        kind = "chat.completion" if chat else "text_completion"
        created = int(time.time())
        if body.get("stream") is not True:  # as real engines read it: "false" is not
            for _ in words:
                await trio.sleep(cfg.delay)
            text = "".join(words)
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            await send_json(send, 200, {"id": "standin", "object": kind, "created": created,
                                        "model": cfg.model, "choices": [choice]})  # fmt: skip
            return
        await send_stream(send, 200, self._events(words, chat, created, start),
                          content_type="text/event-stream")  # fmt: skip

    async def _events(
        self, words: list[str], chat: bool, created: int, start: int
    ) -> AsyncIterator[bytes]:
        cfg = self.config
        kind = "chat.completion.chunk" if chat else "text_completion"
        for offset, word in enumerate(words):
            index = start + offset
            if cfg.crash_at is not None and index >= cfg.crash_at:
                os._exit(3)  # the engine dies mid-stream
            if cfg.stall_at is not None and index >= cfg.stall_at:
                await trio.sleep_forever()
            await trio.sleep(cfg.delay)
            delta: dict[str, Any] = {"delta": {"content": word}} if chat else {"text": word}
            chunk = {"id": "standin", "object": kind, "created": created, "model": cfg.model,
                     "choices": [{"index": 0, "finish_reason": None, **delta}]}  # fmt: skip
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        end: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
        chunk = {"id": "standin", "object": kind, "created": created, "model": cfg.model,
                 "choices": [{"index": 0, "finish_reason": "stop", **end}]}  # fmt: skip
        yield b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"


def _refusal(body: dict[str, Any], context_length: int) -> str | None:
    """Why the engine refuses `body` (a 400), if it does."""
    limit = body.get("max_tokens")
    if limit is None:
        return None
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return f"max_tokens must be a positive integer, got {limit!r}"
    if limit > context_length:
        return (
            f"This model's maximum context length is {context_length} tokens. However, you"
            f" requested {limit} tokens. Please reduce the length of the messages or completion."
        )
    return None


def _load(path: str, delay: float) -> None:
    """Read the model file whole (a real engine's load), after `delay` seconds."""
    time.sleep(delay)
    try:
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    except OSError as exc:
        sys.exit(f"standin: cannot read the model file {path}: {exc.strerror}")


def _daemon_pid() -> int:
    """The daemon's pid: our parent, or its parent when our parent is the task wrapper."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            if b"executor/_wrapper.py" not in f.read():
                return parent
        with open(f"/proc/{parent}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return parent


def _history(logdir: str) -> None:
    """The probe's lines for this run (`tests/history/probe.py`'s format): the lock
    is taken and kept for the process's life; ``end`` is written at SIGTERM."""
    import fcntl
    import signal

    task = os.environ.get("POPULI_TASK_ID", "unknown")
    epoch = int(os.environ.get("POPULI_TASK_EPOCH", "0"))
    lock = os.open(os.path.join(logdir, f"{task}.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    log = os.open(os.path.join(logdir, f"{task}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def line(event: str, locked: bool) -> None:
        record = {"task": task, "epoch": epoch, "event": event, "time": time.time(),
                  "pid": os.getpid(), "ppid": _daemon_pid(), "node": None,
                  "seconds": 1e9, "locked": locked}  # fmt: skip
        os.write(log, (json.dumps(record, sort_keys=True) + "\n").encode())

    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locked = True
    except BlockingIOError:
        locked = False
        line("overlap", locked)
    line("start", locked)

    def on_term(_signum: int, _frame: object) -> None:
        line("end", locked)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)


def _env(name: str) -> str | None:
    return os.environ.get(f"POPULI_STANDIN_{name.upper()}")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="populi-standin", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=int(_env("port") or 8081))
    p.add_argument("--model", default=_env("model") or "standin")
    p.add_argument("--tokens", type=int, default=int(_env("tokens") or 20))
    p.add_argument("--delay", type=float, default=float(_env("delay") or 0.0))
    p.add_argument("--error", action="store_true", default=bool(_env("error")))
    crash, stall = _env("crash_at"), _env("stall_at")
    p.add_argument("--crash-at", type=int, default=int(crash) if crash else None)
    p.add_argument("--stall-at", type=int, default=int(stall) if stall else None)
    p.add_argument(
        "--slots",
        type=int,
        default=int(_env("slots") or 0),
        help="requests served at once (default: no limit)",
    )
    p.add_argument("--port-file", help="write the bound port here once listening")
    p.add_argument("--model-file", help="a file to read whole before listening (the model)")
    p.add_argument("--load-delay", type=float, default=float(_env("load_delay") or 0.0))
    p.add_argument("--history", default=_env("history"), help="write probe lines here")
    a = p.parse_args(argv)
    if a.history:
        _history(a.history)
    if a.model_file:
        _load(a.model_file, a.load_delay)
    engine = StandinEngine(StandinConfig(
        model=a.model, tokens=a.tokens, delay=a.delay, error=a.error,
        crash_at=a.crash_at, stall_at=a.stall_at, slots=a.slots,
    ))  # fmt: skip

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(lambda task_status: serve_tcp(
                engine.app, a.host, a.port, logger_name="populi.standin",
                task_status=task_status))  # fmt: skip
            print(f"standin engine {a.model} on http://{a.host}:{port}", file=sys.stderr)
            if a.port_file:
                with open(a.port_file + ".tmp", "w") as f:
                    f.write(str(port))
                os.replace(a.port_file + ".tmp", a.port_file)

    trio.run(serve)


if __name__ == "__main__":
    main()
