"""The core's internal consistency, asserted after every call in tests and simulation.

A layer of `Membership` (see `swim._membership`); O(n), so off in the daemon.
"""

from __future__ import annotations

from ._records import _ALIVE, _LEFT, _SUSPECT, _ViewCache
from ._timers import _Timers
from .wire import encode_member_entry, encode_packet, encode_sync


class _Invariants(_Timers):
    """`_check_invariants`, in three parts: the records, the view's cache, the rest."""

    def _check_invariants(self) -> None:
        """Assert the core's internal consistency (O(n): tests and simulation only).

        Raises:
            AssertionError: a bug in this core, never bad input.
        """
        self._check_records()
        self._check_view()
        self._check_bounds()

    def _require(self, condition: bool, what: str) -> None:
        if not condition:
            raise AssertionError(f"swim invariant violated on {self._name!r}: {what}")

    def _check_records(self) -> None:
        """Every record filed, counted, sampled and encoded as it should be."""
        require = self._require
        counts = [0, 0, 0, 0]
        in_list = set(self._names)
        for name, node in self._members.items():
            require(node.name == name, f"member {name!r} filed under another name")
            counts[node.state] += 1
            require(
                (node.suspicion is not None) == (node.state is _SUSPECT),
                f"{name!r} suspicion timer does not match state {node.state.name}",
            )
            require(node.incarnation >= 0, f"{name!r} has a negative incarnation")
            fresh = encode_member_entry(
                (node.name, node.address, node.incarnation, node.state, node.meta)
            )
            require(node.entry in (None, fresh), f"{name!r} has a stale push-pull entry")
            require(name in in_list, f"{name!r} missing from the sampling list")
            require(not node.suspicion or not node.shared, f"{name!r} shared yet suspected")
        require(counts == self._counts, f"state counts {self._counts} != actual {counts}")
        require(
            all(name in self._members and rtt >= 0.0 for name, rtt in self._rtt.items()),
            "an RTT is kept for a member we do not hold, or is negative",
        )
        require(self._members.get(self._name) is self._self, "our own entry is missing")

    def _check_view(self) -> None:
        """The cached digests and openings are what a fresh build would give."""
        require = self._require
        view = self._view
        me = self._self
        if view is None:
            return
        fresh_view = _ViewCache(self._members, self._self)
        require(view.stale_against(fresh_view) is None, "the cached sync digest is stale")
        for (join, app_digest), payload in view.openings.items():
            fresh_opening = encode_packet(
                [
                    encode_sync(
                        0,
                        join,
                        self._name,
                        self._address,
                        fresh_view.digest(),
                        [
                            encode_member_entry(
                                (me.name, me.address, me.incarnation, me.state, me.meta)
                            )
                        ],
                        (),
                        app_digest,
                        b"",
                    )
                ]
            )
            require(payload == fresh_opening, "a cached sync opening is stale")

    def _check_bounds(self) -> None:
        """Our own state, the queues and tables within their bounds, gossip awake."""
        require = self._require
        require(
            self._self.state is (_LEFT if self._left else _ALIVE),
            f"our own state is {self._self.state.name}",
        )
        require(len(self._relays) <= self._config.indirect_pending_max, "too many relays")
        require(len(self._pulls) <= self._config.pull_pending_max, "too many pulls")
        require(not self._pull_batch, "pulls gathered but not sent")
        require(self._name not in self._pulls, "pulling our own record")
        require(len(self._broadcasts) <= self._config.broadcast_queue_max, "queue over bound")
        score = self._awareness.score
        require(0 <= score < self._config.awareness_max_multiplier, "awareness out of range")
        require(self._config.awareness_enabled or score == 0, "awareness moved while disabled")
        probe = self._probe
        if probe is not None:
            require(probe.timeout_at <= probe.round_end, "probe timeout after its round end")
            require(probe.nacks_received <= probe.nacks_expected, "more nacks than asked for")
        require(
            len(self._app_broadcasts) <= self._config.app_broadcast_queue_max,
            "application queue over bound",
        )
        queued = len(self._broadcasts) + len(self._app_broadcasts)
        if queued and self._gossip_at is None and not self._left:
            require(
                not any(
                    node is not self._self and node.state is not _LEFT
                    for node in self._members.values()
                ),
                "updates queued, gossip targets exist, but gossip is idle",
            )
