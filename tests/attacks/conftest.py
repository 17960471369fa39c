"""A real loopback mesh shared by each attack module, and the "nothing changed" check.

Each module gets its own mesh (module scope): real `populi-node up` processes, one per
127.0.0.x address, so an attacker can bind to a member's address with another port. The
check (`Watch`) is the suite's definition of "membership did not change":

- every daemon is still running;
- every daemon sees exactly the members it saw before (none added, none removed), all
  `alive`;
- no member's incarnation rose by more than its own refutes explain (`swim.refutes`);
- nobody declared anybody dead (`swim.members_failed` unchanged everywhere).

Each violation counts as one state change; the tests assert there are none, after
polling (with a deadline) for refutes in flight to land.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.node.harness import Daemon, Mesh, WaitTimeout, wait_until

from .attacker import TALLY, Address, split_address

#: Where the members listen: distinct loopback addresses (Linux routes all of 127/8).
HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14")


def pytest_sessionfinish(session: pytest.Session) -> None:
    report = os.environ.get("POPULI_ATTACK_REPORT")
    if report and TALLY.records:
        TALLY.write(Path(report))


@attrs.define
class AttackMesh:
    mesh: Mesh
    daemons: list[Daemon]

    def address(self, daemon: Daemon) -> Address:
        return split_address(daemon.address)

    def watch(self) -> Watch:
        return Watch(self.daemons)


def start_mesh(root: Path, preset: str, hosts: tuple[str, ...] = HOSTS) -> AttackMesh:
    mesh = Mesh(root, preset=preset)
    daemons: list[Daemon] = []
    try:
        for i, host in enumerate(hosts):
            network = ("--bind", host, "--port", "0", "--overlay", "none")
            flags = ("--bootstrap", daemons[0].address) if daemons else ()
            daemon = mesh.spawn(f"m{i}", *flags, network=network)
            daemons.append(mesh.ready(daemon) if i == 0 else daemon)
        for daemon in daemons[1:]:
            mesh.ready(daemon)
        expect = {d.node_id: "alive" for d in daemons}
        wait_until(lambda: mesh.converged(daemons, expect), 30, "the attack mesh to converge")
    except BaseException:
        mesh.stop_all()
        raise
    return AttackMesh(mesh, daemons)


@pytest.fixture(scope="module")
def attack_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AttackMesh]:
    """Four daemons (LAN preset: the timing a real deployment runs) on 127.0.0.11-14."""
    mesh = start_mesh(tmp_path_factory.mktemp("attack-mesh"), "lan")
    try:
        yield mesh
    finally:
        mesh.mesh.stop_all()


@attrs.frozen
class Snapshot:
    """Everything `Watch` compares: per daemon, its member rows and its counters."""

    rows: dict[str, dict[str, dict[str, Any]]]  # observer id -> member id -> row
    refutes: dict[str, int]  # member id -> its own refutes
    failed: dict[str, int]  # observer id -> members it declared dead

    @classmethod
    def take(cls, daemons: list[Daemon]) -> Snapshot:
        rows: dict[str, dict[str, dict[str, Any]]] = {}
        refutes: dict[str, int] = {}
        failed: dict[str, int] = {}
        for d in daemons:
            rows[d.node_id] = {m["node_id"]: m for m in d.members()}
            swim = d.status()["swim"]
            refutes[d.node_id] = int(swim["refutes"])
            failed[d.node_id] = int(swim["members_failed"])
        return cls(rows, refutes, failed)


class Watch:
    """Membership before an attack, and the changes after it (see module doc)."""

    def __init__(self, daemons: list[Daemon]) -> None:
        self.daemons = daemons
        self.before = Snapshot.take(daemons)

    def changes(self, *, rumored_dead: bool = False) -> list[str]:
        """Every way membership differs from before; empty when nothing changed.

        `rumored_dead`: a forged "dead" was delivered on purpose, so members that
        believed it until the refute are not counted (their final view still is).
        """
        problems = [f"{d.name} is not running" for d in self.daemons if not d.running]
        if problems:
            return problems
        after = Snapshot.take(self.daemons)
        for observer, rows in after.rows.items():
            known = self.before.rows[observer]
            for added in sorted(rows.keys() - known.keys()):
                problems.append(f"{observer} now holds {added} ({rows[added]['state']})")
            for removed in sorted(known.keys() - rows.keys()):
                problems.append(f"{observer} no longer holds {removed}")
            for member, row in sorted(rows.items()):
                if row["state"] != "alive":
                    problems.append(f"{observer} sees {member} {row['state']}")
                if member not in known:
                    continue
                rise = row["incarnation"] - known[member]["incarnation"]
                refuted = after.refutes.get(member, 0) - self.before.refutes.get(member, 0)
                if rise > max(refuted, 0):
                    problems.append(
                        f"{observer} sees {member} at incarnation {row['incarnation']}"
                        f" (+{rise}), but it refuted only {refuted} times"
                    )
        for observer, count in after.failed.items():
            if count != self.before.failed[observer] and not rumored_dead:
                problems.append(f"{observer} declared {count - self.before.failed[observer]} dead")
        return problems

    def settled(self, timeout: float = 15.0, *, rumored_dead: bool = False) -> list[str]:
        """`changes()` once it is empty, or whatever is left after `timeout` seconds
        (refutes already in flight get that long to land everywhere)."""
        try:
            wait_until(
                lambda: not self.changes(rumored_dead=rumored_dead),
                timeout, "membership to be as before",
            )  # fmt: skip
        except WaitTimeout:
            pass
        return self.changes(rumored_dead=rumored_dead)
