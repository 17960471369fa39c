"""Ten real daemons on loopback: converge, detect a kill -9, see a SIGTERM as a leave,
and take a restarted node back with the same id and a higher incarnation."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from populi_p2p.node import LEAVE_TIMEOUT
from swim import SwimConfig
from swim._math import suspicion_timeout_max, suspicion_timeout_min

from .harness import Mesh, wait_until

N = 10


def detection_bound(config: SwimConfig, n: int) -> float:
    """What the configuration implies for kill -9 -> everybody says dead.

    One probe period to notice (plus the probe timeout), Lifeguard's longest suspicion
    (no confirmations at all), then a few gossip rounds for the verdict to reach all.
    Loaded 2-core CI machines get 2 s of scheduling slack on top.
    """
    low = suspicion_timeout_min(config.suspicion_mult, n, config.probe_interval)
    high = suspicion_timeout_max(config.suspicion_max_mult, low)
    return 2 * config.probe_interval + high + 5 * config.gossip_interval + 2.0


@pytest.mark.slow
def test_ten_daemons(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, preset="local")
    try:
        seed = mesh.start("n0")
        others = [mesh.spawn(f"n{i}", "--bootstrap", seed.address) for i in range(1, N)]
        for d in others:
            mesh.ready(d)
        daemons = [seed, *others]
        everyone = {d.node_id: "alive" for d in daemons}

        # 1. One view: everybody sees everybody else alive, with verified records.
        started = time.monotonic()
        wait_until(lambda: mesh.converged(daemons, everyone), 60, "10 daemons to converge")
        converge_s = time.monotonic() - started
        for m in seed.members():
            assert m["verified"], m
            assert m["name"] == next(d.name for d in daemons if d.node_id == m["node_id"])
        assert seed.status()["cluster"]["members"]["alive"] == N

        # 2. kill -9: all others say dead within what the configuration implies.
        victim = daemons[3]
        survivors = [d for d in daemons if d is not victim]
        bound = detection_bound(SwimConfig.local(), N)
        killed_at = time.monotonic()
        victim.kill()
        wait_until(
            lambda: all(d.view().get(victim.node_id) == "dead" for d in survivors),
            bound, f"all survivors to declare {victim.name} dead",
        )  # fmt: skip
        detect_s = time.monotonic() - killed_at
        assert detect_s <= bound

        # 3. SIGTERM: the others see `left`, never `failed`; the process exits 0 quickly.
        leaver = daemons[5]
        stayers = [d for d in survivors if d is not leaver]
        old_incarnation = leaver.status()["node"]["incarnation"]
        sent_at = time.monotonic()
        leaver.terminate()
        assert leaver.wait_exit(timeout=LEAVE_TIMEOUT + 5) == 0
        exit_s = time.monotonic() - sent_at
        wait_until(
            lambda: all(d.view().get(leaver.node_id) == "left" for d in stayers),
            10, f"all to see {leaver.name} left",
        )  # fmt: skip
        for d in stayers:
            assert f"member.failed name={leaver.name} " not in d.log()
            assert f"member.left name={leaver.name} " in d.log()

        # 4. Restart without --bootstrap: same node id, higher incarnation, alive again.
        again = mesh.start(leaver.name, state=leaver.state_dir)
        assert again.node_id == leaver.node_id
        wait_until(
            lambda: all(d.view().get(leaver.node_id) == "alive" for d in stayers),
            30, f"{leaver.name} to rejoin from remembered members",
        )  # fmt: skip
        assert again.status()["node"]["incarnation"] > old_incarnation
        seen = {m["node_id"]: m for m in stayers[0].members()}
        assert seen[leaver.node_id]["incarnation"] > old_incarnation
        assert "--bootstrap" not in " ".join(again.proc.args)  # type: ignore[arg-type]
        print(
            f"\nconverge {converge_s:.2f} s, kill -9 detected in {detect_s:.2f} s"
            f" (bound {bound:.1f} s), SIGTERM exit in {exit_s:.2f} s"
        )
    finally:
        mesh.stop_all()


def test_name_clash_is_reported(tmp_path: Path) -> None:
    """Two machines called the same: both stay members (ids differ); status and log say so."""
    mesh = Mesh(tmp_path, preset="local")
    try:
        a = mesh.start("a")
        twin1 = mesh.start("twin", "--bootstrap", a.address, state=mesh.prepare("twin-1"))
        twin2 = mesh.start("twin", "--bootstrap", a.address, state=mesh.prepare("twin-2"))
        assert twin1.node_id != twin2.node_id
        expect = {d.node_id: "alive" for d in (a, twin1, twin2)}
        wait_until(lambda: mesh.converged([a, twin1, twin2], expect), 30, "converge")

        def clash() -> list[dict[str, object]]:
            return a.status()["name_clashes"]  # type: ignore[no-any-return]

        clashes = wait_until(clash, 10, "the clash to show in status")
        assert clashes == [{"name": "twin", "node_ids": sorted([twin1.node_id, twin2.node_id])}]
        assert any("twin" in w for w in a.status()["warnings"])
        wait_until(lambda: "name.clash name=twin" in a.log(), 10, "the clash in the log")
        assert a.log().count("name.clash name=twin") == 1
    finally:
        mesh.stop_all()
