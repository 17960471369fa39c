"""`swim._faults.FaultHooks`: the simulator's hooks, resolved once; missing means none."""

from __future__ import annotations

from swim._faults import FaultHooks


class _Both:
    def gossip_fanout(self, fanout: int) -> int:
        return fanout * 2

    def drop_refute(self) -> bool:
        return True


class _FanoutOnly:
    def gossip_fanout(self, fanout: int) -> int:
        return 1


class _NotCallable:
    gossip_fanout = 3
    drop_refute = "yes"


def test_no_faults_object_means_no_hooks() -> None:
    hooks = FaultHooks(None)
    assert hooks.gossip_fanout is None
    assert hooks.drop_refute is None


def test_present_methods_are_bound_and_called_through() -> None:
    hooks = FaultHooks(_Both())
    assert hooks.gossip_fanout is not None and hooks.gossip_fanout(3) == 6
    assert hooks.drop_refute is not None and hooks.drop_refute() is True


def test_a_missing_method_is_no_fault_while_the_other_one_holds() -> None:
    hooks = FaultHooks(_FanoutOnly())
    assert hooks.gossip_fanout is not None and hooks.gossip_fanout(5) == 1
    assert hooks.drop_refute is None


def test_attributes_that_are_not_callable_are_ignored() -> None:
    hooks = FaultHooks(_NotCallable())
    assert hooks.gossip_fanout is None
    assert hooks.drop_refute is None
