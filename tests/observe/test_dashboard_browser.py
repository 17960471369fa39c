"""The dashboard in a real headless Chromium: 3 nodes drawn, a killed one shown dead
without a reload. Skips (with the reason) where Chromium is not installed;
`make test` installs it (scripts/install-sysdeps.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from populi_p2p.observe.relay import UnixRelay
from tests.node.harness import Mesh, wait_until

from .cdp import Browser, find_chromium

CHROMIUM = find_chromium()

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
