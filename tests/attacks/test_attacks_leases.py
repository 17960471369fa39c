"""An insider against task ownership (issue 17, "Insider"): an enrolled member, known to
every daemon by its signed record, sends the lease agents signed messages of its own.

The insider (`attacker.Insider`) joins a 4-daemon mesh (LAN preset) after three tasks
are running, so it is in none of their replica sets; its record says draining, so no
work is placed on it. It then asks each replica to grant it the running task (at 2^62,
at the wire's largest epoch, at the next epoch and at the current one), posts a success
for a task it does not own, cancels a task it did not accept (with no proof, with its
own member certificate passed off as an operator's, and with another cluster's
operator key), floods every daemon with ends and grant requests for task
ids nobody holds, gossips a lease-table claim at epoch 2^62, and renews a running task
at the next epoch in its own name.

Each test reads the agents' counters (`status --json`: ``tasks.agent``), the insider's
inbox (the granters' answers), the tasks as every daemon shows them, and the process
table: the real run must keep its process (one, with the same pid), its owner and its
epoch. See docs/security.md, "Attack suite".
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from populi_p2p.api import ApiClient, ApiError
from populi_p2p.leases._cancel import OPERATOR_CANCEL_CONTEXT, OperatorProof, operator_cancel_bytes
from populi_p2p.leases._entry import ClaimRecord, Phase, TaskEntry, claim_bytes
from populi_p2p.leases.agent_state import EARLY_GRANTS_PER_SENDER
from populi_p2p.leases.agent_wire import (
    Finish,
    FinishAnswer,
    GrantAnswer,
    GrantRequest,
    Renew,
)
from populi_p2p.leases.grants import EPOCH_MAX, Ended, Refusal
from populi_p2p.leases.wire import encode_entries
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.operator import OperatorKey, proof_to_json
from tests.node.harness import Daemon, WaitTimeout, wait_until

from .attacker import TALLY, Insider
from .conftest import AttackMesh, start_mesh
from .helpers import swim_counter

HOSTS = ("127.0.0.31", "127.0.0.32", "127.0.0.33", "127.0.0.34")
INSIDER_HOST = "127.0.0.39"
#: The LAN preset's renewal interval: one round of renewals happens within it.
RENEW_INTERVAL = 5.0
#: How long the first test's task sleeps (it must outlive the forged success).
FINISH_SLEEP = "25.2"


@attrs.define
class Running:
    """A task running on the mesh, as its replicas and the process table saw it."""

    tid: str
    sleep: str  # the `sleep` argument: its process is found by this command line
    replicas: list[Daemon]
    owner: Daemon
    epoch: int
    pid: int


@attrs.define
class InsiderMesh:
    attack: AttackMesh
    insider: Insider
    tasks: dict[str, Running]

    @property
    def daemons(self) -> list[Daemon]:
        return self.attack.daemons

    def send(self, daemon: Daemon, apps: list[Any], **options: Any) -> int:
        return self.insider.send_apps(self.attack.address(daemon), daemon.node_id, apps, **options)


########################################################################################
# Reading the daemons and the process table


def agent(d: Daemon) -> dict[str, int]:
    """The lease agent's counters (`status --json` -> tasks.agent)."""
    return {k: int(v) for k, v in d.status()["tasks"]["agent"].items()}


def task(d: Daemon, tid: str) -> dict[str, Any]:
    return d.client.get(f"/v1/tasks/{tid}")  # type: ignore[no-any-return]


def task_ids(d: Daemon) -> set[str]:
    return {row["id"] for row in d.client.get("/v1/tasks")}


def sleepers(arg: str) -> list[int]:
    """Live processes whose command line is exactly ``sleep ARG`` (any daemon's)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")[:-1]
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cmdline == [b"sleep", arg.encode()] and state != "Z":
            pids.append(int(proc.name))
    return sorted(pids)


#: Counters that move in steady state, whatever an attacker does.
ROUTINE = frozenset({"owned", "renew_digests_quiet"})


def rose(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Counters that changed, by how much (but the `ROUTINE` ones)."""
    keys = before.keys() | after.keys()
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(keys) if k not in ROUTINE
            and after.get(k, 0) != before.get(k, 0)}  # fmt: skip


def counted(d: Daemon, before: dict[str, int], expect: dict[str, int], timeout: float = 15) -> None:
    """Wait until `d`'s agent counters rose by exactly `expect` over `before` (and
    nothing else moved)."""

    def exactly() -> bool:
        return rose(before, agent(d)) == expect

    try:
        wait_until(exactly, timeout, f"{d.name} to count exactly {expect}")
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}; it counted {rose(before, agent(d))}") from None


def unchanged_run(mesh: InsiderMesh, r: Running) -> str | None:
    """Why the run `r` is not as it was (None: the same process, owner and epoch,
    shown running by every daemon, and no second process)."""
    pids = sleepers(r.sleep)
    if pids != [r.pid]:
        return f"processes of sleep {r.sleep}: {pids}, expected [{r.pid}]"
    for d in mesh.daemons:
        t = task(d, r.tid)
        if (t["phase"], t["owner"], t["epoch"]) != ("running", r.owner.node_id, r.epoch):
            return f"{d.name} shows {t['phase']} at epoch {t['epoch']} owned by {t['owner']}"
    return None


def answered(mesh: InsiderMesh, condition: Callable[[], bool], what: str) -> None:
    """Wait for the insider's inbox to satisfy `condition`; if it never does, say what
    the insider's responder saw and how each daemon holds the insider."""
    try:
        wait_until(condition, 10, what)
    except WaitTimeout as exc:
        views = {}
        for d in mesh.daemons:
            rows = [m for m in d.members() if m["node_id"] == mesh.insider.node_id]
            views[d.name] = rows[0]["state"] if rows else "unknown"
        raise AssertionError(f"{exc}: {mesh.insider.diagnose()}; daemons hold it {views}") from None


def holds_for(mesh: InsiderMesh, r: Running, seconds: float) -> None:
    """Assert the run stays unchanged for `seconds` (a window that covers renewal
    rounds: a stolen grant would show at the owner's next renewal, a stop at once)."""
    deadline = time.monotonic() + seconds
    while True:
        why = unchanged_run(mesh, r)
        assert why is None, why
        if time.monotonic() >= deadline:
            return
        time.sleep(0.25)


########################################################################################
# The mesh


def _submit(mesh: AttackMesh, command: list[str]) -> Running:
    """Submit through one daemon's API; the replicas are those its signed spec names
    (`populi-node task ID`), each of which took a granter record for it."""
    ds = mesh.daemons
    client = ApiClient(ds[0].client.socket_path, timeout=15.0)
    tid = str(client.post("/v1/tasks", {"command": command})["id"])
    named = set(task(ds[0], tid)["spec"]["replicas"])
    reps = [d for d in ds if d.node_id in named]
    assert len(reps) == len(named) >= 3, (named, [d.node_id for d in ds])
    wait_until(lambda: all(agent(d)["granter_records"] >= 1 for d in reps), 15, "records")
    t = wait_until(lambda: (x := task(ds[0], tid))["phase"] == "running" and x, 30, "a run")
    sleep = command[-1] if command[0] == "sleep" else FINISH_SLEEP
    (pid,) = wait_until(lambda: sleepers(sleep), 10, f"the process of {tid}")
    owner = next(d for d in ds if d.node_id == t["owner"])
    return Running(tid, sleep, reps, owner, int(t["epoch"]), pid)


@pytest.fixture(scope="module")
def insider_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InsiderMesh]:
    mesh = start_mesh(tmp_path_factory.mktemp("lease-attack-mesh"), "lan", HOSTS)
    insider = Insider(INSIDER_HOST, mesh.mesh.authority, seed=71)
    try:
        tasks = {
            "grants": _submit(mesh, ["sleep", "300.1"]),
            "hijack": _submit(mesh, ["sleep", "300.3"]),
            # Last: it sleeps only 25 s and its test comes first.
            "finish": _submit(mesh, ["sh", "-c", f"sleep {FINISH_SLEEP}; echo real-end"]),
        }
        insider.learn_certificates(
            [d.state_dir for d in mesh.daemons], mesh.mesh.authority.public_key
        )
        insider.start()
        insider.join(mesh.address(mesh.daemons[0]), mesh.daemons[0].node_id)

        def known_everywhere() -> bool:
            for d in mesh.daemons:
                rows = [m for m in d.members() if m["node_id"] == insider.node_id]
                if not (rows and rows[0]["state"] == "alive" and rows[0]["verified"]):
                    return False
            return True

        wait_until(known_everywhere, 20, "every daemon to hold the insider's record")
        yield InsiderMesh(mesh, insider, tasks)
    finally:
        insider.close()
        mesh.mesh.stop_all()


########################################################################################
# The attacks


def test_a_forged_success_for_a_task_it_does_not_own_is_refused(
    insider_mesh: InsiderMesh,
) -> None:
    """Finish(task, epoch, SUCCEEDED), and at the next epoch, to each replica: refused
    (`not_owner`), counted; the task runs on and succeeds with its real exit code."""
    mesh, insider = insider_mesh, insider_mesh.insider
    r = mesh.tasks["finish"]
    watch = mesh.attack.watch()
    assert unchanged_run(mesh, r) is None, "the task ended before the attack: too slow"
    sent = insider.sent
    before = {d.name: agent(d) for d in r.replicas}
    forged = [
        insider.agent(Finish(r.tid, r.epoch, Ended.SUCCEEDED)),
        insider.agent(Finish(r.tid, r.epoch + 1, Ended.SUCCEEDED)),
    ]
    for d in r.replicas:
        mesh.send(d, forged)
    for d in r.replicas:
        counted(d, before[d.name], {"finishes_refused_not_owner": 2})
    want = {(d.node_id, e, Refusal.NOT_OWNER) for d in r.replicas for e in (r.epoch, r.epoch + 1)}

    def answers() -> set[tuple[str, int, int]]:
        got = insider.agent_messages(FinishAnswer)
        return {(s, m.epoch, m.refusal) for s, m in got if m.task_id == r.tid}

    answered(mesh, lambda: want <= answers(), "each replica to answer NOT_OWNER to the insider")
    holds_for(mesh, r, 1.0)
    done = wait_until(
        lambda: (t := task(r.owner, r.tid))["finished"] and t, 60, "the real end"
    )  # fmt: skip
    assert done["phase"] == "succeeded" and done["epoch"] == r.epoch, done
    assert done["owner"] == r.owner.node_id
    assert [e["phase"] for e in done["epochs"]] == ["succeeded"], done
    assert done["result"]["exit_code"] == 0 and done["result"]["output_tail"] == "real-end\n"
    assert done["result"]["duration"] >= float(FINISH_SLEEP), done["result"]
    changes = watch.settled()
    TALLY.add("insider: forged Finish(SUCCEEDED) of a task it does not own",
              insider.sent - sent, len(changes))  # fmt: skip
    assert changes == []


def test_a_cancel_of_a_task_it_did_not_accept_is_refused(insider_mesh: InsiderMesh) -> None:
    """Finish(task, e, CANCELLED) to each replica of a running task that another daemon
    accepted: bare, with the insider's own member certificate as an "operator" proof
    (signed with its node key), and with an operator key of another cluster's authority.
    Each replica refuses all three (`not_canceller`), counts them and answers so; the
    run keeps its process, owner and epoch (issue 18: who may cancel)."""
    mesh, insider = insider_mesh, insider_mesh.insider
    r = mesh.tasks["hijack"]
    watch = mesh.attack.watch()
    assert unchanged_run(mesh, r) is None
    sent = insider.sent
    before = {d.name: agent(d) for d in r.replicas}
    now = time.time()
    at = int(now)
    own = insider.identity.sign(OPERATOR_CANCEL_CONTEXT, operator_cancel_bytes(r.tid, at))
    foreign, _ = OperatorKey.create(ClusterAuthority.generate(), now=now)
    cancels = [
        insider.agent(Finish(r.tid, r.epoch, Ended.CANCELLED)),
        insider.agent(Finish(r.tid, r.epoch, Ended.CANCELLED, 0,
                             OperatorProof(insider.certificate, at, own))),
        insider.agent(Finish(r.tid, r.epoch, Ended.CANCELLED, 0,
                             foreign.prove_cancel(r.tid, now))),
    ]  # fmt: skip
    for d in r.replicas:
        mesh.send(d, cancels, per_packet=1)
    for d in r.replicas:
        counted(d, before[d.name], {"finishes_refused_not_canceller": 3})

    def refused() -> dict[str, int]:
        got = insider.agent_messages(FinishAnswer)
        out: dict[str, int] = {}
        for s, m in got:
            if m.task_id == r.tid and m.refusal == Refusal.NOT_CANCELLER:
                out[s] = out.get(s, 0) + 1
        return out

    want = {d.node_id: 3 for d in r.replicas}
    answered(mesh, lambda: refused() == want, "each replica to answer NOT_CANCELLER thrice")
    holds_for(mesh, r, RENEW_INTERVAL)  # a cancel that went through stops it at once
    changes = watch.settled()
    TALLY.add("insider: Finish(CANCELLED) of a task it did not accept (bare, own cert, "
              "foreign operator key)", insider.sent - sent, len(changes))  # fmt: skip
    assert changes == []


def test_grant_requests_for_a_running_task_are_refused(insider_mesh: InsiderMesh) -> None:
    """GrantRequest(task, e, insider) at 2^62, at the wire's largest epoch, at the next
    and at the current epoch, to every daemon: replicas refuse (decode error, epoch_jump,
    lease_live, stale), the others do not hold the task (unknown); the run goes on."""
    mesh, insider = insider_mesh, insider_mesh.insider
    r = mesh.tasks["grants"]
    watch = mesh.attack.watch()
    sent = insider.sent
    before = {d.name: agent(d) for d in mesh.daemons}
    me = insider.node_id
    requests = [
        insider.agent(GrantRequest(r.tid, 2**62, me)),  # over the agent wire's bound
        insider.agent(GrantRequest(r.tid, EPOCH_MAX, me)),
        insider.agent(GrantRequest(r.tid, r.epoch + 1, me)),
        insider.agent(GrantRequest(r.tid, r.epoch, me)),
    ]
    for d in mesh.daemons:
        mesh.send(d, requests)
    expect_replica = {
        "decode_errors": 1, "grants_refused_epoch_jump": 1, "grants_refused_lease_live": 1,
        "grants_refused_stale": 1,
    }  # fmt: skip
    expect_other = {"decode_errors": 1, "grants_refused_unknown": 3}
    for d in mesh.daemons:
        expect = expect_replica if d in r.replicas else expect_other
        counted(d, before[d.name], expect)
    # Each replica answers the insider with its refusal and the epoch it holds.
    want = {
        (d.node_id, epoch, refusal, r.epoch)
        for d in r.replicas
        for epoch, refusal in (
            (EPOCH_MAX, Refusal.EPOCH_JUMP), (r.epoch + 1, Refusal.LEASE_LIVE),
            (r.epoch, Refusal.STALE),
        )
    }  # fmt: skip

    def answers() -> set[tuple[str, int, int, int]]:
        got = insider.agent_messages(GrantAnswer)
        return {(s, m.epoch, m.refusal, m.held_epoch) for s, m in got if m.task_id == r.tid}

    answered(mesh, lambda: want <= answers(), "each replica to answer the insider")
    # Two renewal rounds: a grant that went through would supersede the owner's lease.
    holds_for(mesh, r, 2 * RENEW_INTERVAL)
    for d in mesh.daemons:
        expect = expect_replica if d in r.replicas else expect_other
        assert rose(before[d.name], agent(d)) == expect, d.name  # no renewal refused
    changes = watch.settled()
    TALLY.add("insider: GrantRequest of a running task (2^62, 2^62-1, e+1, e)",
              insider.sent - sent, len(changes))  # fmt: skip
    assert changes == []


def test_a_flood_of_ends_and_grants_for_unknown_tasks_stores_nothing(
    insider_mesh: InsiderMesh,
) -> None:
    """1,000 Finish(made-up id, 1, CANCELLED) and 1,000 GrantRequest(made-up id) to
    every daemon: each refused as unknown and counted, but for the first
    `EARLY_GRANTS_PER_SENDER` grant requests, held in memory for a lease in case their
    offer comes next; no task, no granter record."""
    mesh, insider = insider_mesh, insider_mesh.insider
    watch = mesh.attack.watch()
    rng = random.Random(73)
    n = 1000
    sent = insider.sent
    before = {d.name: agent(d) for d in mesh.daemons}
    tasks_before = {d.name: task_ids(d) for d in mesh.daemons}
    for d in mesh.daemons:
        ends = [Finish(rng.randbytes(16).hex(), 1, Ended.CANCELLED) for _ in range(n)]
        grants = [GrantRequest(rng.randbytes(16).hex(), 1, insider.node_id) for _ in range(n)]
        mesh.send(d, [insider.agent(m) for m in ends + grants], per_second=300)
    for d in mesh.daemons:
        # At most EARLY_GRANTS_PER_SENDER held at once: more only if some expired (a
        # lease after they came) while a slow flood went on.
        def answered(d: Daemon = d) -> bool:
            got = rose(before[d.name], agent(d))
            held = got.pop("grants_held_early", 0)
            refused = got.pop("grants_refused_unknown", 0)
            return (held + refused == n and held >= EARLY_GRANTS_PER_SENDER
                    and got == {"finishes_refused_unknown": n})  # fmt: skip

        wait_until(answered, 30, f"{d.name} to refuse or hold every message")
        assert agent(d)["granter_records"] == before[d.name]["granter_records"]
        assert task_ids(d) == tasks_before[d.name]
    changes = watch.settled()
    TALLY.add("insider: 8,000 ends and grant requests for unknown task ids",
              insider.sent - sent, len(changes))  # fmt: skip
    assert changes == []


########################################################################################
# A claim at 2^62 in the lease table


def _claim_delta(insider: Insider, tid: str, epoch: int, owner: str) -> bytes:
    """A table delta with one running claim of `epoch` for `owner`, signed by us."""
    sig = insider.lease_sign(claim_bytes(tid, epoch, 0, owner, "insider"))
    rec = ClaimRecord(epoch, 0, owner, sig, "insider", Phase.RUNNING)
    rec = attrs.evolve(rec, progress_signature=insider.lease_sign(rec.progress_bytes(tid)))
    return encode_entries([TaskEntry(tid, claims=(rec,))])


@attrs.define
class Poisoned:
    run: Running
    target: Daemon  # the daemon the deltas were sent to


@pytest.fixture(scope="module")
def poisoned(insider_mesh: InsiderMesh) -> Poisoned:
    """The `grants` task after the insider sent one daemon (not its owner) a table
    delta with a claim at 2^62 in the real owner's name (signed by the insider: a
    forgery), then one in its own name (properly signed: a claim no granter agreed to).
    Returns once that daemon's swim core has taken both (`app_messages_received`)."""
    mesh, insider = insider_mesh, insider_mesh.insider
    r = mesh.tasks["grants"]
    target = next(d for d in mesh.daemons if d is not r.owner)
    received = target.status()["swim"]["app_messages_received"]
    mesh.send(target, [insider.leases(_claim_delta(insider, r.tid, 2**62, r.owner.node_id))])
    mesh.send(target, [insider.leases(_claim_delta(insider, r.tid, 2**62, insider.node_id))])
    wait_until(
        lambda: target.status()["swim"]["app_messages_received"] >= received + 2,
        10, f"{target.name} to receive both deltas",
    )  # fmt: skip
    return Poisoned(r, target)


def test_a_claim_at_2_62_in_the_table_leaves_the_run_alone(
    insider_mesh: InsiderMesh, poisoned: Poisoned
) -> None:
    """The table is display: the run keeps its process, owner and granters' lease
    (no renewal refused, no second run) through two renewal rounds."""
    mesh, r = insider_mesh, poisoned.run
    watch = mesh.attack.watch()
    before = {d.name: agent(d) for d in mesh.daemons}
    deadline = time.monotonic() + 2 * RENEW_INTERVAL
    while time.monotonic() < deadline:
        assert sleepers(r.sleep) == [r.pid]
        time.sleep(0.25)
    for d in mesh.daemons:
        assert rose(before[d.name], agent(d)) == {}, d.name
    shown = {d.name: (t := task(d, r.tid))["phase"] + f" e={t['epoch']} owner={t['owner']}"
             for d in mesh.daemons}  # fmt: skip
    changes = watch.settled()
    TALLY.add("insider: a lease-table claim at epoch 2^62 (own name; forged in the owner's)",
              2, len(changes), note=f"shown: {shown}")  # fmt: skip
    assert changes == []


def test_a_claim_at_2_62_does_not_change_what_the_daemons_show(
    insider_mesh: InsiderMesh, poisoned: Poisoned
) -> None:
    r = poisoned.run

    def shown() -> list[tuple[str, int, str]]:
        return [
            (t["phase"], t["epoch"], t["owner"])
            for t in (task(d, r.tid) for d in insider_mesh.daemons)
        ]

    try:  # a claim that was taken spreads by gossip: give it the time to reach everyone
        wait_until(lambda: all(e != r.epoch for _, e, _ in shown()), 10, "the claim to spread")
    except WaitTimeout:
        pass
    assert shown() == [("running", r.epoch, r.owner.node_id)] * len(insider_mesh.daemons)


def test_a_task_whose_entry_carries_a_claim_at_2_62_can_still_be_cancelled(
    insider_mesh: InsiderMesh, poisoned: Poisoned
) -> None:
    """Cancelled through the daemon that took the claim, with an operator key (that
    daemon did not accept the task: without one it refuses, in one line): its process
    must go."""
    r = poisoned.run
    client = ApiClient(poisoned.target.client.socket_path, timeout=15.0)
    accepting = task(poisoned.target, r.tid)["spec"]["submitted_by"]
    if accepting != poisoned.target.node_id:
        with pytest.raises(ApiError, match="may be cancelled only by the node that accepted"):
            client.post(f"/v1/tasks/{r.tid}/cancel")
        assert sleepers(r.sleep) == [r.pid]
    operator, _ = OperatorKey.create(insider_mesh.attack.mesh.authority, now=time.time())
    proof = proof_to_json(operator.prove_cancel(r.tid, time.time()))
    client.post(f"/v1/tasks/{r.tid}/cancel", {"operator": proof})
    wait_until(lambda: not sleepers(r.sleep), 10, "the cancelled process to go")
    for d in insider_mesh.daemons:  # every table shows the operator's cancel
        wait_until(lambda d=d: task(d, r.tid)["phase"] == "cancelled", 10, f"{d.name} to show it")


########################################################################################
# Renewing someone else's lease


def test_a_renewal_of_someone_elses_lease_is_refused(insider_mesh: InsiderMesh) -> None:
    """Renew(seq, [(task, e+1)]) from the insider to each replica of a running task:
    the lease must stay with its owner and the run must go on."""
    mesh, insider = insider_mesh, insider_mesh.insider
    r = mesh.tasks["hijack"]
    assert unchanged_run(mesh, r) is None
    sent = insider.sent
    for d in r.replicas:
        mesh.send(d, [insider.agent(Renew(1, ((r.tid, r.epoch + 1),)))])
    try:
        holds_for(mesh, r, 2 * RENEW_INTERVAL)
    finally:
        TALLY.add("insider: Renew of a running task's lease at e+1, in its own name",
                  insider.sent - sent, 0 if unchanged_run(mesh, r) is None else 1,
                  note=unchanged_run(mesh, r) or "")  # fmt: skip


########################################################################################
# Speaking in the owner's name (agent messages carry no signature of their own)


def test_an_agent_message_in_the_owners_name_is_refused(insider_mesh: InsiderMesh) -> None:
    """Finish(task, epoch, SUCCEEDED) for a task the insider does not own, in its signed
    packets, to each other replica: once as itself, the swim App's source (the agent
    refuses it: `finishes_refused_not_owner`), once with the real owner as the App's
    source (swim's core refuses it: `app_refused_sender`). An agent message names no
    sender of its own; the envelope's signer is the only sender an agent believes, and
    a daemon that took the named one would record the owner's success and stop the run."""
    mesh, insider = insider_mesh, insider_mesh.insider
    r = mesh.tasks["hijack"]
    assert unchanged_run(mesh, r) is None
    watch = mesh.attack.watch()
    sent = insider.sent
    owner = r.owner.node_id
    targets = [d for d in r.replicas if d is not r.owner]
    before = {d.name: (agent(d), swim_counter(d, "app_refused_sender")) for d in targets}
    end = Finish(r.tid, r.epoch, Ended.SUCCEEDED)
    for d in targets:
        mesh.send(d, [insider.agent(end)])
        mesh.send(d, [insider.agent(end, source=owner)])
    for d in targets:
        counted(d, before[d.name][0], {"finishes_refused_not_owner": 1})
        wait_until(
            lambda d=d: swim_counter(d, "app_refused_sender") >= before[d.name][1] + 1,
            10, f"{d.name}'s core to refuse the App in the owner's name",
        )  # fmt: skip
    try:
        holds_for(mesh, r, 2 * RENEW_INTERVAL)
    finally:
        changes = watch.settled()
        TALLY.add("insider: Finish(SUCCEEDED) in the owner's name, in its own packets",
                  insider.sent - sent, len(changes) + (unchanged_run(mesh, r) is not None),
                  note=unchanged_run(mesh, r) or "")  # fmt: skip
    assert changes == []
