"""Several replicas, one lossy, duplicating, reordering network: same deltas, same state."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from populi_p2p.leases import LeaseError, TaskResult

from .helpers import spec, table

NAMES = ("a", "b", "c")


class Replicas(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tables = {n: table(n) for n in NAMES}
        self.deltas: list[bytes] = []
        self.seen: dict[str, set[int]] = {n: set() for n in NAMES}
        self.now = 0.0
        self.tids: list[str] = []
        for i, n in enumerate(("a", "b")):
            tid, d = self.tables[n].submit(spec(i, by=n), 0.0)
            self._emit(n, d)
            self.tids.append(tid)

    def _emit(self, node: str, delta: bytes) -> None:
        self.seen[node].add(len(self.deltas))
        self.deltas.append(delta)

    def _op(self, node: str, tid: str, fn) -> None:
        if self.tables[node].get(tid) is None:
            return
        try:
            delta = fn(self.tables[node])
        except LeaseError:
            return
        self._emit(node, delta)

    @rule(
        node=st.sampled_from(NAMES),
        t=st.integers(0, 1),
        rank=st.integers(0, 2),
        skip=st.integers(1, 2),
    )
    def claim(self, node: str, t: int, rank: int, skip: int) -> None:
        tid = self.tids[t]
        self._op(node, tid, lambda tb: tb.claim(tid, tb.get(tid).epoch + skip, rank, "", self.now))

    @rule(
        node=st.sampled_from(NAMES),
        t=st.integers(0, 1),
        what=st.sampled_from(["run", "renew", "ok", "fail", "release", "cancel"]),
    )
    def progress(self, node: str, t: int, what: str) -> None:
        tid = self.tids[t]
        ops = {
            "run": lambda tb: tb.mark_running(tid, self.now),
            "renew": lambda tb: tb.renew(tid, self.now),
            "ok": lambda tb: tb.post_result(tid, TaskResult(0, b"ok"), self.now),
            "fail": lambda tb: tb.post_result(tid, TaskResult(3, b"no"), self.now),
            "release": lambda tb: tb.release(tid, self.now),
            "cancel": lambda tb: tb.cancel(tid, self.now),
        }
        self._op(node, tid, ops[what])

    @precondition(lambda self: self.deltas)
    @rule(node=st.sampled_from(NAMES), data=st.data())
    def deliver(self, node: str, data: st.DataObject) -> None:
        """Any delta, to any replica, any number of times: reorder and duplicate.
        Deltas never delivered model loss."""
        i = data.draw(st.integers(0, len(self.deltas) - 1))
        self.now += 0.1
        self.tables[node].apply(self.deltas[i], self.now)
        self.seen[node].add(i)

    @rule(x=st.sampled_from(NAMES), y=st.sampled_from(NAMES))
    def anti_entropy(self, x: str, y: str) -> None:
        from .helpers import anti_entropy

        if x != y:
            anti_entropy(self.tables[x], self.tables[y], self.now)
            union = self.seen[x] | self.seen[y]
            self.seen[x] = set(union)
            self.seen[y] = set(union)

    @invariant()
    def same_updates_same_state(self) -> None:
        for x in NAMES:
            for y in NAMES:
                if x < y and self.seen[x] == self.seen[y]:
                    tx, ty = self.tables[x], self.tables[y]
                    assert {e.task_id: e for e in tx} == {e.task_id: e for e in ty}

    @invariant()
    def tables_are_consistent(self) -> None:
        for tb in self.tables.values():
            tb.check_invariants()

    @invariant()
    def accepted_result_is_the_current_epochs(self) -> None:
        for tb in self.tables.values():
            for e in tb:
                if e.accepted_result is not None:
                    assert e.current.result is e.accepted_result

    def teardown(self) -> None:
        # Heal: deliver everything everywhere; all replicas converge.
        for tb in self.tables.values():
            for d in self.deltas:
                tb.apply(d, self.now)
        first = {e.task_id: e for e in self.tables["a"]}
        for tb in self.tables.values():
            assert {e.task_id: e for e in tb} == first


Replicas.TestCase.settings = settings(
    derandomize=True, max_examples=150, stateful_step_count=40, deadline=None
)
TestReplicas = Replicas.TestCase
