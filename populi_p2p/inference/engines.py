"""The engine service: what this node's local engines serve, observed, not claimed.

It polls each engine's ``GET /v1/models`` every `interval`; an engine that does not
answer within `timeout` (or answers badly) is unhealthy at once and its models leave
the record's ``models`` section, so within ``interval + timeout`` seconds nobody routes
to it. An engine is not polled while it serves one of this node's requests (see
`EngineService._busy`: llama-cpp-python's server would cut the stream short). The
relay also reports a refused connection (`mark_failed`) so the next request does not
wait for the poll. Tokens per second and requests in flight are measured by
the relay (`begin`/`end`). An engine's capacity (requests it serves at once) is read
once it turns healthy from ``GET /props`` (llama.cpp's ``total_slots``; the stand-in
answers the same); an engine without it leaves ``slots`` out and the router assumes
its default. The same answer gives the context a request really gets (llama.cpp's
``default_generation_settings.n_ctx``, its ``-c`` over its slots): the record's ``ctx``
is the lesser of it and what ``/v1/models`` says the model was trained for
(``n_ctx_train``), which the engine's ``-c`` may cut (4096 by default) or exceed.

Section ``models`` (a map, at most `MAX_MODELS` entries)::

    {model_id: {"kind": str, "ctx": int (0: unknown), "tps": float, "inflight": int,
                "slots": int (only when known)}}
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import attrs
import httpx
import trio

from .._log import event, get_logger
from ._tls import tls_context
from .engine_url import check_engine_url

__all__ = ["CONTINUING_KINDS", "MAX_MODELS", "EngineService", "continues_partial", "parse_models"]

#: Most models one node advertises (the record must fit a packet).
MAX_MODELS: Final = 16
MAX_MODEL_ID: Final = 128
#: Largest context length believed; anything above (or not an int) reads as unknown (0).
MAX_CONTEXT: Final = 1 << 24
#: Largest engine capacity believed (``total_slots``); anything else reads as unknown.
MAX_SLOTS: Final = 1024
#: Seconds between record refreshes for load and tokens/s alone.
REFRESH: Final = 10.0
#: Engine kinds known to continue a final assistant message as a prefix (checked:
#: llama.cpp's ``llama-server`` by tests/inference/test_real_engine.py, the stand-in by
#: the relay tests; vLLM documents ``continue_final_message``).
CONTINUING_KINDS: Final = frozenset({"llama.cpp", "vllm", "standin"})
_log = get_logger("engine")


@attrs.define
class _Engine:
    url: str
    healthy: bool = False
    kind: str = "openai"
    models: dict[str, int] = attrs.field(factory=dict)  # id -> context length (0 unknown)
    error: str = "not polled yet"
    slots: int = 0  # requests served at once (0 unknown)
    n_ctx: int = 0  # the context each request gets (0 unknown: the models' own)


def parse_models(body: Any) -> tuple[str, dict[str, int]]:
    """(engine kind, {model id: context length}) from a ``/v1/models`` answer.

    llama.cpp's ``llama-server`` lists its model while still loading it, with
    ``"meta": null``, and answers 503 to everything else until loaded: such an entry
    is left out (the engine is up, its model not yet served).

    Raises:
        ValueError: not the OpenAI list shape.
    """
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise ValueError("/v1/models did not answer an OpenAI model list")
    models: dict[str, int] = {}
    kind = "openai"
    for item in data[:MAX_MODELS]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        kind = _kind(item, kind)
        model_id = item["id"][:MAX_MODEL_ID]
        meta_raw = item.get("meta")
        if meta_raw is None and "meta" in item and item.get("owned_by") == "llamacpp":
            continue  # llama-server still loading this model
        meta: dict[str, Any] = meta_raw if isinstance(meta_raw, dict) else {}
        ctx = meta.get("n_ctx_train", meta.get("n_ctx", item.get("max_model_len", 0)))
        good = isinstance(ctx, int) and not isinstance(ctx, bool) and 0 < ctx <= MAX_CONTEXT
        models[model_id] = ctx if isinstance(ctx, int) and good else 0
    return kind, models


def continues_partial(kind: str) -> bool:
    """Whether an engine of `kind` continues a final assistant message (so that a
    stream moved to it at temperature 0 goes on with the same text), rather than
    starting a new answer after it. See docs/inference.md."""
    return kind in CONTINUING_KINDS


def _kind(item: dict[str, Any], default: str) -> str:
    """The engine kind from one model entry's ``owned_by``.

    llama.cpp's own ``llama-server`` says ``llamacpp``; llama-cpp-python's server says
    ``me`` and is the only one that adds a ``permissions`` list (kind
    ``llama-cpp-python``: it does not continue a partial answer, so it must not pass
    for ``llama.cpp``); Ollama says ``library``; vLLM says ``vllm``. Anything else is
    kept as given.
    """
    owner = item.get("owned_by")
    if not isinstance(owner, str) or not owner:
        return default
    if owner == "me" and isinstance(item.get("permissions"), list):
        return "llama-cpp-python"
    return {"llamacpp": "llama.cpp", "library": "ollama", "vllm": "vllm"}.get(owner, owner[:32])


class EngineService:
    """Args: engine URLs (loopback), where the ``models`` section goes, timings."""

    def __init__(
        self,
        urls: Sequence[str],
        set_section: Callable[[str, dict[str, Any] | None], Awaitable[None]],
        *,
        interval: float = 1.0,
        timeout: float = 1.0,
    ) -> None:
        self._engines = [_Engine(check_engine_url(u)) for u in urls]
        self._set_section = set_section
        self._interval = interval
        self._timeout = timeout
        self._inflight: dict[str, int] = {}
        self._tps: dict[str, float] = {}
        self._changed = trio.Event()
        self._published: tuple[Any, float] | None = None

    def engine_for(self, model: str) -> str | None:
        """The base URL of a healthy engine serving `model`, if any."""
        for engine in self._engines:
            if engine.healthy and model in engine.models:
                return engine.url
        return None

    def add(self, url: str) -> None:
        """Poll (and advertise) an engine this node started (a deployed replica's)."""
        if all(e.url != url for e in self._engines):
            self._engines.append(_Engine(check_engine_url(url)))
        self._changed.set()

    def remove(self, url: str) -> None:
        """Forget an engine this node stopped: its models leave the record now."""
        self._engines = [e for e in self._engines if e.url != url]
        self._changed.set()

    def mark_failed(self, url: str, error: str) -> None:
        """The relay could not reach `url`: unhealthy now, until the next good poll."""
        for engine in self._engines:
            if engine.url == url and engine.healthy:
                engine.healthy, engine.error = False, error
                event(_log, 30, "engine.unhealthy", url=url, error=error)
                self._changed.set()

    def begin(self, model: str) -> None:
        self._inflight[model] = self._inflight.get(model, 0) + 1

    def inflight(self, model: str) -> int:
        """This node's requests in flight to its engines for `model`."""
        return self._inflight.get(model, 0)

    def end(self, model: str, tokens: int, seconds: float) -> None:
        self._inflight[model] = max(0, self._inflight.get(model, 0) - 1)
        if tokens > 1 and seconds > 0:
            rate = tokens / seconds
            old = self._tps.get(model)
            self._tps[model] = rate if old is None else 0.8 * old + 0.2 * rate

    def section(self) -> dict[str, Any] | None:
        """The ``models`` section (None when no healthy engine serves anything)."""
        out: dict[str, Any] = {}
        for engine in self._engines:
            if not engine.healthy:
                continue
            for model, ctx in engine.models.items():
                if model not in out and len(out) < MAX_MODELS:
                    out[model] = {
                        "kind": engine.kind, "ctx": _least(engine.n_ctx, ctx),
                        "tps": round(self._tps.get(model, 0.0), 1),
                        "inflight": self._inflight.get(model, 0),
                    }  # fmt: skip
                    if engine.slots:
                        out[model]["slots"] = engine.slots
        return out or None

    def engines(self) -> list[dict[str, Any]]:
        """For status: each engine, healthy or why not, and its models."""
        return [
            {"url": e.url, "healthy": e.healthy, "kind": e.kind, "models": sorted(e.models),
             "error": None if e.healthy else e.error}
            for e in self._engines
        ]  # fmt: skip

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with httpx.AsyncClient(
            timeout=self._timeout, trust_env=False, verify=tls_context()
        ) as http:
            await self._poll_all(http)
            await self._publish()
            task_status.started()
            while True:
                with trio.move_on_after(self._interval):
                    await self._changed.wait()
                self._changed = trio.Event()
                await self._poll_all(http)
                await self._publish()

    async def _publish(self) -> None:
        """Re-sign the record when the models change at once; for tokens/s and load
        only every `REFRESH` seconds (each re-signed record is gossiped to everyone)."""
        section = self.section()
        shape = (
            None
            if section is None
            else {m: (v["kind"], v["ctx"], v.get("slots")) for m, v in section.items()}
        )
        now = trio.current_time()
        last = self._published
        if last is not None and last[0] == shape and now - last[1] < REFRESH:
            return
        self._published = (shape, now)
        await self._set_section("models", section)

    def _busy(self, engine: _Engine) -> bool:
        """A healthy engine serving one of our requests now is not polled.

        llama-cpp-python's server runs ``/v1/models`` under the same lock as generation:
        a poll during a stream either interrupts that stream (its default
        ``interrupt_requests``: the stream ends early with a ``[DONE]``) or waits behind
        it and times out (marking a working engine unhealthy). The stream in flight is
        evidence enough; a refused connection still marks it failed (`mark_failed`).
        Counted per model, so a model served by two engines spares both while busy.
        """
        return engine.healthy and any(self._inflight.get(m, 0) > 0 for m in engine.models)

    async def _poll_all(self, http: httpx.AsyncClient) -> None:
        async with trio.open_nursery() as nursery:
            for engine in self._engines:
                if not self._busy(engine):
                    nursery.start_soon(self._poll, http, engine)

    async def _poll(self, http: httpx.AsyncClient, engine: _Engine) -> None:
        was = engine.healthy
        try:
            response = await http.get(engine.url + "/v1/models")
            response.raise_for_status()
            engine.kind, engine.models = parse_models(response.json())
            if not was:
                engine.slots, engine.n_ctx = await _props(http, engine.url)
            engine.healthy, engine.error = True, ""
        except (httpx.HTTPError, ValueError) as exc:
            engine.healthy, engine.error = False, f"{type(exc).__name__}: {exc}"[:200]
        if was != engine.healthy:
            event(_log, 20 if engine.healthy else 30,
                  "engine.healthy" if engine.healthy else "engine.unhealthy",
                  url=engine.url, error=engine.error)  # fmt: skip


async def _props(http: httpx.AsyncClient, url: str) -> tuple[int, int]:
    """(capacity, context per request) from ``GET /props`` (``total_slots``,
    ``default_generation_settings.n_ctx``); 0 for what it does not say (another
    engine, an old llama.cpp, a bad answer)."""
    try:
        response = await http.get(url + "/props")
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return 0, 0
    if not isinstance(body, dict):
        return 0, 0
    settings = body.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    return _count(body.get("total_slots"), MAX_SLOTS), _count(n_ctx, MAX_CONTEXT)


def _least(*known: int) -> int:
    """The least of the known (non-zero) lengths; 0 when none is known."""
    return min((n for n in known if n), default=0)


def _count(value: Any, most: int) -> int:
    """`value` if it is an int in 1..`most`, else 0 (unknown)."""
    good = isinstance(value, int) and not isinstance(value, bool) and 0 < value <= most
    return value if isinstance(value, int) and good else 0
