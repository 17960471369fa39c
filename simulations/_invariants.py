"""Safety checks run at every step of a simulation (the VOPR's safety phase).

The membership core promises that incarnations only go up: a node's own incarnation
never decreases, a restarted node comes back above its previous life, and no node ever
sees another's incarnation go down (that would let a stale rumor override a refute).
`IncarnationCheck` checks all three on every core call and every event, and raises
`InvariantViolation` naming the time and the nodes; the runner turns that into a
"reproduce with --seed N" line.

Later subsystems (the lease table) add their own checks by implementing the engine's
`Invariant` protocol and registering with `Simulator.add_invariant`.
"""

from __future__ import annotations

from swim import Event, SelfRefuted

from ._engine import Core, InvariantViolation, NodeStatus, Simulator

__all__ = ["IncarnationCheck"]


class IncarnationCheck:
    """Incarnations never go down, as seen by the node itself or by anyone else."""

    def __init__(self, sim: Simulator) -> None:
        self._sim = sim
        self._index_of = sim.name_index.get  # `index_of` without a call per event
        self._seen: dict[int, dict[int, int]] = {}
        self._own: dict[int, int] = {}
        self._previous_life: dict[int, int] = {}
        self.checks = 0

    def _fail(self, now: float, message: str) -> None:
        raise InvariantViolation(f"t={now:.6f}s: {message}")

    def on_event(self, now: float, node: int, event: Event) -> None:
        self.checks += 1
        if event.__class__ is SelfRefuted:
            own = self._own.get(node, -1)
            if event.incarnation <= own:
                name = self._sim.names[node]
                self._fail(now, f"{name} refuted with incarnation {event.incarnation} <= {own}")
            self._own[node] = event.incarnation
            return
        member = getattr(event, "member", None)
        if member is None:
            return
        subject = self._index_of(member.name)
        if subject is None:
            return
        seen = self._seen.get(node)
        if seen is None:
            seen = self._seen[node] = {}
        before = seen.get(subject)
        if before is not None and member.incarnation < before:
            self._fail(
                now,
                f"{self._sim.names[node]} saw {member.name}'s incarnation go down from "
                f"{before} to {member.incarnation} ({type(event).__name__})",
            )
        seen[subject] = member.incarnation

    def on_status(self, now: float, node: int, old: NodeStatus, new: NodeStatus) -> None:
        if new == NodeStatus.DOWN:
            self._previous_life[node] = max(
                self._own.get(node, -1), self._previous_life.get(node, -1)
            )
        if old == NodeStatus.DOWN and new != NodeStatus.DOWN:
            # A fresh core: it knows nobody yet, so its history starts over.
            self._seen.pop(node, None)
            start = self._sim.start_incarnation(node)
            previous = self._previous_life.get(node, -1)
            if start <= previous:
                self._fail(
                    now,
                    f"{self._sim.names[node]} restarted with incarnation {start}, "
                    f"not above its previous life's {previous}",
                )
            self._own[node] = start

    def after_step(self, now: float, node: int, core: Core) -> None:
        self.checks += 1
        incarnation = core.incarnation
        own = self._own.get(node, -1)
        if incarnation != own:
            if incarnation < own:
                name = self._sim.names[node]
                self._fail(now, f"{name}'s own incarnation went down from {own} to {incarnation}")
            self._own[node] = incarnation
