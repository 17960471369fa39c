"""The observability app served on its own by hypercorn on loopback TCP (as the HTTP
listener will), with an `authorize` hook, and the page's task section in Chromium."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from populi_p2p.observe import EventService, MetricsService, ObserveView, make_observe_app
from populi_p2p.observe.web import Scope
from tests.node.harness import wait_until

from .cdp import Browser, find_chromium

ME = {
    "name": "me", "node_id": "id-me", "address": "127.0.0.1:1", "state": "alive",
    "incarnation": 1, "rtt_ms": None, "capabilities": "-", "verified": True, "self": True,
    "state_since": 0.0, "gpu": None,
}  # fmt: skip


def authorize(scope: Scope) -> bool:
    """The test's stand-in for an API key check."""
    return dict(scope["headers"]).get(b"authorization") == b"Bearer k"


@pytest.fixture
def served() -> Iterator[tuple[str, ObserveView, trio.lowlevel.TrioToken]]:
    status = {"node": {"name": "me"}, "overlay": {"kind": "none"}, "cluster": {}}
    view = ObserveView(MetricsService(), EventService(), lambda: status, lambda: [ME])
    view.provide("tasks", lambda: [{"task": "t-1", "owner": "me", "epoch": 4}])
    app = make_observe_app(view)
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    started: list[Any] = []
    ready = threading.Event()

    async def main() -> None:
        stop = trio.Event()
        started.append((trio.lowlevel.current_trio_token(), stop))
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                functools.partial(serve, app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
            )
            started.append(binds[0])
            ready.set()

    thread = threading.Thread(target=trio.run, args=(main,))
    thread.start()
    try:
        assert ready.wait(timeout=30), "hypercorn did not start"
        yield started[1], view, started[0][0]
    finally:
        token, stop = started[0]
        trio.from_thread.run_sync(stop.set, trio_token=token)
        thread.join(timeout=30)


def test_standalone_app_serves_with_lifespan(served: tuple[str, ObserveView, Any]) -> None:
    url, _, _ = served
    assert httpx.get(url + "/metrics", timeout=5).status_code == 200
    assert httpx.get(url + "/api/mesh", timeout=5).json()["tasks"][0]["epoch"] == 4


def test_authorize_hook_on_a_listener() -> None:
    app = make_observe_app(
        ObserveView(MetricsService(), EventService(), dict, list), authorize=authorize
    )
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]

    async def check() -> None:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            assert (await c.get("/")).status_code == 401
            assert (await c.get("/metrics", headers={"authorization": "Bearer k"})).is_success

    trio.run(check)


@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed (make sysdeps)")
def test_page_fills_the_tasks_section_and_keeps_the_routes_placeholder(
    served: tuple[str, ObserveView, trio.lowlevel.TrioToken],
) -> None:
    url, view, token = served
    chromium = find_chromium()
    assert chromium is not None
    browser = Browser(chromium)
    try:
        browser.call("Page.navigate", url=url + "/")
        wait_until(
            lambda: (
                browser.evaluate("document.querySelectorAll('table#tasks tbody tr').length") == 1
            ),
            20,
            "the tasks table",
        )
        head, cells = (
            browser.evaluate(
                f"Array.from(document.querySelectorAll('table#tasks {cell}'))"
                ".map(c => c.textContent)"
            )
            for cell in ("th", "td")
        )
        shown = dict(zip(head, cells, strict=True))
        assert (shown["task"], shown["owner"], shown["epoch"], shown["phase"]) == (
            "t-1",
            "me",
            "4",
            "-",
        )
        assert browser.evaluate("document.getElementById('routes').className") == "placeholder"
        # A live event reaches the feed without a reload.
        browser.evaluate("window.__marker = 1")
        wait_until(
            lambda: browser.evaluate("document.getElementById('stream').textContent") == "live",
            10,
            "the stream open",
        )
        # Published in the server's Trio thread, as a service of the node would.
        trio.from_thread.run_sync(
            functools.partial(view.events.publish, "task.placed", "t-1 placed"), trio_token=token
        )
        wait_until(
            lambda: (
                "task.placed"
                in browser.evaluate(
                    "Array.from(document.querySelectorAll('#feed li')).map(l => l.dataset.kind)"
                )
            ),
            10,
            "the event in the feed",
        )
        assert browser.evaluate("window.__marker") == 1
    finally:
        browser.close()
