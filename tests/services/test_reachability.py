"""Failures to reach a peer are warnings (issue 20, item 1).

`up --bootstrap` to an address where nothing listens used to log nothing at info or
above while `status` said "1 alive". Now each address that fails is one
`peer.unreachable` warning per failure streak, with the reason, and `status` names it;
a node alone for 30 s while it has bootstrap peers says so.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest

from overlay.base import Address, TransportError
from overlay.inbox import Incoming
from populi_p2p.services.discovery import ALONE_WARNING_AFTER, Discovery
from populi_p2p.services.membership import MembershipService
from populi_p2p.services.reachability import PeerReachability
from swim import Member
from tests.node.harness import Mesh, wait_until

ME: Address = ("127.0.0.1", 7000)
SEED: Address = ("127.0.0.1", 7001)


def closed_port() -> int:
    """A loopback TCP and UDP port where nothing listens (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Refusing:
    """A transport whose frames to `SEED` fail as a refused connect would."""

    def __init__(self) -> None:
        self.incoming: list[Incoming] = []

    async def receive(self) -> Incoming:
        return self.incoming.pop(0)

    def receive_nowait(self) -> Incoming:
        return self.incoming.pop(0)

    async def send_datagram(
        self, address: Address, payload: bytes, *, expects_answer: bool = True
    ) -> None:
        pass

    async def send_frame(self, address: Address, payload: bytes) -> None:
        raise TransportError("tcp connect to 127.0.0.1:7001 failed: connection refused", address)


def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_failed_send_is_one_warning_per_streak_and_named_in_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="populi")
    reach = PeerReachability()
    reach.describe = lambda a: "bootstrap peer" if a == SEED else None
    inner = Refusing()
    watched = reach.watch(inner)
    for _ in range(3):
        with pytest.raises(TransportError):
            await watched.send_frame(SEED, b"x")
    assert warnings_logged(caplog) == ["peer.unreachable"]  # once, not three times
    (line,) = reach.warnings()
    assert line.startswith("cannot reach 127.0.0.1:7001 (bootstrap peer): tcp connect")
    assert "connection refused; failed 3 times" in line
    # An answer from it ends the streak.
    inner.incoming.append(Incoming(SEED, b"", reliable=False))
    await watched.receive()
    assert reach.warnings() == [] and reach.reason(SEED) is None
    assert [r.getMessage() for r in caplog.records][-1] == "peer.reachable"


async def test_a_silent_udp_join_is_diagnosed_over_tcp() -> None:
    reach = PeerReachability()
    port = closed_port()
    await reach.diagnose(("127.0.0.1", port), waited=5.0)
    assert reach.reason(("127.0.0.1", port)) == "no answer in 5 s; TCP connect: connection refused"
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        there = ("127.0.0.1", int(listening.getsockname()[1]))
        await reach.diagnose(there, waited=5.0)
    assert "though its TCP port accepts connections" in (reach.reason(there) or "")


class Alone:
    """A membership of one that never joins anybody."""

    node_id = "me"
    has_left = False

    async def join(self, seeds: Sequence[Address]) -> None:
        pass

    def num_alive(self) -> int:
        return 1

    def member(self, node_id: str) -> Member | None:
        return None

    def members(self) -> list[Member]:
        return []


def test_alone_for_30_s_with_bootstrap_peers_is_a_warning() -> None:
    clock = [100.0]
    discovery = Discovery(
        cast(MembershipService, Alone()), ME, bootstrap=[SEED], remembered=list,
        probe_interval=1.0, monotonic=lambda: clock[0],
    )  # fmt: skip
    clock[0] += ALONE_WARNING_AFTER - 1
    assert discovery.warnings() == []
    clock[0] += 1
    (line,) = discovery.warnings()
    assert line.startswith("alone for 30 s: no bootstrap peer (127.0.0.1:7001)")
    alone = Discovery(
        cast(MembershipService, Alone()), ME, bootstrap=[], remembered=list,
        probe_interval=1.0, monotonic=lambda: clock[0],
    )  # fmt: skip
    clock[0] += 3600
    assert alone.warnings() == []  # the first node of a mesh is alone on purpose


def test_a_daemon_says_which_bootstrap_peer_it_cannot_reach_and_why(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    port = closed_port()
    try:
        node = mesh.start("lonely", "--bootstrap", f"127.0.0.1:{port}")
        seed = f"127.0.0.1:{port}"

        def warned() -> list[str]:
            return [w for w in node.status()["warnings"] if w.startswith(f"cannot reach {seed}")]

        (line,) = wait_until(warned, 30, "a status warning naming the bootstrap peer")
        assert "connection refused" in line
        log = node.log()
        assert f"WARNING peer.unreachable addr={seed}" in log
        assert "join.failed" in log
    finally:
        mesh.stop_all()
