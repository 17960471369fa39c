"""An insider's `Suspect(victim, 2**62)`: the largest incarnation the wire accepts.

Nothing outbids the limit, so the victim cannot refute: it starts a new session at
incarnation 0 (docs/protocol.md, "Bounded integers"), its peers time the forged
suspicion out, reap the old session, and take the new one back. The victim is out for a
while by design; what this pins is that no daemon crashes, and that it ends alive
everywhere. It has its own mesh (the `local` preset, so the outage is short), so the
other attack modules never see that outage.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from swim import wire
from tests.node.harness import wait_until

from .attacker import TALLY, Attacker
from .conftest import AttackMesh, start_mesh
from .helpers import swim_counter


@pytest.fixture(scope="module")
def limit_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AttackMesh]:
    hosts = ("127.0.0.21", "127.0.0.22", "127.0.0.23")
    mesh = start_mesh(tmp_path_factory.mktemp("limit-mesh"), "local", hosts)
    try:
        yield mesh
    finally:
        mesh.mesh.stop_all()


def test_a_suspicion_at_the_limit_costs_a_new_session_never_a_crash(
    limit_mesh: AttackMesh,
) -> None:
    daemons = limit_mesh.daemons
    victim = daemons[-1]
    attacker = Attacker("127.0.0.71", limit_mesh.mesh.authority, seed=71)
    try:
        sessions = swim_counter(victim, "incarnation_sessions")
        started = time.monotonic()
        for d in daemons:
            rumor = wire.Suspect(victim.node_id, wire.INTEGER_MAX, attacker.node_id)
            attacker.send(limit_mesh.address(d), attacker.seal(rumor, recipient=d.node_id))
        wait_until(
            lambda: swim_counter(victim, "incarnation_sessions") > sessions,
            15, "the victim to start a new session",
        )  # fmt: skip

        def back() -> bool:
            assert all(d.running for d in daemons), [d.log()[-2000:] for d in daemons]
            for d in daemons:
                rows = {m["node_id"]: m for m in d.members()}
                if set(rows) != {x.node_id for x in daemons}:
                    return False
                for row in rows.values():
                    if row["state"] != "alive" or row["incarnation"] >= wire.INTEGER_MAX:
                        return False
            return True

        wait_until(back, 120, "the victim to be back, alive everywhere, as a new session")
        outage = time.monotonic() - started
        assert all(d.running for d in daemons)
        assert not any("Traceback" in d.log() for d in daemons)
        TALLY.add(
            "incarnation at the limit (2**62)", attacker.sent, 0,
            note=f"documented outage of the victim: back alive everywhere after {outage:.0f} s",
        )  # fmt: skip
    finally:
        attacker.close()
