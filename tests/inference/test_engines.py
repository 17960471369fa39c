"""The engine service against the stand-in engine on loopback: its models enter the
record's section; when the engine stops answering they leave within a poll."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from populi_p2p.inference._asgi import serve_tcp
from populi_p2p.inference.engines import EngineService, continues_partial, parse_models
from populi_p2p.testing.standin import StandinConfig, StandinEngine


async def test_models_enter_and_leave_the_record() -> None:
    sections: list[dict[str, Any] | None] = []
    send, receive = trio.open_memory_channel[dict[str, Any] | None](100)

    async def set_section(name: str, value: dict[str, Any] | None) -> None:
        assert name == "models"
        sections.append(value)
        await send.send(value)

    engine = StandinEngine(StandinConfig(model="tiny", context_length=2048))
    async with trio.open_nursery() as nursery:
        engine_scope = trio.CancelScope()

        async def serve(task_status: trio.TaskStatus[int]) -> None:
            with engine_scope:
                await serve_tcp(engine.app, "127.0.0.1", 0, logger_name="t",
                                task_status=task_status)  # fmt: skip

        port = await nursery.start(serve)
        service = EngineService([f"http://127.0.0.1:{port}/v1"], set_section,
                                interval=0.2, timeout=0.5)  # fmt: skip
        await nursery.start(service.run)
        first = await receive.receive()
        assert first == {"tiny": {"kind": "standin", "ctx": 2048, "tps": 0.0, "inflight": 0}}
        assert service.engine_for("tiny") == f"http://127.0.0.1:{port}"
        engine_scope.cancel()
        with trio.fail_after(5):
            assert await receive.receive() is None
        assert service.engine_for("tiny") is None
        assert service.engines()[0]["healthy"] is False
        nursery.cancel_scope.cancel()


def test_parse_models_shapes() -> None:
    kind, models = parse_models({"data": [{"id": "m", "owned_by": "llamacpp",
                                           "meta": {"n_ctx_train": 512}}]})  # fmt: skip
    assert (kind, models) == ("llama.cpp", {"m": 512})
    assert parse_models({"data": [{"id": "x"}, "junk", {"id": 5}]}) == ("openai", {"x": 0})
    with pytest.raises(ValueError):
        parse_models({"nope": 1})


def test_parse_models_reads_llama_cpp_python_server() -> None:
    """llama-cpp-python's server (0.3.x) answers ``owned_by: "me"``, a ``permissions``
    list and no context length: the kind is llama-cpp-python (not llama.cpp: it starts a
    new answer where llama.cpp's server continues a partial one), the context unknown."""
    body = {"object": "list", "data": [
        {"id": "tiny-llama", "object": "model", "owned_by": "me", "permissions": []}]}  # fmt: skip
    assert parse_models(body) == ("llama-cpp-python", {"tiny-llama": 0})
    assert not continues_partial("llama-cpp-python")
    # Without the permissions list, "me" is not taken for llama-cpp-python.
    assert parse_models({"data": [{"id": "a", "owned_by": "me"}]}) == ("me", {"a": 0})


def test_parse_models_leaves_out_a_model_llama_server_is_still_loading() -> None:
    """llama.cpp's llama-server lists its model during loading with ``meta: null`` (and
    answers 503 to completions): not served yet. Once loaded, meta carries n_ctx_train."""
    loading = {"object": "list", "data": [
        {"id": "m", "object": "model", "owned_by": "llamacpp", "meta": None}]}  # fmt: skip
    assert parse_models(loading) == ("llama.cpp", {})
    loaded = {"object": "list", "data": [
        {"id": "m", "object": "model", "owned_by": "llamacpp",
         "meta": {"n_vocab": 32000, "n_ctx_train": 4096, "n_embd": 4096}}]}  # fmt: skip
    assert parse_models(loaded) == ("llama.cpp", {"m": 4096})


def test_which_engine_kinds_continue_a_partial_answer() -> None:
    """llama.cpp's server, vLLM and the stand-in continue a final assistant message;
    anything else (Ollama, llama-cpp-python, an unknown engine) is not known to."""
    assert [k for k in ("llama.cpp", "vllm", "standin") if continues_partial(k)] == [
        "llama.cpp", "vllm", "standin"
    ]  # fmt: skip
    for kind in ("llama-cpp-python", "ollama", "openai", "me", ""):
        assert not continues_partial(kind), kind


def test_parse_models_drops_absurd_context_lengths() -> None:
    for ctx in (True, -1, 0, 1 << 40, "4096", 4096.0):
        body = {"data": [{"id": "m", "owned_by": "vllm", "max_model_len": ctx}]}
        assert parse_models(body) == ("vllm", {"m": 0}), ctx
    body = {"data": [{"id": "m", "owned_by": "vllm", "max_model_len": 32768}]}
    assert parse_models(body) == ("vllm", {"m": 32768})


async def test_a_busy_engine_is_not_polled() -> None:
    """While a request is in flight to an engine, the poll leaves it alone (a
    llama-cpp-python server interrupts its stream for any other request, /v1/models
    included); polling resumes when the request ends."""
    polls: list[str] = []
    engine = StandinEngine(StandinConfig(model="m"))

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/models":
            polls.append(scope["path"])
        await engine.app(scope, receive, send)

    async def set_section(name: str, value: dict[str, Any] | None) -> None:
        pass

    async with trio.open_nursery() as nursery:

        async def serve(task_status: trio.TaskStatus[int]) -> None:
            await serve_tcp(counting, "127.0.0.1", 0, logger_name="t", task_status=task_status)

        port = await nursery.start(serve)
        service = EngineService([f"http://127.0.0.1:{port}"], set_section)
        async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
            await service._poll_all(http)
            assert len(polls) == 1 and service.engine_for("m") is not None
            service.begin("m")
            await service._poll_all(http)
            await service._poll_all(http)
            assert len(polls) == 1  # busy: not polled, still healthy
            assert service.engine_for("m") is not None
            service.end("m", 0, 0.0)
            await service._poll_all(http)
            assert len(polls) == 2
        nursery.cancel_scope.cancel()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_entry = st.fixed_dictionaries(
    {"id": st.text(max_size=200)},
    optional={
        "owned_by": st.sampled_from(["me", "llamacpp", "library", "vllm", ""]) | _json,
        "permissions": _json,
        "meta": st.fixed_dictionaries({}, optional={"n_ctx_train": _json, "n_ctx": _json}) | _json,
        "max_model_len": _json,
    },
)


@given(st.one_of(_json, st.fixed_dictionaries({"data": st.lists(_entry | _json, max_size=20)})))
def test_parse_models_takes_any_json(body: Any) -> None:
    """Whatever an engine answers: a bounded result or ValueError, never anything else."""
    try:
        kind, models = parse_models(body)
    except ValueError:
        return
    assert isinstance(kind, str) and len(kind) <= 32
    assert len(models) <= 16
    assert all(len(m) <= 128 and 0 <= c <= 1 << 24 for m, c in models.items())


def _n_ctx(n: Any) -> dict[str, Any]:
    return {"total_slots": 1, "default_generation_settings": {"n_ctx": n}}


@pytest.mark.parametrize(
    ("props", "slots", "ctx"),
    [({"total_slots": 6}, 6, 4096), ({"total_slots": 0}, None, 4096),
     ({"total_slots": True}, None, 4096), ({"total_slots": 5000}, None, 4096),
     ("not a map", None, 4096), (None, None, 4096),
     (_n_ctx(128), 1, 128), (_n_ctx(8192), 1, 4096), (_n_ctx(True), 1, 4096),
     (_n_ctx(1 << 30), 1, 4096),
     ({"default_generation_settings": "x"}, None, 4096)],
)  # fmt: skip
async def test_capacity_comes_from_props_when_the_engine_says(
    props: Any, slots: Any, ctx: int
) -> None:
    """llama.cpp's ``GET /props`` ``total_slots`` becomes the record's ``slots``; an
    engine without it (None: a 404), or with a value not to believe, leaves it out.
    The record's ``ctx`` is the lesser of its ``n_ctx`` (the context a request gets,
    its ``-c``) and the model's own from ``/v1/models`` (the stand-in's 4096)."""
    inner = StandinEngine(StandinConfig(model="tiny"))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/props":
            from populi_p2p.inference._asgi import send_json

            await send_json(send, 200 if props is not None else 404, props or {})
            return
        await inner.app(scope, receive, send)

    got: list[dict[str, Any] | None] = []

    async def set_section(name: str, value: dict[str, Any] | None) -> None:
        got.append(value)

    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_tcp(app, "127.0.0.1", 0, logger_name="t",
                                          task_status=task_status)
        )  # fmt: skip
        service = EngineService([f"http://127.0.0.1:{port}"], set_section, interval=0.2)
        await nursery.start(service.run)
        assert got[0] is not None and got[0]["tiny"].get("slots") == slots
        assert got[0]["tiny"]["ctx"] == ctx
        nursery.cancel_scope.cancel()
