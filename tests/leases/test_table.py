"""`LeaseTable`: local operations, remote deltas, fencing, expiry, compaction, anti-entropy."""

from __future__ import annotations

import hashlib

import attrs
import pytest

from populi_p2p.leases import (
    LeaseConfig,
    LeaseError,
    LeaseExpired,
    Phase,
    StaleResultRejected,
    TaskChanged,
    TaskCompacted,
    TaskPhase,
    TaskResult,
)
from populi_p2p.leases.wire import MessageType, encode_entries, encode_entry, encode_message

from .helpers import anti_entropy, fake_sign, spec, table


def _submitted(n: int = 0):
    a, b = table("a"), table("b")
    tid, delta = a.submit(spec(n, by="a"), now=0.0)
    b.apply(delta, now=0.0)
    return a, b, tid


def test_lifecycle_replicates_through_deltas() -> None:
    a, b, tid = _submitted()
    for op in (
        lambda: b.claim(tid, 1, 10, "best fit", 1.0),
        lambda: b.mark_running(tid, 1.5),
        lambda: b.renew(tid, 2.0),
        lambda: b.post_result(tid, TaskResult(0, b"ok", 3.0), 3.0),
    ):
        events = a.apply(op(), now=1.0)
        assert [type(e) for e in events] == [TaskChanged]
    assert a.get(tid) == b.get(tid)
    entry = a.get(tid)
    assert entry.phase is TaskPhase.SUCCEEDED and entry.owner == "b"
    assert entry.accepted_result.output_tail == b"ok"
    assert entry.current.explanation == "best fit" and entry.current.renewals == 1
    assert a.statistics().deltas_merged == 4


def test_local_misuse_raises() -> None:
    a, b, tid = _submitted()
    with pytest.raises(LeaseError):
        a.mark_running(tid, 1.0)  # a holds no lease
    b.claim(tid, 1, 0, "", 1.0)
    with pytest.raises(LeaseError):
        b.claim(tid, 1, 0, "", 1.0)  # epoch must grow
    with pytest.raises(LeaseError):
        a.submit(spec(1, by="someone-else"), 0.0)


def test_a_replica_that_missed_an_earlier_failure_still_counts_it() -> None:
    """Deltas carry one claim each: a replica can hear epoch 2's claim and failure and
    miss epoch 1's result. Retries allowed: 1. It must see the task as finished (two
    failures), not claim a third epoch (CI once ran a `--retries 1` task three times)."""
    a, b, c = table("a"), table("b"), table("c")
    tid, sub = a.submit(spec(0, by="a", retry_limit=1), now=0.0)
    for t in (b, c):
        t.apply(sub, now=0.0)
    for delta in (a.claim(tid, 1, 0, "", 1.0), a.mark_running(tid, 1.0)):
        b.apply(delta, now=1.0)
        c.apply(delta, now=1.0)
    b.apply(a.post_result(tid, TaskResult(3), 2.0), now=2.0)  # c misses this one
    assert b.get(tid).needs_owner()
    claim2 = b.claim(tid, 2, 0, "", 3.0)
    assert b.get(tid).current.failures_before == 1
    failed2 = b.post_result(tid, TaskResult(3), 3.5)
    c.apply(claim2, now=4.0)
    c.apply(failed2, now=4.0)
    seen = c.get(tid)
    assert [rec.phase for rec in seen.claims] == [Phase.RUNNING, Phase.FAILED]
    assert seen.failures() == 2 and seen.finished() and not seen.needs_owner()
    assert b.get(tid).finished()


def test_claims_signed_before_failures_before_existed_still_verify() -> None:
    """A claim with no failures before it is signed over the old 5-field body, and a
    9-field claim (a store written by an older version) decodes with `failures_before`
    0 and verifies."""
    import msgpack

    from populi_p2p.leases._entry import CLAIM_CONTEXT

    a, _, tid = _submitted()
    a.claim(tid, 1, 7, "fit", 1.0)
    rec = a.get(tid).current
    legacy = CLAIM_CONTEXT + msgpack.packb([tid, 1, 7, "a", "fit"], use_bin_type=True)
    assert rec.failures_before == 0 and rec.signature == fake_sign("a")(legacy)
    raw = msgpack.unpackb(encode_entries([a.get(tid)]), raw=False)
    claim = raw[2][0][3][0]
    assert len(claim) == 10 and claim[9] == 0
    raw[2][0][3][0] = claim[:9]
    c = table("c")
    c.apply(msgpack.packb(raw, use_bin_type=True), now=1.0)
    assert c.get(tid) is not None and c.get(tid).current == rec
    assert c.statistics().forged_parts_dropped == 0


def test_stale_result_is_rejected_and_counted_in_either_order() -> None:
    for stale_first in (True, False):
        a, b, tid = _submitted()
        c = table("c")
        c.apply(a.full_delta(tid), 0.0)
        old = b.claim(tid, 1, 0, "", 1.0)
        stale = b.post_result(tid, TaskResult(0, b"late"), 2.0)  # b was presumed dead
        c.apply(old, 1.0)
        new = c.claim(tid, 2, 0, "replaced b", 2.0)
        order = [stale, new] if stale_first else [new, stale]
        events = [ev for d in [old, *order] for ev in a.apply(d, 3.0)]
        entry = a.get(tid)
        assert entry.owner == "c" and entry.epoch == 2 and entry.accepted_result is None
        assert StaleResultRejected(tid, 1, "b") in events
        assert a.statistics().stale_results_rejected == 1


def test_forged_parts_and_junk_are_dropped_and_counted() -> None:
    a, b, tid = _submitted()
    claim = b.claim(tid, 1, 0, "", 1.0)
    entry = b.get(tid)
    forged = attrs.evolve(entry.current, owner="mallory")  # signature is b's
    forged_delta = encode_entries([attrs.evolve(entry, claims=(forged,), spec=None)])
    assert a.apply(forged_delta, 1.0) == []
    assert a.get(tid).owner is None
    assert a.statistics().forged_parts_dropped == 1
    for junk in (b"", b"\xc1", b"\x93\x01\x01\xc0", claim[:-3], b"x" * 70_000):
        assert a.apply(junk, 1.0) == []
    assert a.statistics().decode_errors == 5
    wrong_sig = fake_sign("zed")
    s = spec(9, by="a")
    bad = encode_entries(
        [attrs.evolve(a.get(tid), task_id=s.task_id(), spec=s, spec_signature=s.sign(wrong_sig))]
    )
    a.apply(bad, 1.0)
    assert a.get(s.task_id()).spec is None  # the unsigned spec never lands


def test_a_forged_renewal_or_phase_is_dropped() -> None:
    """Progress is signed by the owner: bumping renewals or the phase of someone
    else's claim (to keep a dead owner's lease alive) does not verify."""
    a, b, tid = _submitted()
    a.apply(b.claim(tid, 1, 0, "", 1.0), 1.0)
    cur = a.get(tid).current
    for forged in (attrs.evolve(cur, renewals=99), attrs.evolve(cur, phase=Phase.RUNNING)):
        assert a.apply(encode_entries([attrs.evolve(a.get(tid), claims=(forged,))]), 2.0) == []
    assert a.get(tid).current == cur
    assert a.statistics().forged_parts_dropped == 2


def test_expiry_on_own_clock_and_on_membership() -> None:
    a, b, tid = _submitted()
    a.apply(b.claim(tid, 1, 0, "", 100.0), now=5.0)  # b's clock is irrelevant
    ttl = a.config.lease_ttl
    assert a.expired_owners(5.0 + ttl - 0.01) == []
    a.apply(b.renew(tid, 101.0), now=6.0)
    assert a.expired_owners(5.0 + ttl) == []  # the renewal reset a's observation
    assert a.expired_owners(6.0 + ttl) == [LeaseExpired(tid, 1, "b", "silent")]
    assert a.expired_owners(6.5, gone={"b"}) == [LeaseExpired(tid, 1, "b", "gone")]
    assert a.next_deadline() == 6.0 + ttl


def test_compaction_then_tombstone_blocks_resurrection() -> None:
    a, b, tid = _submitted()
    a.apply(b.claim(tid, 1, 0, "", 1.0), 1.0)
    done = b.post_result(tid, TaskResult(0), 2.0)
    a.apply(done, 10.0)
    keep = a.config.finished_retention
    assert [e for e in a.tick(10.0 + keep - 1) if isinstance(e, TaskCompacted)] == []
    assert TaskCompacted(tid) in a.tick(10.0 + keep)
    assert a.get(tid) is None
    assert a.apply(done, 10.0 + keep + 1) == []  # a late delta does not bring it back
    assert a.statistics().resurrections_blocked == 1


def test_cancel_wins_and_finishes() -> None:
    a, b, tid = _submitted()
    a.apply(b.claim(tid, 1, 0, "", 1.0), 1.0)
    b.apply(a.cancel(tid, 2.0), 2.0)
    assert a.get(tid) == b.get(tid)
    assert b.get(tid).phase is TaskPhase.CANCELLED and b.get(tid).finished()
    assert b.held_by("b") == []


def test_persist_is_called_before_the_delta_is_returned() -> None:
    saved = []
    a = table("a", persist=saved.append)
    tid, _ = a.submit(spec(1, by="a"), 0.0)
    assert saved[-1] == a.get(tid)
    a.claim(tid, 1, 0, "", 1.0)
    assert saved[-1] == a.get(tid) and len(saved) == 2


@pytest.mark.parametrize("direct", [False, True])
def test_anti_entropy_converges_and_moves_only_differences(direct: bool) -> None:
    a, b = table("a"), table("b")
    for i in range(400):
        _, d = a.submit(spec(i, by="a"), 0.0)
        b.apply(d, 0.0)
    full = len(encode_entries(list(a)))
    for i in range(400, 404):  # a has 4 that b lacks
        a.submit(spec(i, by="a"), 0.0)
    b_only = table("b")
    for i in range(500, 503):
        _, d = b_only.submit(spec(i, by="b"), 0.0)
        b.apply(d, 0.0)
    tid = next(iter(a)).task_id  # and one entry differs on both sides
    a.apply(b.claim(tid, 1, 0, "", 1.0), 1.0)
    b.apply(a.cancel(tid, 1.0), 1.0)
    moved = anti_entropy(a, b, direct=direct)
    if direct:  # one-way: each side pulls in its own round
        moved += anti_entropy(b, a, direct=direct)
    assert sorted((e.task_id, e) for e in a) == sorted((e.task_id, e) for e in b)
    assert len(a) == 407
    assert moved < full / 2
    assert anti_entropy(a, b) == len(a.digest())  # in sync: the digest alone


def test_anti_entropy_is_bounded_per_message_and_finishes_over_rounds() -> None:
    cfg = attrs.evolve(LeaseConfig.local(), anti_entropy_entries_max=10)
    a, b = table("a", cfg), table("b", cfg)
    for i in range(35):
        a.submit(spec(i, by="a"), 0.0)
    rounds = 0
    while {e.task_id for e in b} != {e.task_id for e in a}:
        before = len(b)
        anti_entropy(a, b)
        assert len(b) - before <= 10
        rounds += 1
        assert rounds < 10
    assert rounds == 4


def _digest_from_scratch(t, bits: int) -> bytes:
    """The wire digest as the protocol defines it: per bucket of 2**bits task-id
    prefixes, the xor of its entries' 8-byte blake2b hashes, cut to 32 bits."""
    buckets = [0] * (1 << bits)
    for entry in t:
        h = hashlib.blake2b(encode_entry(entry), digest_size=8).digest()
        buckets[int(entry.task_id[:4], 16) >> (16 - bits)] ^= int.from_bytes(h, "big")
    blob = b"".join((h & 0xFFFFFFFF).to_bytes(4, "big") for h in buckets)
    return encode_message(MessageType.DIGEST, [bits, blob])


def test_the_kept_bucket_hashes_give_the_digest_computed_from_scratch() -> None:
    """The bucket hashes are kept up to date change by change (not folded per call):
    after submits, claims, results and compaction, every width still says what the
    entries say, including widths first asked for before the changes."""
    a = table("a")
    tids = []
    for i in range(200):
        tids.append(a.submit(spec(i, by="a"), 0.0)[0])
        if i == 3:  # widths asked for early, then kept through every later change
            assert a.digest(5) == _digest_from_scratch(a, 5)
            assert a.digest() == _digest_from_scratch(a, 8)
    for k, tid in enumerate(tids[:40]):
        a.claim(tid, 1, 0, "", 1.0)
        if k % 2:
            a.post_result(tid, TaskResult(0, b"ok", 2.0), 2.0)
    a.tick(2.0 + a.config.finished_retention)
    assert len(a) == 180  # the 20 finished ones were compacted away
    for bits in range(17):
        assert a.digest(bits) == _digest_from_scratch(a, bits), bits
    a.check_invariants()


def test_compacted_ids_are_not_wanted_back() -> None:
    a, b, tid = _submitted()
    a.apply(b.claim(tid, 1, 0, "", 1.0), 1.0)
    a.apply(b.post_result(tid, TaskResult(0), 2.0), 2.0)
    a.tick(2.0 + a.config.finished_retention)
    assert a.get(tid) is None and b.get(tid) is not None
    anti_entropy(b, a)  # b offers it; a neither asks for it nor keeps it
    assert a.get(tid) is None
