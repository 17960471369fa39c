"""`LeaseConfig`: every knob of the lease table, the lease agent and placement, with presets.

One frozen attrs class like `swim.SwimConfig`. Durations are seconds as float, measured
on each node's own monotonic clock (leases never compare clocks across nodes).
"""

from __future__ import annotations

from typing import Any

import attrs


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"LeaseConfig.{attribute.name} must be > 0, got {value!r}")


def _non_negative(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value >= 0:
        raise ValueError(f"LeaseConfig.{attribute.name} must be >= 0, got {value!r}")


@attrs.frozen
class LeaseConfig:
    """Configuration of one `LeaseTable`, its `LeaseAgent` and placement.

    The defaults are the LAN preset; use `.lan()`, `.wan()`, `.local()` and
    `attrs.evolve` for single fields.
    """

    #: The owner bumps its renewal counter this often. Each renewal is one small delta
    #: (~100 bytes) gossiped to everyone, so shorter costs bytes, longer detects later.
    lease_renew_interval: float = attrs.field(default=2.0, validator=_positive)
    #: Once a round renewed every lease of an owner with a majority, its next round
    #: comes this long after that one instead (`lease_renew_interval` again after a
    #: round that missed one). Longer sends fewer bytes in steady state, but an owner
    #: stalled for `lease_ttl - fence_grace - lease_renew_steady` fences its tasks. At
    #: least `lease_renew_interval`, and with it and `fence_grace` within `lease_ttl`,
    #: so a missed steady round is tried again before the owner's fence.
    lease_renew_steady: float = attrs.field(default=4.0, validator=_positive)
    #: An observer that has seen no renewal for this long, on its own clock, re-places the
    #: task at the next epoch. Must cover a few renewals plus gossip spread time, or a
    #: slow-but-alive owner is replaced (a duplicate start, never a duplicate result).
    lease_ttl: float = attrs.field(default=10.0, validator=_positive)
    #: A claimant waits this long (about one gossip round to everyone) before starting,
    #: so a competing claim for the same epoch can reach it. Shorter starts sooner and
    #: risks more duplicate starts.
    settle_time: float = attrs.field(default=0.6, validator=_non_negative)
    #: A node sees its own lease endings (the capacity a finished task frees, its new
    #: reliability evidence) in its placement view only this long after making them.
    #: The others learn them a gossip spread later; a node that saw itself better than
    #: the others see it would claim alongside the node they rank first (two claims of
    #: one epoch). About the spread time of a delta to everyone, with margin.
    self_view_lag: float = attrs.field(default=1.0, validator=_non_negative)
    #: Ticks of the table further apart than this mean its driver was starved (its
    #: process did not run): deltas may be waiting unread in its socket. Such a tick
    #: expires no lease, and nothing expires or starts before `settle_time` after it
    #: (`TableStalled`). The driver must tick at least twice as often (`next_deadline`
    #: asks for it while a lease is live).
    tick_gap_max: float = attrs.field(default=2.0, validator=_positive)
    #: Finished entries (succeeded, cancelled, out of retries) are kept this long after a
    #: replica first saw them finished, for `explain` and reliability, then compacted.
    finished_retention: float = attrs.field(default=3600.0, validator=_positive)
    #: Compacted ids are remembered this long so a late delta cannot resurrect them. Must
    #: exceed `finished_retention` plus the spread of compaction times across replicas.
    tombstone_retention: float = attrs.field(default=7200.0, validator=_positive)
    #: At most this many tombstones (oldest dropped first): bounds memory under floods.
    tombstones_max: int = attrs.field(default=200_000, validator=_positive)
    #: Placement scores at most this many feasible candidates (a seeded random sample
    #: beyond that, as Nomad does); bigger is a better choice, linearly slower.
    placement_sample_max: int = attrs.field(default=256, validator=_positive)
    #: Fraction of each resource kept free when checking fit (0.1 = 10 % headroom).
    headroom_fraction: float = attrs.field(default=0.1, validator=_non_negative)
    #: Reliability evidence loses half its weight after this long (Beta decay).
    reliability_half_life: float = attrs.field(default=86400.0, validator=_positive)
    #: Beta prior (successes, losses): the mean a new node starts at is s/(s+l), low.
    reliability_prior_successes: float = attrs.field(default=1.0, validator=_positive)
    reliability_prior_losses: float = attrs.field(default=3.0, validator=_positive)
    #: Placement ranks reliability in steps of this size (0: exact). Every node ranks
    #: over its own view, and an owner learns its own result before anyone else, so an
    #: exact value ranks a node that just finished first in its own view alone, and two
    #: nodes claim one epoch. Coarser agrees more often and tells nodes apart less.
    reliability_step: float = attrs.field(default=0.25, validator=_non_negative)
    #: Anti-entropy sizes its digest at about this many entries per bucket (256..65536
    #: buckets): fewer per bucket is a bigger digest but a smaller summary.
    anti_entropy_entries_per_bucket: int = attrs.field(default=4, validator=_positive)
    #: At most this many entries in one anti-entropy message (~250 bytes each); the
    #: rest follows in the next exchange, since their buckets still differ.
    anti_entropy_entries_max: int = attrs.field(default=20_000, validator=_positive)
    #: Members that grant each task's epochs (its replica set, named in its spec): an
    #: epoch needs a majority of them, so 3 survive one failure and 5 two. A mesh with
    #: fewer members uses all of them (docs/leases.md, "Small meshes"). 5, since the set
    #: does not move: a task submitted just before two machines go away still runs.
    replica_count: int = attrs.field(default=5, validator=_positive)
    #: A granter waits `lease_ttl * clock_margin` on its own clock after the owner's last
    #: renewal before it grants the next epoch; the owner stops its task by `lease_ttl`
    #: on its clock. The margin covers clocks that run at different rates (1.25: up to
    #: 20 % apart) and the delivery of the last renewal.
    clock_margin: float = attrs.field(default=1.25, validator=_positive)
    #: An owner that cannot renew sends SIGTERM this long before its lease runs out and
    #: SIGKILL at the deadline (the executor enforces it outside the daemon's loop).
    fence_grace: float = attrs.field(default=2.0, validator=_positive)
    #: A replica waits this long for the accepting node to grant the first epoch before
    #: it proposes one itself (the accepting node may have died right after `submit`).
    first_grant_wait: float = attrs.field(default=4.0, validator=_positive)

    @property
    def grant_take_up(self) -> float:
        """How long a granter holds a grant its owner has not renewed yet before it
        grants the next epoch: two renewal intervals, for the proposer's `Own` and the
        owner's first round. Without it a second proposer preempted every fresh grant,
        and under load no owner started (grants.GrantRecord.live)."""
        return 2 * self.lease_renew_interval

    def __attrs_post_init__(self) -> None:
        if self.lease_ttl < 2 * self.lease_renew_interval:
            raise ValueError("LeaseConfig.lease_ttl must be >= 2 * lease_renew_interval")
        if not (
            self.lease_renew_interval
            <= self.lease_renew_steady
            <= self.lease_ttl - self.fence_grace - self.lease_renew_interval
        ):
            raise ValueError(
                "LeaseConfig.lease_renew_steady must be in [lease_renew_interval,"
                " lease_ttl - fence_grace - lease_renew_interval]"
            )
        if self.tombstone_retention < self.finished_retention:
            raise ValueError("LeaseConfig.tombstone_retention must be >= finished_retention")
        if self.clock_margin < 1.0:
            raise ValueError("LeaseConfig.clock_margin must be >= 1 (granters wait longer)")
        if self.fence_grace >= self.lease_ttl:
            raise ValueError("LeaseConfig.fence_grace must be shorter than lease_ttl")

    @classmethod
    def lan(cls) -> LeaseConfig:
        """A LAN or a WireGuard mesh in one region (SWIM's lan preset)."""
        return cls()

    @classmethod
    def wan(cls) -> LeaseConfig:
        """Across continents: slower gossip, so longer settle and ttl."""
        return cls(
            lease_renew_interval=5.0,  # gossip spreads in seconds, renew less often
            lease_renew_steady=5.0,  # as often in steady state (30 s ttl: 5 missed rounds)
            lease_ttl=30.0,  # six missed renewals before re-placement
            settle_time=3.0,  # a WAN gossip round is about 0.5 s x log(n) hops
            self_view_lag=5.0,  # a spread to everyone, with margin
            tick_gap_max=5.0,  # ticks come every 2.5 s while leases are live
            fence_grace=5.0,  # the task's own grace on SIGTERM
            first_grant_wait=10.0,
        )

    @classmethod
    def local(cls) -> LeaseConfig:
        """One machine or the simulator: everything fast.

        One machine is often a loaded one (tests, benchmarks: tens of daemons sharing two
        cores), where a daemon can stall for a second or two while others hold the CPU.
        The ttl is sized for that: SWIM's local detection (4 to 6 s) re-places a killed
        owner anyway, so a longer ttl costs crash failover little and only replaces an
        owner that stalled past it.
        """
        return cls(
            lease_renew_interval=0.5,  # loopback costs nothing
            lease_renew_steady=0.5,  # as often in steady state: rides out owner stalls
            lease_ttl=4.0,  # eight renewals: rides out a 3 s stall of owner or observer
            settle_time=0.2,  # one local gossip round
            self_view_lag=2.0,  # 20 starved daemons: ~1 s to spread (leases-starved)
            tick_gap_max=1.5,  # the lease loop ticks every <= 0.75 s while leases live
            finished_retention=60.0,  # tests want compaction to happen soon
            tombstone_retention=120.0,
            fence_grace=1.0,  # SIGTERM 1 s before the lease runs out
            first_grant_wait=2.0,
        )
