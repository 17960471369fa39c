"""Who may cancel (issue 18): the node that accepted the task, or anyone with an
operator key the cluster authority certified. Every other cancel is refused by the
canceller's own agent (one line: who may, and how), by each granter (`NOT_CANCELLER`,
counted) and by every lease table (`cancels_refused`), and the run goes on."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from populi_p2p.leases import LeaseConfig, LeaseTable, TaskPhase
from populi_p2p.leases._cancel import OperatorProof
from populi_p2p.leases._entry import Cancel, TaskEntry, cancel_bytes
from populi_p2p.leases.agent_commands import Acknowledged
from populi_p2p.leases.agent_wire import Finish, FinishAnswer, encode
from populi_p2p.leases.grants import Ended, Refusal
from populi_p2p.leases.wire import encode_entries
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.operator import OPERATOR_SCOPE, OperatorKey, operator_checker
from populi_p2p.trust.revocation import RevocationList

from .agent_harness import Cluster, sign_as, verify

#: The realtime every node's operator check reads (the harness has no wall clock).
NOW = 1_700_000_000.0
AUTHORITY = ClusterAuthority.from_seed(b"a" * 32)
OPERATOR, OPERATOR_CERT = OperatorKey.create(AUTHORITY, now=NOW - 3600, expires_in=86400)


def _cluster(n: int = 3, seed: int = 11, revocations: RevocationList | None = None) -> Cluster:
    check = operator_checker(AUTHORITY.public_key, lambda: revocations, clock=lambda: NOW)
    return Cluster(n, seed=seed, check_operator=check)


def _running(c: Cluster, at: str = "n0", duration: float = 20.0) -> str:
    tid = c.submit(at, duration)
    c.run_until(c.now + 2.0)
    assert len(c.runs[tid]) == 1 and c.runs[tid][0].end is None, "running"
    return tid


def _counters(c: Cluster, name: str) -> int:
    return sum(n.agent.counters.get(name, 0) for n in c.nodes.values())


def _cancel_answers(c: Cluster, tid: str) -> list[Acknowledged]:
    return [a for a in c.answers if a.task_id == tid and a.what == "cancel"]


def _replicas(c: Cluster, tid: str) -> tuple[str, ...]:
    known = c.nodes[c.accepted_by[tid]].agent.spec_of(tid)
    assert known is not None
    return known[0].replicas


def _runs_to_its_end(c: Cluster, tid: str, until: float = 60.0) -> None:
    c.run_until(until)
    c.heal_and_sync()
    assert c.check() == []
    assert len(c.runs[tid]) == 1 and c.runs[tid][0].code == 0, "the run went on to its end"
    for node in c.nodes.values():
        assert node.agent.table.get(tid).phase is TaskPhase.SUCCEEDED


def test_a_cancel_at_a_member_that_did_not_accept_the_task_is_refused_with_one_line() -> None:
    c = _cluster()
    tid = _running(c)
    c.cancel("n1", tid)
    (answer,) = _cancel_answers(c, tid)
    assert answer.forbidden and answer.acks == 0
    assert answer.refusal == (
        f"task {tid} may be cancelled only by the node that accepted it (n0) or with an"
        " operator key: run populi-node cancel on that node, or pass --operator-key FILE"
        " (made by populi-node cluster operator)"
    )
    assert c.nodes["n1"].agent.counters.get("cancels_refused_here") == 1
    _runs_to_its_end(c, tid)


def test_a_raw_cancel_from_a_member_is_refused_by_every_replica_and_counted() -> None:
    """A member that skips its own agent's check and sends Finish(CANCELLED) itself:
    each granter answers NOT_CANCELLER, counts it, and holds the task as it was."""
    c = _cluster(4)
    tid = _running(c)
    evil = "n3"
    forged = encode(Finish(tid, 1, Ended.CANCELLED))
    answers: list[FinishAnswer] = []
    for r in _replicas(c, tid):
        c._push(c.now, "msg", (evil, r, forged))
    original = c.nodes[evil].agent.receive

    def spy(payload: bytes, now: float, sender: str):  # type: ignore[no-untyped-def]
        from populi_p2p.leases.agent_wire import decode

        msg = decode(payload)
        if isinstance(msg, FinishAnswer):
            answers.append(msg)
        return original(payload, now, sender)

    c.nodes[evil].agent.receive = spy  # type: ignore[method-assign]
    c.run_until(3.0)
    replicas = _replicas(c, tid)
    assert _counters(c, "finishes_refused_not_canceller") == len(replicas)
    others = [r for r in replicas if r != evil]  # its own answer does not travel
    assert [a.refusal for a in answers] == [Refusal.NOT_CANCELLER] * len(others)
    assert all(c.nodes[r].agent.grants[tid].ended is Ended.NO for r in replicas)
    _runs_to_its_end(c, tid)


def test_the_accepting_node_cancels_and_an_operator_cancels_from_anywhere() -> None:
    c = _cluster()
    by_owner = _running(c, at="n0", duration=30.0)
    by_operator = _running(c, at="n1", duration=30.0)
    c.cancel("n0", by_owner)
    proof = OPERATOR.prove_cancel(by_operator, NOW)
    c.cancel("n2", by_operator, proof)
    at = c.now
    c.run_until(at + 1.0)
    for tid in (by_owner, by_operator):
        assert [a.refusal for a in _cancel_answers(c, tid)] == [None]
        assert c.runs[tid][0].end is not None and c.runs[tid][0].end < at + 1.0, "stopped"
    c.run_until(40.0)
    c.heal_and_sync()
    assert c.check() == []
    for node in c.nodes.values():
        assert node.agent.table.get(by_owner).cancel.by == "n0"
        shown = node.agent.table.get(by_operator)
        assert shown.phase is TaskPhase.CANCELLED
        assert shown.cancel == Cancel("n2", shown.cancel.signature, proof)
    assert _counters(c, "finishes_refused_not_canceller") == 0


def _member_cert_proof(tid: str) -> OperatorProof:
    """A member's own enrollment (scope "member"), passed off as an operator's."""
    key, _ = OperatorKey.create(AUTHORITY, now=NOW)
    member = AUTHORITY.enroll(bytes(key._signing_key.verify_key), "member", now=NOW)
    return attrs.evolve(key.prove_cancel(tid, NOW), certificate=member.raw)


BAD_PROOFS: dict[str, tuple[Callable[[str], OperatorProof], str]] = {
    "expired": (
        lambda tid: OperatorKey.create(AUTHORITY, now=NOW - 100, expires_in=50)[0].prove_cancel(
            tid, NOW
        ),
        "operator certificate refused: expired",
    ),
    "other authority": (
        lambda tid: OperatorKey.create(ClusterAuthority.from_seed(b"b" * 32), now=NOW)[0]
        .prove_cancel(tid, NOW),
        "operator certificate refused: wrong_authority",
    ),
    "member scope": (_member_cert_proof, "operator certificate refused: scope_mismatch"),
    "another task": (
        lambda tid: OPERATOR.prove_cancel("0" * 32, NOW),
        "the operator signature does not verify for this task",
    ),
    "forged signature": (
        lambda tid: attrs.evolve(OPERATOR.prove_cancel(tid, NOW), signature=b"\x01" * 64),
        "the operator signature does not verify for this task",
    ),
    "signed an hour ago": (
        lambda tid: OPERATOR.prove_cancel(tid, NOW - 3600),
        "operator proof signed at",
    ),
    "revoked": (
        lambda tid: OPERATOR.prove_cancel(tid, NOW), "operator certificate refused: revoked"
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_PROOFS))
def test_a_forged_expired_or_foreign_operator_proof_is_refused(case: str) -> None:
    """Refused at the canceller (one line, with the reason), and at every replica when
    a member sends it itself; the run goes on."""
    make, reason = BAD_PROOFS[case]
    revoked = None
    if case == "revoked":
        revoked = RevocationList().with_revocation(
            AUTHORITY.revoke(now=NOW - 10, serial=OPERATOR_CERT.serial)
        )
    c = _cluster(revocations=revoked)
    tid = _running(c)
    proof = make(tid)
    c.cancel("n2", tid, proof)
    (answer,) = _cancel_answers(c, tid)
    assert answer.forbidden and answer.refusal is not None
    assert reason in answer.refusal and "--operator-key FILE" in answer.refusal
    forged = encode(Finish(tid, 1, Ended.CANCELLED, 0, proof))
    for r in _replicas(c, tid):
        c._push(c.now, "msg", ("n2", r, forged))
    c.run_until(3.0)
    assert _counters(c, "finishes_refused_not_canceller") == len(_replicas(c, tid))
    _runs_to_its_end(c, tid)


########################################################################################
# The lease table: a cancel record the granters would refuse is dropped and counted


def _table(me: str, revocations: RevocationList | None = None) -> LeaseTable:
    check = operator_checker(AUTHORITY.public_key, lambda: revocations, clock=lambda: NOW)
    return LeaseTable(LeaseConfig.local(), me, sign_as(me), verify, check_operator=check)


def _cancel_delta(tid: str, by: str, proof: OperatorProof | None) -> bytes:
    sig = sign_as(by)(cancel_bytes(tid, by))
    return encode_entries([TaskEntry(tid, cancel=Cancel(by, sig, proof))])


def _two_tables(revocations: RevocationList | None = None) -> tuple[LeaseTable, LeaseTable, str]:
    from .helpers import spec

    a, b = _table("n0"), _table("n1", revocations)
    tid, delta = a.submit(spec(1, by="n0"), 0.0)
    b.apply(delta, 0.0)
    return a, b, tid


def test_a_cancel_record_by_a_member_that_did_not_accept_the_task_is_dropped() -> None:
    a, b, tid = _two_tables()
    b.apply(_cancel_delta(tid, "n2", None), 1.0)  # signed by n2, but n0 accepted it
    assert b.get(tid).cancel is None and b.get(tid).phase is TaskPhase.PENDING
    assert b.statistics().cancels_refused == 1
    assert b.statistics().forged_parts_dropped == 0  # its signature was fine
    stale = _cancel_delta(tid, "n2", OPERATOR.prove_cancel("0" * 32, NOW))
    b.apply(stale, 1.0)  # a proof for another task
    assert b.get(tid).cancel is None and b.statistics().cancels_refused == 2
    with pytest.raises(Exception, match="may not cancel"):
        b.cancel(tid, 1.0)  # not even locally: every other table would drop it
    b.apply(a.cancel(tid, 2.0), 2.0)  # the accepting node's own
    assert b.get(tid).phase is TaskPhase.CANCELLED and b.get(tid).cancel.by == "n0"


def test_an_operators_cancel_record_is_merged_even_after_the_key_expired() -> None:
    """A recorded cancel is checked as of when the operator signed it, so every table
    takes it alike whenever it arrives; a revoked key's records are dropped."""
    _a, b, tid = _two_tables()
    short, _ = OperatorKey.create(AUTHORITY, now=NOW - 100, expires_in=50)
    delta = _cancel_delta(tid, "n2", short.prove_cancel(tid, NOW - 80))
    b.apply(delta, 1.0)
    assert b.get(tid).phase is TaskPhase.CANCELLED and b.statistics().cancels_refused == 0
    revoked = RevocationList().with_revocation(
        AUTHORITY.revoke(now=NOW, serial=OPERATOR_CERT.serial)
    )
    _a, c, tid = _two_tables(revoked)
    c.apply(_cancel_delta(tid, "n2", OPERATOR.prove_cancel(tid, NOW)), 1.0)
    assert c.get(tid).cancel is None and c.statistics().cancels_refused == 1


def test_an_operator_key_is_certified_in_its_own_scope() -> None:
    from populi_p2p.trust.certificate import verify_certificate

    cert = verify_certificate(OPERATOR.certificate, AUTHORITY.public_key, None, NOW, None)
    assert cert.scope == OPERATOR_SCOPE and cert.expires_at == int(NOW - 3600 + 86400)
    with pytest.raises(Exception, match="scope_mismatch"):  # it admits nobody as a member
        verify_certificate(OPERATOR.certificate, AUTHORITY.public_key, None, NOW)
