"""Ten real daemons on loopback: converge, detect a kill -9, see a SIGTERM as a leave,
and take a restarted node back with the same id and a higher incarnation."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from populi_p2p.node import LEAVE_TIMEOUT
from swim import SwimConfig
from swim._math import suspicion_timeout_max, suspicion_timeout_min
from tests.node.harness import Daemon, Mesh, wait_until

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
        # It exited because its "left" was sent as often as intended, not on the timeout.
        (left_line,) = [line for line in leaver.log().splitlines() if " node.left " in line]
        assert "announced=true" in left_line.split()
        wait_until(
            lambda: all(d.view().get(leaver.node_id) == "left" for d in stayers),
            10, f"all to see {leaver.name} left",
        )  # fmt: skip
        for d in stayers:
            assert f"member.dead name={leaver.name} " not in d.log()
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
        assert f"name.clash name=twin me={a.node_id}" in a.log()
        # Each twin says it too, naming itself and the other (both log to twin.log).
        for me, other in ((twin1, twin2), (twin2, twin1)):
            wanted = f"me={me.node_id} ids="
            wait_until(lambda: wanted in me.log(), 10, "the clash in the twin's log")  # noqa: B023
            line = next(x for x in me.log().splitlines() if wanted in x)
            assert f"others={other.node_id}" in line
    finally:
        mesh.stop_all()


class _CertificateQuiet:
    """True once `daemon` sent `stretch` datagrams in a row without its certificate.

    Polled: remembers the counters across calls, and starts over whenever a datagram
    with the certificate went out (an introduction, a peer in doubt).
    """

    def __init__(self, daemon: Daemon, stretch: int) -> None:
        self.daemon = daemon
        self.stretch = stretch
        self.start: tuple[int, int] | None = None
        self.reached = False

    def __call__(self) -> bool:
        if self.reached:
            return True
        traffic = self.daemon.status()["traffic"]
        now = (traffic["datagrams_with_certificate"], traffic["datagrams_without_certificate"])
        if self.start is None or now[0] != self.start[0]:
            self.start = now
            return False
        self.reached = now[1] - self.start[1] >= self.stretch
        return self.reached


def wait_certificate_quiet(daemons: list[Daemon], what: str, stretch: int = 10) -> None:
    quiet = [_CertificateQuiet(d, stretch) for d in daemons]
    wait_until(lambda: all([q() for q in quiet]), 60, what)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_certificate_rides_only_while_a_peer_may_not_know_us(tmp_path: Path) -> None:
    """Known peers get envelopes without our certificate; a peer that restarts (same
    address, so the others still send to it as if it knew them) is introduced to again
    and the mesh takes it back."""
    mesh = Mesh(tmp_path, preset="local")
    port = str(_free_port())
    network = ("--bind", "127.0.0.1", "--port", port, "--overlay", "none")
    try:
        a = mesh.start("a")
        b = mesh.start("b", "--bootstrap", a.address, network=network)
        c = mesh.start("c", "--bootstrap", a.address)
        everyone = {d.node_id: "alive" for d in (a, b, c)}
        wait_until(lambda: mesh.converged([a, b, c], everyone), 30, "converge")
        # Steady state: datagrams to known peers go without the certificate.
        wait_certificate_quiet([a, b, c], "all to stop sending it")

        # b restarts on the same address: it forgot every certificate it had cached,
        # and (its member store deleted) it rejoins through a alone, so it learns of c
        # from a, and c still holds b's certificate: c sees nothing new in b's packets
        # except that b's counter leapt ahead (a new session).
        old_incarnation = b.status()["node"]["incarnation"]
        b.kill()
        for path in b.state_dir.glob("members.sqlite3*"):
            path.unlink()
        again = mesh.start("b", "--bootstrap", a.address, state=b.state_dir, network=network)
        wait_until(
            lambda: all(
                {m["node_id"]: m for m in d.members()}[b.node_id]["incarnation"] > old_incarnation
                for d in (a, c)
            ),
            30, "a and c to hear of b's new run",
        )  # fmt: skip
        wait_until(lambda: mesh.converged([a, again, c], everyone), 30, "converge again")
        # Everybody talks to everybody again, b included, and without certificates once
        # the introductions are over; b refuses nothing any more.
        wait_certificate_quiet([a, again, c], "all to settle after the restart")
        refused = again.status()["drops"]["auth"]["unknown_sender"]
        wait_certificate_quiet([a, c], "a and c to send more datagrams")
        assert again.status()["drops"]["auth"]["unknown_sender"] == refused
        assert mesh.converged([a, again, c], everyone)
    finally:
        mesh.stop_all()
