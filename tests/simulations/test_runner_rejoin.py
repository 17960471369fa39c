"""The simulator's driver runs the daemon's join and reconnect policy (`swim.RejoinPolicy`)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from simulations import RunResult, parse_scenario, run_once
from simulations._runner import _Run
from swim import MemberJoined, MemberRecovered, Membership, RejoinConfig, SwimConfig


def scenario(**fields: Any) -> Any:
    data: dict[str, Any] = {"name": "t", "members": 16, "duration": 120.0, "seed": 3}
    data.update(fields)
    return parse_scenario(data)


def healed_after(result: Any) -> float | None:
    healed = [c for c in result.measures["convergence"] if c["label"].startswith("partition")]
    return healed[0]["converged_after"] if healed else None


def test_a_long_partition_heals_within_one_check_of_the_daemons_policy() -> None:
    """Members seen failing are retried every check_interval (5 s on a LAN) plus the
    join wait, as the daemon's Bootstrapper does; the old simulator-only loop (every
    30 s, one member with probability failed/alive) took 16 to 31 s at 64 members."""
    for seed in (1, 2, 3):
        result = run_once(scenario(seed=seed, partition=[{"at": 5.0, "heal": 65.0}]))
        assert result.ok, result.failure
        after = healed_after(result)
        check = RejoinConfig.for_probe_interval(SwimConfig.lan().probe_interval).check_interval
        assert after is not None and after <= check + 2.0 + 5.0, (seed, after)


def test_without_reconnects_a_partition_longer_than_retention_never_heals() -> None:
    result = run_once(
        scenario(partition=[{"at": 5.0, "heal": 65.0}], driver={"reconnect_interval": 0})
    )
    assert healed_after(result) is None


class TwoSeeds(_Run):
    """The start storm: seeds 0 and 1 start together and each one's join to the other
    is lost (neither listens yet); every other member joins through both seeds'
    addresses, its `--bootstrap` list (the start's join goes to one of them)."""

    def bootstrap_of(self, node: int) -> list[int]:
        return [0, 1]

    def _start(self, node: int) -> None:
        if node >= 2:
            self._join(node, self.bootstrap_of(node))
            self.started.append(node)
            return
        for seed in (0, 1):  # both at node 0's start (time 0), before any joiner
            if seed not in self.started:
                self.sim.start(seed)
                self._start_policy(seed, [1 - seed], attempted=True)
                self.started.append(seed)


class DisjointSeeds(TwoSeeds):
    """Even members join through seed 0 only, odd ones through seed 1: the start
    storm's split, made certain."""

    def bootstrap_of(self, node: int) -> list[int]:
        return [node % 2]


def disjoint_run(retries: int) -> _Run:
    run = DisjointSeeds(
        scenario(members=20, duration=1.0, formation={"window": 1.0, "timeout": 60.0}), None
    )
    run.rejoin_config = attrs.evolve(run.rejoin_config, bootstrap_retry_max=retries)
    return run


def test_two_seeds_with_disjoint_joiners_end_as_one_mesh() -> None:
    """A joined member that does not hold a bootstrap peer joins it once more
    (`RejoinPolicy.bootstrap_targets`): one exchange bridges the halves."""
    run = disjoint_run(RejoinConfig().bootstrap_retry_max)
    result = run.run()
    assert result.ok, result.failure
    assert result.formation_seconds is not None and result.formation_seconds < 15.0
    retries = sum(p.bootstrap_retries for p in run.policies.values())
    assert 1 <= retries <= 20  # a few members asked, not one per member per check


def test_without_bootstrap_retries_the_disjoint_halves_never_meet() -> None:
    """The control: the same start with the retries off forms two meshes."""
    run = disjoint_run(0)
    result = run.run()
    assert not result.ok and result.failure is not None and "formation" in result.failure
    assert not run.metrics.holds(0, 1) and not run.metrics.holds(1, 0)


def storm(first_join_max: int, seed: int, retries: int = 4) -> tuple[RunResult, int]:
    """100 members started within 30 s through the same two seeds; returns the run and
    the state exchanges the two seeds received."""
    run = TwoSeeds(
        scenario(
            members=100, duration=1.0, seed=seed, formation={"window": 30.0, "timeout": 120.0}
        ),
        None,
    )
    run.rejoin_config = attrs.evolve(
        run.rejoin_config, first_join_max=first_join_max, bootstrap_retry_max=retries
    )
    result = run.run()
    cores = [run.sim.cores[seed_node] for seed_node in (0, 1)]
    exchanges = sum(c.statistics().push_pulls_received for c in cores if isinstance(c, Membership))
    return result, exchanges


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_storm_of_100_through_two_seeds_joining_one_each_forms_one_mesh(seed: int) -> None:
    """The start's join to one seed, a random one (`first_join_max` = 1), halves what
    the seeds carry, and the bootstrap retries keep the two halves one mesh."""
    spread, at_seeds = storm(1, seed)
    assert spread.ok, spread.failure
    assert spread.formation_seconds is not None and spread.formation_seconds < 40.0
    both, at_seeds_both = storm(2, seed)
    assert both.ok, both.failure
    assert at_seeds < 0.75 * at_seeds_both, (at_seeds, at_seeds_both)


def test_a_storm_joining_one_seed_each_without_bootstrap_retries_splits() -> None:
    """The control, as measured with 100 daemons (52 + 46): the halves never meet."""
    split, _ = storm(1, seed=1, retries=0)
    assert not split.ok and split.failure is not None and "formation" in split.failure


#: The daemon's swim packet budget: 1,350 bytes less its envelope with the
#: certificate and the cluster secret's box (`populi_p2p.services.node_parts`).
DAEMON_BUDGET = 1060
#: A signed record without GPUs (`docs/security.md`: 336 bytes), the meta every alive
#: rumor carries.
RECORD_BYTES = 340


class RecordStorm(TwoSeeds):
    """The start storm as the daemons ran it: every member publishes a signed-record
    sized meta as it starts, and `held` notes when each member first holds each other
    one alive."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.up: dict[int, float] = {}
        self.held: dict[tuple[int, int], float] = {}
        self.sim.add_observer(self)

    def _start(self, node: int) -> None:
        super()._start(node)
        for started in (0, 1) if node < 2 else (node,):
            if started not in self.up:
                self.up[started] = self.sim.now
                self.sim.set_meta(started, bytes([started]) * RECORD_BYTES)

    def on_event(self, now: float, node: int, event: Any) -> None:
        super().on_event(now, node, event)
        if event.__class__ in (MemberJoined, MemberRecovered):
            subject = self.sim.index_of(event.member.name)
            if subject is not None:
                self.held.setdefault((node, subject), now)

    def lags(self) -> list[float]:
        """For each (observer, subject): how long after both were up it held the other."""
        up = self.up
        return sorted(t - max(up[o], up[s]) for (o, s), t in self.held.items() if o != s)


def record_storm(
    seed: int, *, at_once: bool, lean: bool = True, join_sync_delay: float | None = None
) -> tuple[RunResult, RecordStorm]:
    """100 members started within 5 s through two seeds, one seed per start; `lean`
    False gossips every alive rumor with its record, as before `AliveRef`;
    `join_sync_delay` 0 turns the catch-up exchange after a join off."""
    swim: dict[str, Any] = {"packet_budget": DAEMON_BUDGET}
    if join_sync_delay is not None:
        swim["join_sync_delay"] = join_sync_delay
    if not lean:
        swim["lean_alive_meta_min"] = SwimConfig().meta_size_max
    run = RecordStorm(
        scenario(
            members=100,
            duration=1.0,
            seed=seed,
            swim=swim,
            formation={"window": 5.0, "timeout": 120.0},
        ),
        None,
    )
    run.rejoin_config = attrs.evolve(run.rejoin_config, bootstrap_after_first_join=at_once)
    return run.run(), run


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_record_storm_converges_within_a_second_of_the_last_start(seed: int) -> None:
    """The seeds do not know each other yet when the first joiners reach them: each
    joiner whose answer lacks the other seed joins it at once, so no second mesh
    grows, and every member holds every other one alive within 1 s of both being up.
    The seeds still carry about one state exchange per joiner, not two."""
    result, run = record_storm(seed, at_once=True)
    assert result.ok, result.failure
    last = max(run.up.values())
    assert result.formation_seconds is not None and result.formation_seconds - last < 2.0
    lags = run.lags()
    assert len(lags) == 100 * 99 and lags[-1] < 2.0, lags[-5:]
    cores = [run.sim.cores[s] for s in (0, 1)]
    at_seeds = sum(c.statistics().push_pulls_received for c in cores if isinstance(c, Membership))
    assert at_seeds < 130, at_seeds


def test_a_record_storm_checking_a_check_interval_after_the_join_converges_late() -> None:
    """The control, as the daemons behaved (+22 to +26 s): two meshes grow around the
    seeds for a check interval, and merging them takes one 340-byte alive rumor per
    member across the cut, three to a packet: some pairs wait for a push-pull.

    How late depends on the seed (seeds 1 to 12: from 1 to 19 s after the last start);
    seed 3 is one where the two meshes grow apart. (Seed 1 was until pulls from an
    address the answerer cannot tie to the requester were cut to the request's size,
    issue 18: that changed the run, not the spread across seeds. Seed 3 took 59 s until
    a pull to a member's own address went bare, split into datagrams within the
    packet budget, issue 18 again: its retries now arrive, and it takes 13 s.)"""
    result, run = record_storm(3, at_once=False, join_sync_delay=0.0)
    assert result.ok, result.failure
    last = max(run.up.values())
    assert result.formation_seconds is not None and result.formation_seconds - last > 10.0
    assert run.lags()[-1] > 10.0


def test_the_catch_up_exchange_after_a_join_repairs_the_late_check_within_seconds() -> None:
    """The control's run with the catch-up exchange `join_sync_delay` (2 s) after each
    join's answer: a joiner that saw one half catches up with a random member, most
    often of the other half, so no pair waits for the periodic push-pull."""
    result, run = record_storm(3, at_once=False)
    assert result.ok, result.failure
    last = max(run.up.values())
    assert result.formation_seconds is not None and result.formation_seconds - last < 4.0
    assert run.lags()[-1] < 6.0  # 5.05 s: one pair, against 13 s and more without


def test_a_record_storm_gossips_a_quarter_of_the_bytes_with_lean_alive_rumors() -> None:
    """Alive rumors carry the record's digest, and each member pulls each record once:
    measured 7.5 MB of datagrams against 29 MB with the record in every rumor (seeds
    1 to 5), converging as fast."""
    sent = {}
    for lean in (True, False):
        result, run = record_storm(2, at_once=True, lean=lean)
        assert result.ok, result.failure
        assert run.lags()[-1] < 2.0
        cores = [c for c in run.sim.cores if isinstance(c, Membership)]
        stats = [c.statistics() for c in cores]
        sent[lean] = sum(s.bytes_sent for s in stats)
        assert (sum(s.pulls_completed for s in stats) > 0) is lean
    assert sent[True] < 0.4 * sent[False], sent
