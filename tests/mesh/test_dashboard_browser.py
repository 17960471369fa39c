"""The dashboard in a real headless Chromium: 3 nodes drawn, a killed one shown dead
without a reload; GPUs, tasks, models, a draining badge and a dead machine greyed, each
appearing and changing without a reload. Skips (with the reason) where Chromium is not
installed; `make test` installs it (scripts/install-sysdeps.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from populi_p2p.observe.relay import UnixRelay
from tests.node.harness import REPO, Mesh, wait_until
from tests.observe.cdp import Browser, find_chromium

#: Set (to anything) to refresh docs/img/dashboard.png from the full page test.
SCREENSHOT_ENV = "POPULI_DOCS_SCREENSHOT"

CHROMIUM = find_chromium()
#: The task writes nothing, but reads a gate under the test's tmp dir: as root, keep root.
AS_ROOT = ("--task-user", "root") if os.geteuid() == 0 else ()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="chromium is not installed (run: make sysdeps, or apt-get install chromium)",
    ),
]


def test_page_draws_the_mesh_and_shows_a_death_live(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    mesh = Mesh(tmp_path)
    proxy = browser = None
    try:
        a = mesh.start("a")
        b = mesh.start("b", "--bootstrap", a.address)
        c = mesh.start("c", "--bootstrap", a.address)
        ids = {d.node_id: "alive" for d in (a, b, c)}
        wait_until(lambda: mesh.converged([a, b, c], ids), 30, "three alive")
        proxy = UnixRelay(a.client.socket_path)
        browser = Browser(CHROMIUM)
        browser.call("Page.enable")
        browser.call("Page.navigate", url=proxy.url)

        def nodes() -> dict[str, str]:
            drawn = browser.evaluate(
                "Array.from(document.querySelectorAll('#map g.node'))"
                ".map(g => [g.dataset.nodeId, g.dataset.state])"
            )
            return dict(drawn or [])

        wait_until(lambda: len(nodes()) == 3 or None, 20, "3 nodes drawn")
        assert set(nodes()) == set(ids)
        assert browser.evaluate("document.querySelectorAll('#members tbody tr').length") == 3
        wait_until(
            lambda: browser.evaluate("document.getElementById('stream').textContent") == "live",
            10,
            "the event stream open",
        )
        # The header shows this node's blob store (bytes held, in, out).
        held = browser.evaluate("document.getElementById('blobs').textContent")
        assert held.startswith("blobs ") and " held · " in held and held.endswith(" out"), held
        # A marker in the page's JS world: it survives only if the page is never reloaded.
        browser.evaluate("window.__populiMarker = 42")

        c.kill()
        wait_until(lambda: nodes().get(c.node_id) == "dead", 30, "c drawn dead")
        assert browser.evaluate("window.__populiMarker") == 42, "the page was reloaded"
        assert nodes()[a.node_id] == nodes()[b.node_id] == "alive"
        row = f"#members tr[data-node-id='{c.node_id}'] td.state"
        assert browser.evaluate(f'document.querySelector("{row}").textContent') == "dead"
        feed = browser.evaluate(
            "Array.from(document.querySelectorAll('#feed li')).map(li => li.dataset.kind)"
        )
        assert "member.dead" in feed
        shot = browser.screenshot(tmp_path / "dashboard.png")
        assert shot.stat().st_size > 1000
        print(f"dashboard screenshot: {shot}")
    finally:
        if browser is not None:
            browser.close()
        if proxy is not None:
            proxy.close()
        mesh.stop_all()


def _rows(browser: Browser, table: str, key: str) -> dict[str, dict[str, str]]:
    """The rows of `table#ID` by their `data-KEY`: each a heading -> cell text dict,
    plus its class under "class"."""
    found = browser.evaluate(
        f"""(() => {{
          const t = document.querySelector("table#{table}");
          if (!t) return null;
          const head = Array.from(t.querySelectorAll("th")).map(th => th.textContent);
          return Array.from(t.querySelectorAll("tbody tr[data-{key}]")).map(tr => [
            tr.dataset["{key.replace("-", "_")}".replace(/_(.)/g, (_, c) => c.toUpperCase())],
            Object.fromEntries([...head.map((h, i) => [h, tr.cells[i].textContent]),
                                ["class", tr.className]])]);
        }})()"""
    )
    return dict(found or [])


def _engine(tmp: Path, model: str) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / f"{model}.port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "populi_p2p.testing.standin", "--port", "0",
         "--port-file", str(port_file), "--model", model],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    port = wait_until(lambda: port_file.exists() and port_file.read_text(), 20, "the engine")
    return proc, f"http://127.0.0.1:{port}"


def test_page_shows_gpus_tasks_and_models_as_they_change(
    tmp_path: Path, fake_nvml_dir: Path
) -> None:
    """What a GPU owner keeps open: GPU models with VRAM, utilisation and temperature
    (verified or declared), the tasks with phase and owner names, the models and who
    serves them, the recent inference routes, a draining badge, a dead machine greyed
    with "last seen": each appears and changes without a reload. With
    POPULI_DOCS_SCREENSHOT=1 the screenshot goes to docs/img/dashboard.png."""
    assert CHROMIUM is not None
    mesh = Mesh(tmp_path)
    proxy = browser = engine = None
    gate = tmp_path / "gate"
    try:
        a = mesh.start("a", "--api-listen", "127.0.0.1:0", "--peer-port", "0", *AS_ROOT, env={
            "LD_LIBRARY_PATH": str(fake_nvml_dir),
            "FAKE_NVML_FIXTURE": str(REPO / "tests/gpu/fixtures/nvml_two_healthy.txt"),
        })  # fmt: skip
        proxy = UnixRelay(a.client.socket_path)
        browser = Browser(CHROMIUM)
        browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=1500,
                     deviceScaleFactor=1, mobile=False)  # fmt: skip
        browser.call("Page.navigate", url=proxy.url)
        gpus = wait_until(
            lambda: len(g := _rows(browser, "gpus", "node-id")) == 1 and g, 20, "a's GPUs drawn"
        )
        assert set(gpus) == {a.node_id}
        cells = browser.evaluate(
            "Array.from(document.querySelectorAll('table#gpus tbody tr:first-child td'))"
            ".map(td => td.textContent)"
        )
        assert cells[:3] == ["a", "NVIDIA GeForce RTX 4090", "verified"], cells
        assert cells[4:6] == ["3%", "41 °C"], cells  # utilisation, temperature (Layer A)
        assert "/ 23." in cells[3], cells  # VRAM used / allocatable, GiB
        browser.evaluate("window.__populiMarker = 42")  # survives only without a reload

        # b joins: its declared GPU and the model its engine serves appear.
        engine, url = _engine(tmp_path, "tiny-chat")
        b = mesh.start("b", "--bootstrap", a.address, "--advertise-gpu", "A100:80GiB",
                       "--engine", url, "--peer-port", "0", *AS_ROOT,
                       env={"LD_LIBRARY_PATH": "", "FAKE_NVML_FIXTURE": ""})  # fmt: skip
        names = "Array.from(document.querySelectorAll('table#gpus td.gpu-name'))"
        wait_until(
            lambda: "A100" in browser.evaluate(f"{names}.map(td => td.textContent)"),
            30, "b's declared A100 drawn",
        )  # fmt: skip
        models = wait_until(lambda: _rows(browser, "models", "model"), 30, "the model drawn")
        assert models["tiny-chat"]["served by"] == "b", models
        # A request through a's API: the route appears, served by b.
        api = f"http://127.0.0.1:{a.client.get('/v1/inference/requests')['listening']}"
        chat = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(api + "/v1/chat/completions", json=chat, timeout=20, trust_env=False)
        assert answer.status_code == 200, answer.text
        routes = wait_until(lambda: _rows(browser, "routes", "model"), 20, "the route drawn")
        assert routes["tiny-chat"]["served by"] == "b", routes

        # A task: its row appears running with its owner's name, then ends succeeded.
        script = f"while [ ! -e {gate} ]; do sleep 0.05; done"
        tid = a.client.post("/v1/tasks", {"command": ["sh", "-c", script], "retries": 0})["id"]
        running = wait_until(
            lambda: (r := _rows(browser, "tasks", "task-id").get(tid)) and r["phase"] == "running"
            and r, 30, "the task drawn running",
        )  # fmt: skip
        assert running["owner"] in ("a", "b") and running["epoch"] == "1", running
        gate.touch()
        wait_until(
            lambda: _rows(browser, "tasks", "task-id").get(tid, {}).get("phase") == "succeeded",
            30, "the task drawn succeeded",
        )  # fmt: skip

        # b drains: a badge on its row.
        b.client.post("/v1/drain", {"handoff": False})
        badge = f"#members tr[data-node-id='{b.node_id}'] .badge.draining"
        wait_until(lambda: browser.evaluate(f'!!document.querySelector("{badge}")'), 20, "badge")
        # Into the docs only when asked: a test run leaves the checkout as it was.
        shots = REPO / "docs" / "img" if os.environ.get(SCREENSHOT_ENV) else tmp_path
        shot = browser.screenshot(shots / "dashboard.png")
        assert shot.stat().st_size > 10_000
        print(f"dashboard screenshot: {shot}")

        # b dies: greyed, with when it was last seen; its model is no longer listed.
        b.kill()
        row = f"#members tr[data-node-id='{b.node_id}']"
        wait_until(
            lambda: browser.evaluate(f'document.querySelector("{row}").className') == "gone",
            30, "b greyed",
        )  # fmt: skip
        seen = browser.evaluate(f'document.querySelector("{row} td.last-seen").textContent')
        assert seen.endswith("ago"), seen
        wait_until(lambda: "tiny-chat" not in _rows(browser, "models", "model"), 20, "model gone")
        assert browser.evaluate("window.__populiMarker") == 42, "the page was reloaded"
    finally:
        if browser is not None:
            browser.close()
        if proxy is not None:
            proxy.close()
        if engine is not None:
            engine.kill()
            engine.wait(timeout=10)
        mesh.stop_all()
