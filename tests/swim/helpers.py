"""An h11-style harness: N real `Membership` cores wired through an in-memory network.

`Cluster` owns a manual clock and a heap of in-flight packets. It delivers each `Send`
after a latency (with optional loss, duplication, reordering jitter and blocked links),
calls `tick` exactly at each core's `next_deadline()`, and records every event, so tests
can assert exact outcomes without sockets, threads or sleeps.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from swim import (
    Address,
    Event,
    Member,
    MemberFailed,
    Membership,
    MemberState,
    Output,
    Send,
    SwimConfig,
)
from swim.wire import encode

_DELIVER = 0
_FAILED = 1

#: A lean config for tests: LAN timings with invariant checks on.
TEST_CONFIG = attrs.evolve(SwimConfig.lan(), check_invariants=True)


def _subject_of(event: Event) -> str | None:
    member = getattr(event, "member", None)
    return None if member is None else str(member.name)


def address_of(index: int) -> Address:
    return (f"10.0.0.{index}", 7946)


@attrs.define
class Network:
    """Fault knobs of the in-memory network; change them at any time."""

    latency: float = 0.002
    #: Extra uniform random delay, which reorders packets.
    jitter: float = 0.0
    #: Probability a datagram is lost (reliable sends are never lost, only blocked).
    loss: float = 0.0
    #: Probability a datagram is delivered twice.
    duplicate: float = 0.0
    #: (source name, destination name) pairs that cannot talk, datagram or stream.
    blocked: set[tuple[str, str]] = attrs.Factory(set)
    #: Pairs whose datagrams are dropped but whose streams (reliable sends) get through.
    datagram_blocked: set[tuple[str, str]] = attrs.Factory(set)


class Cluster:
    """N cores, a manual clock, an in-memory network and an event log."""

    def __init__(
        self,
        n: int = 0,
        *,
        config: SwimConfig = TEST_CONFIG,
        seed: int = 0,
        network: Network | None = None,
        start: float = 1000.0,
    ) -> None:
        self.config = config
        self.now = start
        self.rng = random.Random(seed)
        self.network = network or Network()
        self.nodes: dict[str, Membership] = {}
        self.by_address: dict[Address, str] = {}
        self.down: set[str] = set()
        #: Names whose packets are held (not delivered) until released: a paused laptop.
        self.paused: set[str] = set()
        self.events: list[tuple[float, str, Event]] = []
        self.sent: list[tuple[float, str, Send]] = []
        self._flight: list[tuple[float, int, int, str, Send, str]] = []
        self._counter = 0
        self._next_index = 1
        #: Called with (node name, event) for every event, after it is logged: the
        #: application side of a test (e.g. re-broadcasting `AppMessage`s).
        self.on_event: Callable[[str, Event], None] | None = None
        for _ in range(n):
            self.add()

    # -- membership -------------------------------------------------------------

    def add(
        self,
        name: str | None = None,
        *,
        config: SwimConfig | None = None,
        incarnation: int = 0,
        meta: bytes = b"",
        address: Address | None = None,
        faults: Any = None,
        app_state: Any = None,
    ) -> Membership:
        index = self._next_index
        self._next_index += 1
        name = name or f"node-{index}"
        address = address or address_of(index)
        core = Membership(
            config or self.config,
            name,
            address,
            random.Random(self.rng.getrandbits(64)),
            self.now,
            meta=meta,
            incarnation=incarnation,
            faults=faults,
            app_state=app_state,
        )
        self.nodes[name] = core
        self.by_address[address] = name
        self.down.discard(name)
        return core

    def join_all(self, seed: str | None = None) -> None:
        """Every node joins through `seed` (default: the first node)."""
        names = list(self.nodes)
        seed = seed or names[0]
        for name in names:
            if name != seed:
                self.join(name, seed)

    def join(self, name: str, seed: str) -> None:
        self.apply(name, self.nodes[name].join([self.nodes[seed].address], self.now))

    def crash(self, name: str) -> None:
        self.down.add(name)

    def partition(self, side_a: Iterable[str], side_b: Iterable[str]) -> None:
        side_b = list(side_b)
        for a in side_a:
            for b in side_b:
                self.network.blocked |= {(a, b), (b, a)}

    def heal(self) -> None:
        self.network.blocked.clear()
        self.network.datagram_blocked.clear()

    def inject(self, name: str, *messages: Any) -> None:
        """Deliver messages to `name` as if from the network, now."""
        self.apply(name, self.nodes[name].receive(("10.9.9.9", 1), encode(*messages), self.now))

    def restart(self, name: str, *, incarnation: int = 0, meta: bytes = b"") -> Membership:
        """A new process with the same name and address (it forgot everything)."""
        old = self.nodes[name]
        core = Membership(
            old.config,
            name,
            old.address,
            random.Random(self.rng.getrandbits(64)),
            self.now,
            meta=meta,
            incarnation=incarnation,
        )
        self.nodes[name] = core
        self.down.discard(name)
        return core

    # -- running ----------------------------------------------------------------

    def apply(self, name: str, outputs: Iterable[Output]) -> None:
        """Route one core's outputs: sends into the network, events into the log."""
        net = self.network
        for output in outputs:
            if isinstance(output, Send):
                self.sent.append((self.now, name, output))
                dest = self.by_address.get(output.destination)
                if dest is None or (name, dest) in net.blocked:
                    if output.reliable:
                        self._push(self.now + net.latency, _FAILED, name, output)
                    continue
                if not output.reliable and (
                    (name, dest) in net.datagram_blocked or self.rng.random() < net.loss
                ):
                    continue
                copies = 2 if not output.reliable and self.rng.random() < net.duplicate else 1
                for _ in range(copies):
                    delay = net.latency + self.rng.random() * net.jitter
                    self._push(self.now + delay, _DELIVER, dest, output, name)
            else:
                self.events.append((self.now, name, output))
                if self.on_event is not None:
                    self.on_event(name, output)

    def _push(self, at: float, kind: int, dest: str, send: Send, source: str = "") -> None:
        self._counter += 1
        heapq.heappush(self._flight, (at, self._counter, kind, dest, send, source))

    def next_time(self) -> float | None:
        best = self._flight[0][0] if self._flight else None
        for name, core in self.nodes.items():
            if name in self.down or name in self.paused:
                continue
            deadline = core.next_deadline()
            if deadline is not None and (best is None or deadline < best):
                best = deadline
        return best

    def step(self, until: float) -> bool:
        """Process everything due at the earliest pending time <= until."""
        at = self.next_time()
        if at is None or at > until:
            return False
        self.now = max(self.now, at)
        while self._flight and self._flight[0][0] <= self.now:
            _, _, kind, dest, send, source = heapq.heappop(self._flight)
            if dest in self.down or dest in self.paused:
                if kind == _DELIVER and send.reliable and source not in self.down:
                    self._push(self.now + self.network.latency, _FAILED, source, send)
                continue
            core = self.nodes[dest]
            if kind == _FAILED:
                self.apply(dest, core.send_failed(send.destination, send.payload, self.now))
            else:
                source_address = self.nodes[source].address
                self.apply(
                    dest,
                    core.receive(source_address, send.payload, self.now, reliable=send.reliable),
                )
        for name, core in list(self.nodes.items()):
            if name in self.down or name in self.paused:
                continue
            deadline = core.next_deadline()
            if deadline is not None and deadline <= self.now:
                self.apply(name, core.tick(self.now))
        return True

    def run(self, duration: float) -> None:
        self.run_until(self.now + duration)

    def run_until(self, until: float) -> None:
        while self.step(until):
            pass
        self.now = max(self.now, until)

    # -- observations -------------------------------------------------------------

    def live(self) -> list[str]:
        return [name for name in self.nodes if name not in self.down]

    def view(self, name: str) -> dict[str, MemberState]:
        return {m.name: m.state for m in self.nodes[name].members()}

    def states(self, observer: str, subject: str) -> MemberState | None:
        member = self.nodes[observer].member(subject)
        return None if member is None else member.state

    def member(self, observer: str, subject: str) -> Member | None:
        return self.nodes[observer].member(subject)

    def everyone_sees(self, subject: str, state: MemberState) -> bool:
        return all(
            self.states(observer, subject) is state
            for observer in self.live()
            if observer != subject
        )

    def converged(self) -> bool:
        """Every live node sees every live node alive and every down node not alive."""
        live = self.live()
        for observer in live:
            view = self.view(observer)
            for name in self.nodes:
                state = view.get(name)
                if name in self.down:
                    if state in (MemberState.ALIVE, MemberState.SUSPECT):
                        return False
                elif state is not MemberState.ALIVE:
                    return False
        return True

    def events_of(self, kind: type[Any], subject: str | None = None) -> list[tuple[float, str]]:
        return [
            (at, observer)
            for at, observer, event in self.events
            if isinstance(event, kind)
            and (
                subject is None or getattr(getattr(event, "member", None), "name", None) == subject
            )
        ]

    def failures_of(self, subject: str) -> list[tuple[float, str]]:
        return self.events_of(MemberFailed, subject)
