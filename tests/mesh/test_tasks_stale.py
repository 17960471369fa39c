"""A result posted late by a killed owner's epoch is rejected by the daemons.

Three daemons on loopback (two could not re-place anything: a task's replicas need a
majority). A task runs on X; X is killed with SIGKILL; Y runs it again at the next
epoch and succeeds. Then X's own table file is given the late result of
X's epoch (crafted with X's key through the table API, as X would have posted it had
it woken up), and X restarts: its stale entry reaches Y through the daemons' real
merge path (the push-pull section), where it is fenced out and counted, and the
accepted result stays Y's epoch's.
"""

from __future__ import annotations

from typing import Any

import pytest

from populi_p2p.leases import LeaseConfig, LeaseTable, TaskResult
from populi_p2p.leases.driver.service import LEASE_CONTEXT
from populi_p2p.leases.store import LeaseStore
from populi_p2p.trust.identity import NodeIdentity
from tests.node.harness import Daemon, Mesh, wait_until


def _task(d: Daemon, tid: str) -> dict[str, Any]:
    return d.client.get(f"/v1/tasks/{tid}")  # type: ignore[no-any-return]


def _stale(d: Daemon) -> int:
    return int(d.status()["tasks"]["stale_results_rejected"])


@pytest.mark.slow
def test_a_late_result_from_a_killed_owner_is_rejected(tmp_path: Any) -> None:
    mesh = Mesh(tmp_path, preset="local")
    try:
        a = mesh.start("a")
        b = mesh.start("b", "--bootstrap", a.address)
        c = mesh.start("c", "--bootstrap", a.address)
        alive = {d.node_id: "alive" for d in (a, b, c)}
        wait_until(lambda: mesh.converged([a, b, c], alive), 30, "three daemons")
        tid = a.client.post("/v1/tasks", {"command": ["sleep", "2"], "retries": 0})["id"]
        first = wait_until(
            lambda: (t := _task(a, tid))["phase"] == "running" and t, 15, "the task to run"
        )
        x = next(d for d in (a, b, c) if d.node_id == first["owner"])
        z = next(d for d in (a, b, c) if d is not x)
        # `logs` on a node that did not run the task fetches it from the one that did.
        seen = wait_until(
            lambda: (t := _task(z, tid))["phase"] == "running" and t, 15, "Z to see it run"
        )
        assert seen["owner"] == x.node_id, seen
        chunk = z.client.get(f"/v1/tasks/{tid}/logs")
        assert chunk["id"] == tid and chunk["data"] == "" and chunk["offset"] == 0, chunk
        x.kill()  # two of three replicas are left: a majority re-places it
        done = wait_until(
            lambda: (t := _task(z, tid))["finished"] and t, 30, "the task to run on a survivor"
        )
        y = next(d for d in (a, b, c) if d.node_id == done["owner"])
        assert done["phase"] == "succeeded" and y is not x, done
        assert done["epoch"] > first["epoch"]
        before = _stale(y)

        # X's epoch posts its result late: signed by X, into X's own table file.
        identity = NodeIdentity.load_or_create(x.state_dir)
        store = LeaseStore(x.state_dir / "leases.sqlite3")
        table = LeaseTable(
            LeaseConfig.local(), identity.node_id,
            lambda data: identity.sign(LEASE_CONTEXT, data), lambda n, d, s: True,
            persist=store.put, forget=store.delete,
        )  # fmt: skip
        entries, _bad = store.load()
        table.load(entries, 0.0)
        entry = table.get(tid)
        assert entry is not None and entry.epoch == first["epoch"], "X's view: its own epoch"
        table.post_result(tid, TaskResult(7, b"late from the dead owner\n", 1.0), 0.0)
        store.close()

        mesh.start(x.name, "--bootstrap", y.address, state=x.state_dir)
        wait_until(lambda: _stale(y) > before, 30, "the late result to reach Y and be fenced")
        after = _task(y, tid)
        assert after["phase"] == "succeeded" and after["epoch"] == done["epoch"], after
        assert after["owner"] == y.node_id and after["result"]["exit_code"] == 0, after
        assert "late from the dead owner" not in after["result"]["output_tail"]
    finally:
        mesh.stop_all()
