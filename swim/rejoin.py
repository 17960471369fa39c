"""`RejoinPolicy`: when a driver (re)joins, and through whom. One policy, two drivers.

SWIM alone never brings two halves of a long partition back together: after
`dead_retention` each side has reaped the other and gossips to nobody across the cut.
memberlist leaves this to its user (Serf's reconnect loop), so populi's daemon and its
simulator each carried a loop of their own, and they differed: the simulator's figures
described the simulator. This is the one loop both use, sans-IO like the core: time is
passed in, jitter comes from an injected `random.Random`.

The policy, memberlist/Serf-flavoured:
- every `check_interval` the driver asks "do I need to join?" (it is alone, or some
  member it saw fail is still not back) and, if so, asks for `targets`;
- the targets are the addresses of the members it saw fail (the other side of a
  partition: at most `failed_max` of them when alone, and only `reconnect_max`, one, a
  random one, while it still has live peers, as Serf's reconnect loop does), then, when
  alone, every address it knows (remembered members, bootstrap peers): deduplicated,
  order kept, at most `targets_max`;
- a node that is joined but does not hold one of its bootstrap peers as a live member
  contacts that peer again (`bootstrap_targets`): at the first check that finds it
  missing, then `check_interval` doubling to `backoff_max`, at most `bootstrap_retry_max`
  times while it stays missing. Two seeds started at once, each joined by its own
  joiners before it could reach the other, otherwise form two meshes that never meet:
  a joined node does not send joins to its bootstrap peers (that would be O(n^2) state
  exchanges per check across the mesh), and nobody on either side has heard of the
  other to probe it;
- the first join of a node's life goes to `first_join_max` (one) of its candidates
  only, picked at random (`first_targets`), so daemons started at once through the
  same seeds share them out; a retry tries them all; once the node's first join has
  taken, the next check is at once (`bootstrap_after_first_join`), so a bootstrap
  peer the answer did not bring is joined before a second mesh can grow around it;
- after a failed attempt it waits `backoff_initial` doubling to `backoff_max`, each
  delay shaved by up to `jitter` at random so a fleet started at once spreads out;
  after a success, or when no join is needed, back to `check_interval`.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable
from typing import Any, TypeVar

import attrs

A = TypeVar("A", bound=Hashable)


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"RejoinConfig.{attribute.name} must be > 0, got {value!r}")


@attrs.frozen
class RejoinConfig:
    """The join and reconnect schedule shared by the daemon and the simulator."""

    #: Seconds between "do I need to join?" checks while joined. The daemon and the
    #: simulator use `for_probe_interval`: max(1, 5 x probe_interval), 5 s on a LAN.
    check_interval: float = attrs.field(default=5.0, validator=_positive)
    #: First delay after a failed attempt, seconds; doubles (`backoff_factor`) per
    #: failure up to `backoff_max`. Short enough to catch a peer that comes up a moment
    #: later, long enough that a fleet restarted at once does not hammer one seed.
    backoff_initial: float = attrs.field(default=1.0, validator=_positive)
    backoff_max: float = attrs.field(default=60.0, validator=_positive)
    backoff_factor: float = attrs.field(default=2.0, validator=_positive)
    #: Fraction of each backoff delay shaved off at random, in [0, 1].
    jitter: float = 0.2
    #: How long a member seen failing stays a reconnect target, seconds (Serf's
    #: reconnect_timeout is 24 h; the daemon's too).
    failed_memory: float = attrs.field(default=24 * 3600.0, validator=_positive)
    #: Most members seen failing that one attempt tries, picked at random among
    #: them (the daemon's JOIN_CANDIDATES_MAX): a node cut off from half of a large
    #: cluster does not send hundreds of joins per check.
    failed_max: int = 8
    #: Most members seen failing that one attempt tries while the node still has live
    #: peers, picked at random. One, as Serf's reconnect: a single state exchange
    #: with the other side heals a partition, and a member falsely declared dead
    #: (100 daemons starting on 2 cores) is the most overloaded one, which every
    #: other member would otherwise hit with a push-pull at every check.
    reconnect_max: int = 1
    #: Most addresses one attempt sends a join to, all sources together.
    targets_max: int = 16
    #: Most joins a joined node sends to one bootstrap peer it does not hold as a live
    #: member, while it stays so (`bootstrap_targets`): the first at the first check
    #: that finds it missing, the next `check_interval` later, each gap doubling up to
    #: `backoff_max` (5, 10, 20 s on a LAN). Usually one is enough: gossip brings the
    #: peer in as soon as any member of either side exchanges state with the other.
    #: Bounded so that a bootstrap peer that is really down costs each node a few
    #: connection attempts, not one per check for ever. 0 switches this off.
    bootstrap_retry_max: int = 4
    #: Most addresses the first join of a node's life goes to, a random choice among
    #: its candidates (`first_targets`); later attempts, after no answer, try them
    #: all. One: 100 daemons started at once through the same two seeds gave each
    #: seed a state exchange per joiner (160-240 each) while the machine was starved,
    #: and the seeds were the members falsely declared dead. Costs one join wait
    #: (max(1, 5 x probe_interval) s) plus one backoff when the one picked is down.
    first_join_max: int = 1
    #: After the first successful join of a node's life, check at once (not a
    #: `check_interval` later) for bootstrap peers its answer did not bring, and join
    #: those now (`bootstrap_targets`). With `first_join_max` = 1, joiners that each
    #: reached one of two seeds that do not yet know each other otherwise build two
    #: meshes for a check interval or more; merging them then takes one alive rumor
    #: per member across the cut, each carrying a signed record of ~340 bytes, and
    #: the simulated storm of 100 through two seeds converged 25-65 s after the last
    #: start instead of under 1 s. Once the seeds know each other, a joiner's answer
    #: holds both and no second join is sent.
    bootstrap_after_first_join: bool = True

    def __attrs_post_init__(self) -> None:
        if self.backoff_initial > self.backoff_max:
            raise ValueError(
                "RejoinConfig.backoff_initial must be <= backoff_max "
                f"({self.backoff_initial!r} > {self.backoff_max!r})"
            )
        if self.backoff_factor < 1:
            raise ValueError(f"RejoinConfig.backoff_factor must be >= 1, got {self.backoff_factor}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"RejoinConfig.jitter must be in [0, 1], got {self.jitter!r}")
        if self.failed_max < 1:
            raise ValueError(f"RejoinConfig.failed_max must be >= 1, got {self.failed_max}")
        if self.reconnect_max < 1:
            raise ValueError(f"RejoinConfig.reconnect_max must be >= 1, got {self.reconnect_max}")
        if self.targets_max < 1:
            raise ValueError(f"RejoinConfig.targets_max must be >= 1, got {self.targets_max}")
        if self.bootstrap_retry_max < 0:
            raise ValueError(
                f"RejoinConfig.bootstrap_retry_max must be >= 0, got {self.bootstrap_retry_max}"
            )
        if self.first_join_max < 1:
            raise ValueError(f"RejoinConfig.first_join_max must be >= 1, got {self.first_join_max}")

    @classmethod
    def for_probe_interval(cls, probe_interval: float, **changes: Any) -> RejoinConfig:
        """The daemon's schedule for a `SwimConfig.probe_interval`: checks every
        max(1, 5 x probe_interval) s, so a WAN node (5 s probes) checks every 25 s."""
        return cls(check_interval=max(1.0, 5.0 * probe_interval), **changes)


class RejoinPolicy:
    """The schedule and the target choice of (re)joins, for one node.

    Drive it like the core: at `next_deadline()`, decide whether a join is needed;
    if so, send a join to `targets(...)` and later report `on_result(now, joined)`;
    if not, call `on_not_needed(now)`. The policy only remembers failures; deciding
    "needed" is the driver's (it knows the core and its own bookkeeping).
    """

    def __init__(self, config: RejoinConfig, rng: random.Random, now: float) -> None:
        """Args:
        config: the schedule.
        rng: the jitter source (seed it for a reproducible run).
        now: the driver's monotonic clock; the first check is due at once.
        """
        self._config = config
        self._rng = rng
        self._deadline = now
        self._delay = config.backoff_initial
        #: Bootstrap peers found missing while joined: (joins sent, next one due at).
        self._missing: dict[Any, tuple[int, float]] = {}
        self.attempts = 0
        self.failures = 0
        #: An attempt of this life has succeeded (`bootstrap_after_first_join`).
        self._joined_once = False
        #: What the last `targets` or `first_targets` returned: the join in flight.
        self._sent: list[Any] = []
        #: `first_targets` has chosen this life's first join.
        self._started = False
        #: Joins sent to bootstrap peers missing from a joined node's view.
        self.bootstrap_retries = 0

    @property
    def config(self) -> RejoinConfig:
        return self._config

    def next_deadline(self) -> float:
        """When the driver should next check whether to join."""
        return self._deadline

    def due(self, now: float) -> bool:
        return now >= self._deadline

    def targets(self, failed: Iterable[A], known: Iterable[A] = (), *, alone: bool) -> list[A]:
        """Whom to send the join to, in order: members seen failing (at most
        `failed_max` when alone, `reconnect_max` otherwise, a random choice when there
        are more), then (when alone) every other known address; deduplicated, at most
        `targets_max`.

        Args:
            failed: addresses of members this node saw fail and has not seen back.
            known: other addresses worth a try when alone: remembered members and
                bootstrap peers.
            alone: the node sees no other live member.
        """
        failed = list(dict.fromkeys(failed))
        most = self._config.failed_max if alone else self._config.reconnect_max
        if len(failed) > most:
            failed = self._rng.sample(failed, most)
        out: dict[A, None] = dict.fromkeys(failed)
        if alone:
            for address in known:
                out.setdefault(address, None)
        self._sent = list(out)[: self._config.targets_max]
        return list(self._sent)

    def bootstrap_targets(self, now: float, missing: Iterable[A]) -> list[A]:
        """Bootstrap peers to contact again now, while the node is joined.

        `missing` is every bootstrap peer the node does not hold as a live (alive or
        suspect) member right now. A peer seen missing for the first time is due at
        once; each one returned counts one try, and its next is due `check_interval`
        later, the gap doubling (`backoff_factor`) up to `backoff_max` with `jitter`;
        after `bootstrap_retry_max` tries it is not returned again until the node has
        held it (it left `missing`) and lost it again. The driver sends the join and
        reports it through `on_result` with the rest of the attempt.
        """
        config = self._config
        missing = list(dict.fromkeys(missing))
        current = set(missing)
        for address in [a for a in self._missing if a not in current]:
            del self._missing[address]  # held again: a later loss starts a fresh budget
        out: list[A] = []
        for address in missing:
            if len(out) == config.targets_max:
                break
            tries, due_at = self._missing.setdefault(address, (0, now))
            if tries >= config.bootstrap_retry_max or now < due_at:
                continue
            gap = min(config.check_interval * config.backoff_factor**tries, config.backoff_max)
            if config.jitter:
                gap *= 1.0 - config.jitter * self._rng.random()
            self._missing[address] = (tries + 1, now + gap)
            out.append(address)
        self.bootstrap_retries += len(out)
        return out

    def first_targets(self, candidates: Iterable[A]) -> list[A]:
        """Whom the start's join goes to: at most `first_join_max` of `candidates`
        (deduplicated), a random choice when there are more, so that a fleet started
        at once through the same seeds spreads its joins over them.

        Only the first call of a life chooses: later ones (a retry after no answer)
        return every candidate, as `targets` does, so a driver can route each join's
        candidates through here without a flag of its own.
        """
        unique = list(dict.fromkeys(candidates))
        most = self._config.first_join_max
        if self._started:
            most = len(unique)
        self._started = True
        if len(unique) > most:
            unique = self._rng.sample(unique, most)
        self._sent = list(unique)
        return unique

    def on_result(self, now: float, joined: bool) -> float:
        """An attempt ended; returns the delay until the next check.

        Success: back to `check_interval` and the backoff starts over (at once
        after the first success, with `bootstrap_after_first_join`). Failure: the
        current backoff delay (with jitter), and the next one grows.
        """
        self.attempts += 1
        config = self._config
        if joined:
            self._delay = config.backoff_initial
            delay = config.check_interval
            if not self._joined_once and config.bootstrap_after_first_join:
                delay = 0.0  # the first join took: look for bootstrap peers it missed
                # ... but not those this join went to: "joined" can mean that gossip
                # reached us before a starved seed's answer did (a 100-daemon storm).
                for address in self._sent:
                    self._missing.setdefault(address, (0, now + config.check_interval))
            self._joined_once = True
        else:
            self.failures += 1
            delay = self._delay
            self._delay = min(self._delay * config.backoff_factor, config.backoff_max)
            if config.jitter:
                delay *= 1.0 - config.jitter * self._rng.random()
        self._deadline = now + delay
        return delay

    def on_not_needed(self, now: float) -> float:
        """A check found nothing to join: reset the backoff, check again later."""
        self._delay = self._config.backoff_initial
        self._deadline = now + self._config.check_interval
        return self._config.check_interval

    def poke(self, now: float) -> None:
        """Check at once (a peer was discovered, say) instead of at the deadline."""
        self._deadline = min(self._deadline, now)


def failed_targets(failed: dict[A, float], now: float, memory: float) -> list[A]:
    """Forget failures older than `memory` (in place); the rest, oldest first.

    The bookkeeping both drivers do for `RejoinPolicy.targets(failed=...)`: `failed`
    maps a member's address to when it was seen failing.
    """
    horizon = now - memory
    for address in [a for a, at in failed.items() if at < horizon]:
        del failed[address]
    return list(failed)
