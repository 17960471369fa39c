"""Gossip rounds and anti-entropy: digest-first sync, and the older full push-pull.

A layer of `Membership` (see `swim._membership`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import filterfalse
from operator import itemgetter

from ._events import Address, Output
from ._math import push_pull_interval_scaled
from ._probing import _Probing
from ._records import _ALIVE, _RUMOR_ALIVE, _RUMOR_LEFT, _RUMOR_SUSPECT, _SUSPECT
from .wire import PACKET_OVERHEAD, PushPull, Sync, encode_packet, encode_push_pull, encode_sync

#: Rank of each state at one incarnation, for deciding which side of a sync is newer.
_STATE_RANK = (0, 1, 2, 2)

_first = itemgetter(0)


class _AntiEntropy(_Probing):
    """Queued updates pushed to random members, and periodic state exchanges."""

    def _gossip(self, now: float, out: list[Output]) -> None:
        """Push queued updates to a few random members (only when there are any)."""
        self._gossip_at = None
        broadcasts = self._broadcasts
        app = self._app_broadcasts
        if not len(broadcasts) and not len(app):
            return
        fanout = self._config.gossip_nodes
        hook = self._faults.gossip_fanout
        if hook is not None:
            fanout = hook(fanout)
        targets = self._random_nodes(fanout, None, gossip=True)
        if not targets:
            # Nobody to tell; a new member arriving queues an update and wakes us.
            return
        n = self.num_alive()
        budget = self._config.packet_budget
        for node in targets:
            parts = broadcasts.get_broadcasts(PACKET_OVERHEAD, budget, n)
            if len(app):
                used = PACKET_OVERHEAD + sum(map(len, parts))
                parts.extend(app.get_broadcasts(used, budget, n))
            if parts:
                self._emit(node.address, encode_packet(parts), False, out)
            oversize = broadcasts.get_oversize(n)
            for payload in oversize:
                self._emit(node.address, encode_packet([payload]), True, out)
            if not parts and not oversize:
                break
        if len(broadcasts) or len(app):
            self._gossip_at = self._gossip_time_after(now, strictly=True)

    def _push_pull(self, now: float, out: list[Output]) -> None:
        if self._left:
            self._push_pull_at = None
            return
        n = self.num_alive()
        self._push_pull_at = now + push_pull_interval_scaled(self._config.push_pull_interval, n)
        # Unlike memberlist, the partner may be a retained dead member: after a
        # partition heals, this is how the two sides find each other again without the
        # driver re-joining (they refute each other's death notices).
        targets = self._random_nodes(1, None, gossip=True)
        if targets:
            self._send_sync_open(targets[0].address, join=False, out=out)

    def _catch_up_after_join(self, now: float) -> None:
        """Our join was answered: open one extra exchange `join_sync_delay` from now.

        Extra, not the next periodic one brought forward: that one comes at a random
        point of the first interval, and a storm through two seeds that do not know
        each other yet relies on it to join the two halves (moving it to the catch-up,
        made while a joiner sees only its half, left them apart 10 s longer)."""
        self._join_sync_pending = False
        delay = self._config.join_sync_delay
        if delay > 0 and self._push_pull_at is not None:
            self._join_sync_at = now + delay

    def _join_sync(self, out: list[Output]) -> None:
        """The catch-up exchange after a join, with a random member."""
        self._join_sync_at = None
        if self._left:
            return
        targets = self._random_nodes(1, None, gossip=True)
        if targets:
            self._send_sync_open(targets[0].address, join=False, out=out)

    def _app_digest(self) -> bytes:
        app = self._app_state
        if app is None:
            return b""
        digest = app.digest()
        if len(digest) > self._config.app_digest_size_max:
            self._counters.app_dropped += 1
            return b""
        return digest

    def _app_state_for(self, remote_digest: bytes) -> bytes:
        """Our application state a peer with `remote_digest` lacks, or b"" for none."""
        app = self._app_state
        if app is None:
            return b""
        state = app.state_for(remote_digest)
        if not state:
            return b""
        if len(state) > self._config.app_state_size_max:
            self._counters.app_dropped += 1
            return b""
        self._counters.app_states_sent += 1
        return state

    def _send_sync(
        self,
        route: tuple[Address, int | None],
        leg: int,
        members: Sequence[bytes],
        wanted: Sequence[str],
        app_digest: bytes,
        app_state: bytes,
        reliable: bool,
        out: list[Output],
    ) -> None:
        """A reply leg: whole on a full route, else as many of `members`, then
        `wanted`, as fit its budget, without application state (`swim._reply`)."""
        if route[1] is not None:
            app_state = b""
        name, address, split = self._name, self._address, len(members)

        def build(k: int) -> bytes:
            message = encode_sync(
                leg, False, name, address, (), members[:k], wanted[: max(0, k - split)],
                app_digest, app_state,
            )  # fmt: skip
            return encode_packet([message])

        self._counters.push_pulls_sent += 1
        self._reply_built(route, build, split + len(wanted), reliable, out)

    def _send_sync_open(self, destination: Address, *, join: bool, out: list[Output]) -> None:
        """Leg 0: the digest of our whole view, our own full entry, our app digest."""
        view = self._view_cache()
        key = (join, self._app_digest())
        payload = view.openings.get(key)
        if payload is None:
            if len(view.openings) >= 4:
                view.openings.clear()  # an application digest that keeps changing
            message = encode_sync(
                0,
                join,
                self._name,
                self._address,
                view.digest(),
                [self._self.encoded_entry()],
                (),
                key[1],
                b"",
            )
            payload = view.openings[key] = encode_packet([message])
        self._counters.push_pulls_sent += 1
        self._emit(destination, payload, len(payload) > self._config.packet_budget, out)

    def _on_sync(self, message: Sync, now: float, reliable: bool, out: list[Output]) -> None:
        """Digest-first anti-entropy: merge what came, send only what the peer lacks.

        Where the answer goes is decided before the merge, from the view the packet
        found (its own entry must not vouch for the address it names).
        """
        if self._in_another_name(message.source):
            return
        self._counters.push_pulls_received += 1
        route = None
        if message.leg < 2:
            route = self._reply_route(message.source, message.source_address)
        if message.members:
            self._merge_entries(message.members, message.source, now, out)
        if message.app_state:
            app = self._app_state
            if app is None or len(message.app_state) > self._config.app_state_size_max:
                self._counters.app_dropped += 1
            else:
                self._counters.app_states_merged += 1
                app.merge(message.app_state)
        app_digest = message.app_digest
        if len(app_digest) > self._config.app_digest_size_max:
            self._counters.app_dropped += 1
            app_digest = b""
        if message.leg == 1 and self._join_sync_pending:
            self._catch_up_after_join(now)
        if message.leg == 0:
            digest = message.digest
            wanted = self._merge_digest(digest, message.source, now, out)
            # Name to entry, the last one winning if a name comes twice.
            theirs = dict(zip(map(_first, digest), digest, strict=True))
            # A member whose entry the peer holds exactly as we do needs nothing: only
            # the rest go through the comparison below, in member order as before.
            view = self._view_cache()
            differ = view.tuples().difference(theirs.values())
            names = sorted(map(_first, differ), key=view.position().__getitem__)
            members = self._members
            newer: list[bytes] = []
            for name in names:
                node = members[name]
                held = theirs.get(name)
                if held is None:
                    if node.state is _ALIVE or node.state is _SUSPECT:
                        newer.append(node.encoded_entry())
                elif held[1] < node.incarnation:
                    newer.append(node.encoded_entry())
                elif held[1] == node.incarnation:
                    rank, ours = _STATE_RANK[held[2]], _STATE_RANK[node.state]
                    if rank < ours or (rank == ours == 0 and held[3] != node.entry_hash()):
                        # Weaker, or another record at the same incarnation: what the
                        # table does with it is the peer's call (a member refutes a
                        # different record of itself, everyone else ignores it).
                        newer.append(node.encoded_entry())
            if route is not None:
                own_digest = self._app_digest()
                state = self._app_state_for(app_digest) if route[1] is None else b""
                self._send_sync(route, 1, newer, wanted, own_digest, state, reliable, out)
        elif message.leg == 1 and route is not None:
            members = self._members
            entries = [
                members[name].encoded_entry()
                for name in dict.fromkeys(message.wanted)
                if name in members
            ]
            app_state = self._app_state_for(app_digest) if route[1] is None else b""
            if entries or app_state:
                self._send_sync(route, 2, entries, (), b"", app_state, reliable, out)

    def _merge_digest(
        self,
        digest: tuple[tuple[str, int, int, int], ...],
        source: str,
        now: float,
        out: list[Output],
    ) -> list[str]:
        """Apply what a digest alone proves; return the alive members we need in full.

        Suspect, dead and left need no address or metadata, so they are applied here
        (dead as suspect, as in a full merge). An alive entry newer than ours, or about
        a member we do not hold, needs its address and metadata: we ask for it.
        """
        members = self._members
        reaped = self._reaped
        me = self._self
        wanted: list[str] = []
        # An alive entry equal to ours (not our own) proves nothing new: skip it before
        # unpacking. Incarnations only grow, so applying earlier entries cannot make it
        # news; our own entry always goes through (it may call for a refute). Only from
        # the second digest merged against one view: while the view changes between
        # digests (a cluster forming), building that set each time costs more than the
        # loop below, which does nothing with such an entry anyway.
        view = self._view_cache()
        view.digests_merged += 1
        news = filterfalse(view.alive().__contains__, digest) if view.digests_merged > 1 else digest
        for name, incarnation, state, entry_hash in news:
            node = members.get(name)
            if state == 0:
                if node is None:
                    gone = reaped.get(name)
                    if gone is None or incarnation > gone:
                        wanted.append(name)
                elif node is me:
                    # Alive above our incarnation, or another record of us at it: the
                    # table's REFUTE and REFUTE_IF_CHANGED, without the full entry.
                    if not self._left and (
                        incarnation > me.incarnation
                        or (incarnation == me.incarnation and entry_hash != me.entry_hash())
                    ):
                        self._refute(incarnation, now, out)
                elif incarnation > node.incarnation:
                    wanted.append(name)
            elif node is None:
                continue  # news about a member we do not hold: nothing to apply
            elif state == 3:
                self._apply(_RUMOR_LEFT, name, incarnation, now, out)
            else:
                self._apply(_RUMOR_SUSPECT, name, incarnation, now, out, source=source)
        return wanted

    def _send_push_pull(
        self, route: tuple[Address, int | None], *, reliable: bool, out: list[Output]
    ) -> None:
        """Our whole view as a push-pull reply, or as much of it as fits its budget."""
        entries = [node.encoded_entry() for node in self._members.values()]
        name, address = self._name, self._address

        def build(k: int) -> bytes:
            return encode_packet([encode_push_pull(False, True, name, address, entries[:k])])

        self._counters.push_pulls_sent += 1
        self._reply_built(route, build, len(entries), reliable, out)

    def _on_push_pull(
        self, message: PushPull, now: float, reliable: bool, out: list[Output]
    ) -> None:
        """Merge a full view, as memberlist's mergeState, and answer with ours.

        The protocol's first anti-entropy message, still answered for older peers; we
        open with `Sync`, which sends full entries only where a digest shows a need.
        """
        if self._in_another_name(message.source):
            return
        self._counters.push_pulls_received += 1
        route = None
        if not message.reply:
            route = self._reply_route(message.source, message.source_address)
        self._merge_entries(message.members, message.source, now, out)
        if route is not None:
            self._send_push_pull(route, reliable=reliable, out=out)

    def _merge_entries(
        self,
        entries: tuple[tuple[str, Address, int, int, bytes], ...],
        source: str,
        now: float,
        out: list[Output],
    ) -> None:
        """Apply full member entries through the precedence table (memberlist's mergeState)."""
        members = self._members
        me = self._self
        meta_max = self._config.meta_size_max
        for name, address, incarnation, state, meta in entries:
            if state == 0:  # alive
                node = members.get(name)
                if (
                    node is not None
                    and node.state is _ALIVE
                    and incarnation <= node.incarnation
                    and node is not me
                ):
                    continue  # the common case: nothing new
                if len(meta) > meta_max:
                    self._counters.dropped_invalid += 1
                    continue
                self._apply(_RUMOR_ALIVE, name, incarnation, now, out, address=address, meta=meta)
            elif state == 3:  # left
                self._apply(_RUMOR_LEFT, name, incarnation, now, out)
            else:
                # Suspect, or dead: memberlist prefers to suspect a member another node
                # believes dead, rather than declare it dead on second-hand news.
                self._apply(_RUMOR_SUSPECT, name, incarnation, now, out, source=source)
