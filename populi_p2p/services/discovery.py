"""The discovery service: joining, re-joining after a partition, and mDNS on the LAN.

Events in: membership events (its own subscription: which members failed, and when
somebody joined) and mDNS discoveries. Commands out: ``membership.join(seeds)``. The
retry schedule is the `Bootstrapper`'s; this service only says whom to try and whether
a join is needed. It also says, in the log and in `status`, when joining fails and
for how long the node has been alone (`warnings`).
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Sequence
from typing import Final

import trio

from overlay.base import Address, format_address
from overlay.bootstrap import Backoff, Bootstrapper, BootstrapStatistics
from swim import Event, MemberFailed, MemberJoined, MemberLeft, MemberRecovered, MemberState

from .._log import event, get_logger
from .membership import MembershipService
from .reachability import PeerReachability

__all__ = ["ALONE_WARNING_AFTER", "JOIN_CANDIDATES_MAX", "RECONNECT_TIMEOUT", "Discovery"]

#: A node alone this long, seconds, while it has bootstrap peers says so in `status`.
ALONE_WARNING_AFTER: Final = 30.0

#: Remembered failed members are retried for this long, seconds (a day, as Serf does).
RECONNECT_TIMEOUT: Final = 24 * 3600.0
#: At most this many addresses are tried per join attempt.
JOIN_CANDIDATES_MAX: Final = 8
_LIVE: Final = (MemberState.ALIVE, MemberState.SUSPECT)

_log = get_logger("node")


class Discovery:
    """Whom to join, and when.

    Args:
        membership: the core's commands and queries.
        advertise: our own address (never a candidate).
        bootstrap: `--bootstrap` peers and the overlay's online peers.
        remembered: addresses of members remembered from earlier runs (the store).
        probe_interval: the swim probe interval (join waits and check interval).
        clock: realtime, for `RECONNECT_TIMEOUT`.
        reachability: the addresses that failed and why (the driver's sends).
        monotonic: the clock of "alone since" (``trio.current_time``).
    """

    def __init__(
        self,
        membership: MembershipService,
        advertise: Address,
        *,
        bootstrap: Sequence[str | Address],
        remembered: Callable[[], list[Address]],
        probe_interval: float,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        reachability: PeerReachability | None = None,
        monotonic: Callable[[], float] = trio.current_time,
    ) -> None:
        self._membership = membership
        self.reachability = (
            reachability if reachability is not None else PeerReachability(monotonic)
        )
        self._monotonic = monotonic
        #: Since when (monotonic) we have seen no other live member; None while joined.
        self._alone_since: float | None = monotonic()
        #: The last join failure logged (logged again only when it reads otherwise).
        self._join_failure: str | None = None
        self._advertise = advertise
        self._remembered = remembered
        self._probe_interval = probe_interval
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._failed_at: dict[str, tuple[Address, float]] = {}
        self._mdns_peers: dict[str, tuple[Address, ...]] = {}
        self._joined = trio.Event()
        #: The shared join policy; its `first_targets` narrows this run's first join.
        self._policy = Backoff(jitter=0.2, rng=random.Random()).policy(max(1.0, 5 * probe_interval))
        self.bootstrapper = Bootstrapper(
            self._try_join,
            bootstrap=bootstrap,
            known_members=self._known_addresses,
            needs_join=self._needs_join,
            alone=lambda: self._membership.num_alive() <= 1,
            holds=self._holds,
            policy=self._policy,
        )

    def on_event(self, ev: Event) -> None:
        if not isinstance(ev, MemberJoined | MemberRecovered | MemberFailed | MemberLeft):
            return
        member = ev.member
        if member.name == self._membership.node_id:
            return
        if isinstance(ev, MemberJoined):
            self._joined.set()
        elif isinstance(ev, MemberRecovered):
            self._failed_at.pop(member.name, None)
            self._joined.set()
        elif isinstance(ev, MemberFailed):
            self._failed_at[member.name] = (member.address, self._clock())
        else:
            self._failed_at.pop(member.name, None)

    def found_on_lan(self, node_id: str, addresses: tuple[Address, ...]) -> None:
        """An mDNS discovery: an address to try (admission still needs a certificate)."""
        if len(self._mdns_peers) >= JOIN_CANDIDATES_MAX * 8:
            self._mdns_peers.pop(next(iter(self._mdns_peers)))
        self._mdns_peers[node_id] = addresses
        known = self._membership.member(node_id)
        if known is None or known.state not in _LIVE:
            event(_log, 20, "mdns.found", id=node_id,
                  addr=",".join(format_address(a) for a in addresses))  # fmt: skip
            self.bootstrapper.poke()

    async def run(
        self,
        events: trio.MemoryReceiveChannel[Event],
        *,
        after: trio.Event | None = None,
        wait_max: float = 0.0,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Join, then follow the membership. With `after`, joining waits for that event
        first, at most `wait_max` seconds (the node's first GPU report: the record the
        mesh first hears carries the GPUs; a wedged driver must not hold us out)."""
        if after is not None:
            with trio.move_on_after(wait_max):
                await after.wait()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.bootstrapper.run)
            task_status.started()
            async for ev in events:
                self.on_event(ev)

    def statistics(self) -> BootstrapStatistics:
        return self.bootstrapper.statistics()

    def describe(self, address: Address) -> str | None:
        """What `address` is to us, for warnings: a member's name and state, or a
        bootstrap peer."""
        for m in self._membership.members():
            if m.address == address:
                return f"member {m.name[:12]}, {m.state.name.lower()}"
        if address in self.bootstrapper.resolved or address in self.bootstrapper.bootstrap:
            return "bootstrap peer"
        return None

    def warnings(self) -> list[str]:
        """For `status`: being alone while there are bootstrap peers, and each address
        that failed lately, with its reason."""
        out = []
        alone_for = self._alone_for()
        peers = self.bootstrapper.bootstrap
        if peers and alone_for is not None and alone_for >= ALONE_WARNING_AFTER:
            shown = ", ".join(format_address(p) for p in peers[:5])
            last = self._join_failure or self.bootstrapper.statistics().last_error
            out.append(
                f"alone for {alone_for:.0f} s: no bootstrap peer ({shown}) let this node"
                f" join{f' (last: {last})' if last else ''}; check that a member runs"
                " there, the port, the firewall and that both hold the same authority.pub"
            )
        return out + self.reachability.warnings()

    def _alone_for(self) -> float | None:
        """Seconds we have been alone (None: we are not), updating "alone since"."""
        now = self._monotonic()
        if self._membership.num_alive() > 1 or self._membership.has_left:
            self._alone_since = None
            return None
        if self._alone_since is None:
            self._alone_since = now
        return now - self._alone_since

    ####################################################################################
    # The bootstrapper's questions

    def _needs_join(self) -> bool:
        membership = self._membership
        if membership.has_left:
            return False
        if membership.num_alive() <= 1:
            return True
        if any(membership.member(nid) is None for nid in self._mdns_peers):
            return True  # found on the LAN, not yet in the mesh
        # Members we saw fail may be on the other side of a healed partition.
        return any(
            (m := membership.member(node_id)) is None or m.state in (MemberState.DEAD,)
            for node_id in self._failed_at
        )

    def _holds(self, address: Address) -> bool:
        """We are at `address`, or hold a live member there (a bootstrap peer that needs
        no join)."""
        if address == self._advertise:
            return True
        return any(m.address == address and m.state in _LIVE for m in self._membership.members())

    def _known_addresses(self) -> list[Address]:
        now = self._clock()
        for node_id, (_, at) in list(self._failed_at.items()):
            if now - at > RECONNECT_TIMEOUT:
                del self._failed_at[node_id]
        membership = self._membership
        alive = {m.name for m in membership.members() if m.state in _LIVE}
        out = [addr for nid, (addr, _) in self._failed_at.items() if nid not in alive]
        for nid, addresses in self._mdns_peers.items():
            if nid not in alive:
                out.extend(addresses[:1])
        if membership.num_alive() <= 1:
            out += self._remembered()
        deduped = list(dict.fromkeys(a for a in out if a != self._advertise))
        self._rng.shuffle(deduped)
        return deduped[:JOIN_CANDIDATES_MAX]

    async def _try_join(self, candidates: Sequence[Address]) -> bool:
        membership = self._membership
        seeds = [c for c in candidates if c != self._advertise][: JOIN_CANDIDATES_MAX * 2]
        if not seeds:
            return membership.num_alive() > 1
        # The start's join goes to one candidate, a random one: 100 daemons started at
        # once through the same two seeds otherwise give each seed a state exchange per
        # joiner. A retry (no answer within the wait) tries them all.
        seeds = self._policy.first_targets(seeds)
        event(_log, 10, "join.attempt", seeds=",".join(format_address(s) for s in seeds))
        self._joined = trio.Event()
        await membership.join(seeds)
        # Wait as long as a check interval for the answer: a seed starved by a start
        # storm answers late, and a retry sooner only adds another state exchange to
        # its queue (measured: 2.4 push-pulls per joiner at the seeds of 100 with 2 s).
        wait = max(1.0, 5 * self._probe_interval)
        with trio.move_on_after(wait):
            while membership.num_alive() <= 1:
                await self._joined.wait()
                self._joined = trio.Event()
        joined = membership.num_alive() > 1
        self._alone_for()
        if joined:
            self._join_failure = None
        elif membership.num_alive() <= 1:  # a member retrying dead ones: peer.unreachable
            async with trio.open_nursery() as nursery:  # why: UDP fails in silence
                for seed in sorted(seeds)[:5]:
                    nursery.start_soon(functools.partial(
                        self.reachability.diagnose, seed, waited=wait
                    ))  # fmt: skip
            self._log_join_failure(seeds, wait)
        return joined

    def _log_join_failure(self, seeds: Sequence[Address], wait: float) -> None:
        """One warning per failure streak (again when its reasons change): each seed
        with why it failed, the transport's reason or no answer in time."""
        reasons = ", ".join(
            f"{format_address(s)}: {self.reachability.reason(s) or f'no answer in {wait:g} s'}"
            for s in sorted(seeds)[:5]
        )
        if reasons != self._join_failure:
            self._join_failure = reasons
            event(_log, 30, "join.failed", reasons=reasons,
                  retry="with backoff, up to every 60 s")  # fmt: skip
