"""The daemon: `populi-node up`. Wires identity, admission, transport, core and API together.

Everything here is plumbing; the decisions live in the parts it wires:

=====================  ================================================================
identity               `NodeIdentity.load_or_create(state_dir)`: same node id forever
admission              the enrollment certificate is verified against the authority key
                       at start (a node that would be refused by its peers refuses to
                       start, with one line saying why)
records                a signed `NodeRecord` is the swim member metadata; every record
                       heard goes through a `RecordBook` (bad ones dropped, counted)
packets                every datagram and frame is sealed and opened by a
                       `PacketAuthenticator`; sources that keep failing are rate limited
transport              `overlay.transport.Transport`: UDP + TCP on one port
driver                 `driver.Driver` runs the `swim.Membership` core
bootstrap              `overlay.bootstrap.Bootstrapper`: join, retry, re-join after a
                       partition, through `--bootstrap` peers and remembered members
store                  `store.MemberStore`: members and incarnation across restarts
GPU                    `gpu.GpuMonitor` re-signs the record when the GPUs change
API                    `api.serve_api` on ``STATE_DIR/api.sock``
=====================  ================================================================

All of them run in nurseries the `Node` owns. SIGINT or SIGTERM (or ``populi-node
leave``) starts a graceful leave: the core gossips that we left, the driver keeps
running until the core says the leave is announced (bounded by `LEAVE_TIMEOUT`), then
everything is cancelled and the process exits 0. A second signal exits at once.

A restarted node keeps its node id (the key file) and starts with an incarnation above
any it used before (the store), so its "alive" overrides the "dead" or "left" the
others remember, and it rejoins through the members it remembers without flags.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import ipaddress
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import trio

from overlay.admission import SourceRateLimiter, source_key
from overlay.auth import AuthError, PacketAuthenticator
from overlay.base import Address, TransportError, format_address
from overlay.bootstrap import Backoff, Bootstrapper
from overlay.detect import OverlayInfo, OverlayNotFoundError, detect_overlay, none_info
from overlay.inbox import BULK, URGENT, Incoming
from overlay.introductions import Introductions
from overlay.netfilter import AcceptPolicy
from overlay.transport import Transport, TransportConfig
from swim import (
    AppMessage,
    Event,
    Member,
    MemberFailed,
    MemberJoined,
    MemberLeft,
    MemberRecovered,
    Membership,
    MemberState,
    MemberSuspected,
    MemberUpdated,
    SelfRefuted,
)

from ._keyfiles import KeyFileError, encode_public_key, ensure_private_dir
from ._log import event, get_logger
from .api import ApiClient, make_app, serve_api
from .authority import cluster_fingerprint, read_authority_public_key, read_cluster_secret
from .certificate import CertificateError, read_certificate, verify_certificate
from .config import NodeConfig
from .driver import Driver
from .identity import NodeIdentity
from .record import Capabilities, NodeRecord, NodeStatus, SignedNodeRecord, next_sequence
from .record_book import RecordBook
from .revocation import RevocationList, read_revocation, write_revocation
from .store import KnownMember, MemberStore, StoreError

__all__ = ["LEAVE_TIMEOUT", "Node", "NodeStartError", "run_node"]

#: Longest a graceful leave may take before the daemon exits anyway, seconds.
LEAVE_TIMEOUT: Final = 3.0
#: Bytes a sealed datagram may occupy on the wire. Below WireGuard's 1420-byte MTU less
#: IPv6 and UDP headers, so an overlay never fragments protocol packets.
WIRE_PACKET_BUDGET: Final = 1350
#: How often the store is flushed and the housekeeping checks run, seconds.
HOUSEKEEPING_INTERVAL: Final = 2.0
#: Remembered failed members are retried for this long, seconds (a day, as Serf does).
RECONNECT_TIMEOUT: Final = 24 * 3600.0
#: At most this many addresses are tried per join attempt.
JOIN_CANDIDATES_MAX: Final = 8
#: Longest the first record waits for the first GPU report, seconds.
GPU_FIRST_REPORT_WAIT: Final = 3.0
#: Longest ``POST /v1/gpus/probe`` waits for the re-probe it asked for, seconds.
GPU_PROBE_WAIT_MAX: Final = 8.0
#: First byte of a populi control message inside an authenticated envelope. swim
#: packets start with their protocol version byte, which is never 0xFF.
CONTROL_PREFIX: Final = b"\xff"
#: Control message kinds (second byte). ONLY APPEND; values are part of the protocol.
CONTROL_REVOCATIONS: Final = b"R"
#: `status` warns about this many unverified members one by one, then counts the rest.
UNVERIFIED_WARNINGS_MAX: Final = 5
#: Supported revocation file suffix in STATE_DIR/revocations/.
REVOCATION_SUFFIX: Final = ".rev"

_log = get_logger("node")


class NodeStartError(Exception):
    """The daemon cannot start; the message is one line with the cause and the fix."""


def _software_version() -> str:
    try:
        return importlib.metadata.version("populi-p2p")
    except importlib.metadata.PackageNotFoundError:
        return "0.1.0+src"


def _ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def _lane(payload: bytes) -> int:
    """Inbox lane for a raw (still sealed) payload: big frames are state exchange.

    Runs on unauthenticated bytes, so it only looks at the size: every protocol packet
    (probe, ack, suspicion, refute) fits a datagram, push-pull state does not.
    """
    return BULK if len(payload) > WIRE_PACKET_BUDGET else URGENT


class _AuthCodec:
    """Seals outgoing payloads and opens incoming packets (the driver's `PacketCodec`).

    A source whose packets keep failing authentication is cut to a few examined packets
    per second before any signature check (`SourceRateLimiter`); every drop is counted
    by reason in the authenticator's `drops`. Our certificate rides only in packets to
    peers that may not know us (`introductions`, fed by the node's membership events
    and by senders that start a new session).
    """

    def __init__(
        self,
        auth: PacketAuthenticator,
        max_frame_size: int,
        on_control: Callable[[bytes], None] = lambda _: None,
        *,
        clock: Callable[[], float] = time.monotonic,
        realtime: Callable[[], float] = time.time,
    ) -> None:
        self.auth = auth
        self._clock = clock
        self._realtime = realtime
        self.limiter = SourceRateLimiter()
        self.recipients: dict[Address, str] = {}
        self.introductions = Introductions()
        self.datagrams_with_certificate = 0
        self.datagrams_without_certificate = 0
        self._max_frame = max_frame_size
        self._on_control = on_control
        self.bytes_out = 0
        self.bytes_in = 0
        self.control_in = 0

    def seal(self, destination: Address, payload: bytes, reliable: bool) -> bytes:
        recipient = self.recipients.get(destination)
        include = self.introductions.include(recipient, reliable, self._clock())
        if not reliable:
            if include:
                self.datagrams_with_certificate += 1
            else:
                self.datagrams_without_certificate += 1
        sealed = self.auth.seal(
            payload, self._realtime(), recipient=recipient, include_certificate=include
        )
        self.bytes_out += len(sealed)
        return sealed

    def open(self, incoming: Incoming) -> bytes | None:
        now = self._realtime()
        self.bytes_in += len(incoming.payload)
        key = source_key(incoming.source[0])
        if not self.limiter.allow(key, now):
            self.auth.drops.add("rate_limited")
            return None
        try:
            opened = self.auth.open(
                incoming.payload, now, max_size=self._max_frame if incoming.reliable else None
            )
        except AuthError as exc:
            self.limiter.charge(key, now)
            source = format_address(incoming.source)
            event(_log, 10, "packet.dropped", source=source, reason=str(exc))
            return None
        if opened.new_session:
            # New to us, or restarted: it may not hold our certificate (any more).
            self.introductions.introduce(opened.sender_node_id, self._clock())
        if opened.payload[:1] == CONTROL_PREFIX:
            # Not for the core: populi's own authenticated messages (revocation gossip).
            self.control_in += 1
            self._on_control(opened.payload[1:])
            return None
        return opened.payload


class Node:
    """One populi daemon. `await Node(config).run()` until it leaves or is cancelled."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.swim_config = config.swim_config()
        self.identity: NodeIdentity
        self.authority_key: bytes
        self.certificate: bytes
        self.core: Membership | None = None
        self.driver: Driver | None = None
        self.transport: Transport | None = None
        self.records: RecordBook
        self.codec: _AuthCodec
        self.store: MemberStore | None = None
        self.bootstrapper: Bootstrapper | None = None
        self.started_at = time.time()
        self.advertise: Address = ("", 0)
        self.overlay: OverlayInfo = none_info()
        self.policy: AcceptPolicy
        self._record: SignedNodeRecord | None = None
        self._sequence: int | None = None
        self._gpu_report: Any = None
        self.gpu_monitor: Any = None
        self._failed_at: dict[str, tuple[Address, float]] = {}
        self._dirty: dict[str, KnownMember] = {}
        self._forget: set[str] = set()
        self._clashes_logged: set[tuple[str, tuple[str, ...]]] = set()
        self._names: dict[str, str] = {}
        self._by_name: dict[str, set[str]] = {}
        # node id -> why its record is not trusted, as last logged (`record.refused`).
        self._unverified: dict[str, str] = {}
        self._leaving = trio.Event()
        self._left = False
        self._nursery: trio.Nursery | None = None
        self._joined = trio.Event()
        self._gpu_ready = trio.Event()
        self._gossip_revocations_now = trio.Event()
        self._api_stop = trio.Event()
        self._api_done = trio.Event()
        self.revocations = RevocationList()
        self._revocation_files: tuple[tuple[str, int], ...] = ()
        self._mdns_peers: dict[str, tuple[Address, ...]] = {}

    ####################################################################################
    # Start-up checks (synchronous, before any socket is opened)

    def _load_credentials(self) -> None:
        config = self.config
        try:
            ensure_private_dir(config.state_dir)
            self.identity = NodeIdentity.load_or_create(config.state_dir)
        except KeyFileError as exc:
            raise NodeStartError(str(exc)) from None
        except PermissionError:
            raise NodeStartError(
                f"no permission to use state dir {config.state_dir} (check --state-dir)"
            ) from None
        public = encode_public_key(self.identity.public_key)
        try:
            self.authority_key = read_authority_public_key(config.authority_pubkey_path)
        except KeyFileError as exc:
            raise NodeStartError(
                f"no cluster authority key: {exc} (copy authority.pub from the authority"
                " machine into the state dir, or pass --authority-pubkey)"
            ) from None
        try:
            self.certificate = read_certificate(config.cert_path)
        except KeyFileError as exc:
            raise NodeStartError(
                f"no enrollment certificate: {exc} (on the authority machine run:"
                f" populi-node cluster enroll {public}, then pass the file with --cert)"
            ) from None
        revocations = self._load_revocations()
        self.revocations = revocations
        try:
            verify_certificate(
                self.certificate, self.authority_key, self.identity.public_key, time.time(),
                revocations=revocations,
            )  # fmt: skip
        except CertificateError as exc:
            raise NodeStartError(
                f"certificate {config.cert_path} refused ({exc}); enroll this node again:"
                f" populi-node cluster enroll {public}"
            ) from None
        secret = None
        if config.cluster_secret is not None:
            try:
                secret = read_cluster_secret(config.cluster_secret)
            except KeyFileError as exc:
                raise NodeStartError(
                    f"cluster secret refused: {exc} (check --cluster-secret)"
                ) from None
        tcp_frame_max = TransportConfig().tcp.max_frame_size
        auth = PacketAuthenticator(
            self.identity,
            self.certificate,
            self.authority_key,
            cluster_secret=secret,
            revocations=revocations,
            max_packet_size=TransportConfig().max_datagram_size,
        )
        self.codec = _AuthCodec(auth, tcp_frame_max, self._on_control)
        self.records = RecordBook(
            self.authority_key,
            revocations=revocations,
            max_record_bytes=self.swim_config.meta_size_max,
        )
        overhead = auth.overhead()
        import attrs

        self.swim_config = attrs.evolve(
            self.swim_config, packet_budget=max(512, WIRE_PACKET_BUDGET - overhead)
        )

    def _load_revocations(self) -> RevocationList:
        """Every valid revocation file in STATE_DIR/revocations (bad ones logged)."""
        directory = self.config.state_dir / "revocations"
        revocations = RevocationList()
        if not directory.is_dir():
            return revocations
        try:
            paths = sorted(directory.glob(f"*{REVOCATION_SUFFIX}"))
            snapshot = tuple((p.name, p.stat().st_mtime_ns) for p in paths)
        except OSError:
            return self.revocations  # changing under our feet: look again next time
        if snapshot == self._revocation_files:
            return self.revocations  # nothing changed since the last look: no crypto
        self._revocation_files = snapshot
        for path in paths:
            try:
                revocations = revocations.with_revocation(read_revocation(path, self.authority_key))
            except (KeyFileError, CertificateError) as exc:
                event(_log, 30, "revocation.ignored", file=str(path), reason=str(exc))
        return revocations

    def _open_store(self) -> int:
        try:
            self.store = MemberStore(self.config.store_path)
            return self.store.start_incarnation()
        except StoreError as exc:
            event(_log, 30, "store.unusable", reason=str(exc), effect="starting without memory")
            self.store = None
            return int(time.time())  # still above anything a previous run used

    async def _choose_addresses(self) -> tuple[str, AcceptPolicy]:
        """Bind host and accept policy, from the flags and overlay detection."""
        config = self.config
        try:
            info = await detect_overlay(config.overlay)
        except OverlayNotFoundError as exc:
            raise NodeStartError(
                f"{exc} (bring the overlay up, or use --overlay none with --bind)"
            ) from None
        self.overlay = info
        try:
            policy = info.accept_policy(config.allow_cidr)
        except ValueError as exc:
            raise NodeStartError(f"--allow-cidr: {exc}") from None
        bind = config.bind or info.preferred_address() or "0.0.0.0"
        return bind, policy

    def _advertise_host(self, bind: str) -> str:
        if self.config.advertise:
            return self.config.advertise
        if bind not in ("0.0.0.0", "::"):
            return bind
        overlay = self.overlay.preferred_address()
        if overlay is not None:
            return overlay  # bound to all, but peers must come in through the overlay
        return _guess_local_address(ipv6=bind == "::")

    ####################################################################################
    # Records

    def _sign_record(self) -> bytes:
        now = time.time()
        self._sequence = next_sequence(self._sequence, now)
        gpu = self._gpu_report.to_record() if self._gpu_report is not None else None
        limit = min(self.swim_config.meta_size_max, self.swim_config.packet_budget - 64)
        try:
            signed = self._record_with(gpu).sign(self.identity, max_bytes=limit)
        except ValueError as exc:
            event(_log, 30, "record.gpu_omitted", reason=str(exc))
            signed = self._record_with(None).sign(self.identity, max_bytes=limit)
        self._record = signed
        self.records.accept(signed.raw, now, node_id=self.identity.node_id)
        return signed.raw

    def _record_with(self, gpu: dict[str, Any] | None) -> NodeRecord:
        assert self._sequence is not None
        return NodeRecord(
            node_id=self.identity.node_id,
            public_key=self.identity.public_key,
            name=self.config.name,
            address=self.advertise[0],
            port=self.advertise[1],
            software_version=_software_version(),
            protocol_version=_protocol_version(),
            started_at=float(self.started_at),
            sequence=self._sequence,
            status=NodeStatus.AVAILABLE,
            capabilities=Capabilities(os.cpu_count() or 0, _ram_bytes(), gpu),
            labels=dict(self.config.labels),
            certificate=self.certificate,
        )

    async def _on_gpu_change(self, report: Any) -> None:
        self._gpu_report = report
        self._gpu_ready.set()
        if self.driver is None or self.core is None or self.core.has_left:
            return
        meta = self._sign_record()
        core = self.core
        await self.driver.call(lambda now: core.set_meta(meta, now))
        event(_log, 20, "record.updated", reason="gpu", sequence=self._sequence)

    ####################################################################################
    # Events from the core

    def _on_event(self, ev: Event) -> None:
        introductions = self.codec.introductions
        if isinstance(ev, SelfRefuted):
            # Somebody suspected us: maybe it could not read our packets. Tell everyone.
            introductions.introduce_to_everyone(time.monotonic())
            event(_log, 30, "self.refuted", incarnation=ev.incarnation)
            if self.store is not None:
                self.store.save_incarnation(ev.incarnation)
            return
        if isinstance(ev, AppMessage):
            return  # the daemon keeps swim's application channel off (nothing uses it yet)
        member = ev.member
        if member.name == self.identity.node_id:
            return
        self.codec.recipients[member.address] = member.name
        if isinstance(ev, MemberJoined | MemberRecovered | MemberUpdated):
            # New to us, back, or a new record (a restart signs one): it may not know us.
            introductions.introduce(member.name, time.monotonic())
            introductions.doubt(member.name, False)
        elif isinstance(ev, MemberSuspected | MemberFailed):
            introductions.doubt(member.name, True)  # silent: perhaps it cannot read us
        elif isinstance(ev, MemberLeft):
            introductions.doubt(member.name, False)
        record = self._verify(member)
        name = record.name if record is not None else self._names.get(member.name, "?")
        fields: dict[str, object] = {
            "name": name,
            "id": member.name,
            "addr": format_address(member.address),
            "inc": member.incarnation,
            "unverified": self._unverified.get(member.name),  # left out when None
        }
        if isinstance(ev, MemberJoined):
            event(_log, 20, "member.joined", **fields)
            self._remember(member, name)
            self._joined.set()
            self._check_clash(record)
        elif isinstance(ev, MemberRecovered):
            event(_log, 20, "member.recovered", **fields)
            self._failed_at.pop(member.name, None)
            self._remember(member, name)
            self._joined.set()
        elif isinstance(ev, MemberUpdated):
            event(_log, 20, "member.updated", **fields)
            self._remember(member, name)
            self._check_clash(record)
        elif isinstance(ev, MemberSuspected):
            event(_log, 20, "member.suspected", **fields)
        elif isinstance(ev, MemberFailed):
            event(_log, 30, "member.failed", **fields)
            self._failed_at[member.name] = (member.address, time.time())
        elif isinstance(ev, MemberLeft):
            event(_log, 20, "member.left", **fields)
            self._failed_at.pop(member.name, None)
            self._dirty.pop(member.name, None)
            self._forget.add(member.name)

    def _verify(self, member: Member) -> NodeRecord | None:
        """Offer the member's metadata to the record book; its record if it is trusted.

        None when the member is *unverified*: its current record was refused (bad
        signature, another cluster's certificate, revoked, expired, ...) or it never
        had one. Logs `record.refused` once each time the reason changes.
        """
        if member.meta:
            self.records.accept(member.meta, time.time(), node_id=member.name)
        reason = self.unverified_reason(member.name)
        if reason is None:
            self._unverified.pop(member.name, None)
            return self.records.get(member.name)
        if self._unverified.get(member.name) != reason:
            self._unverified[member.name] = reason
            event(_log, 30, "record.refused", id=member.name, reason=reason,
                  effect="shown as unverified")  # fmt: skip
        return None

    def unverified_reason(self, node_id: str) -> str | None:
        """Why `node_id` is unverified (`bad_signature`, `wrong_authority`, `revoked`,
        `expired`, `no_record`, ...), or None when its current record verified."""
        reason = self.records.refusal(node_id)
        if reason is None and self.records.get(node_id) is None:
            return "no_record"
        return reason

    def _remember(self, member: Member, name: str) -> None:
        self._forget.discard(member.name)
        host, port = member.address
        self._dirty[member.name] = KnownMember(member.name, name, host, port, time.time())

    def _check_clash(self, record: NodeRecord | None) -> None:
        """Log once when `record`'s name is also used by another live node id.

        O(members with that name), not O(members): this runs on every join and update.
        """
        if record is None or self.core is None:
            return
        previous = self._names.get(record.node_id)
        if previous is not None and previous != record.name:
            self._by_name.get(previous, set()).discard(record.node_id)
        self._names[record.node_id] = record.name
        holders = self._by_name.setdefault(record.name, set())
        holders.add(record.node_id)
        gone = (MemberState.DEAD, MemberState.LEFT)
        live = sorted(
            n for n in holders if (m := self.core.member(n)) is not None and m.state not in gone
        )
        if len(live) > 1:
            key = (record.name, tuple(live))
            if key not in self._clashes_logged:
                self._clashes_logged.add(key)
                event(_log, 30, "name.clash", name=record.name, ids=",".join(live))

    def name_clashes(self) -> list[dict[str, Any]]:
        """Names claimed by more than one node id among members not gone."""
        by_name: dict[str, list[str]] = {}
        if self.core is None:
            return []
        for member in self.core.members():
            if member.state in (MemberState.DEAD, MemberState.LEFT):
                continue
            record = self.records.get(member.name)
            if record is not None:
                by_name.setdefault(record.name, []).append(member.name)
        return [
            {"name": name, "node_ids": sorted(ids)}
            for name, ids in sorted(by_name.items())
            if len(ids) > 1
        ]

    ####################################################################################
    # Joining

    def _needs_join(self) -> bool:
        core = self.core
        if core is None or core.has_left:
            return False
        if core.num_alive() <= 1:
            return True
        if any(core.member(nid) is None for nid in self._mdns_peers):
            return True  # found on the LAN, not yet in the mesh
        # Members we saw fail may be on the other side of a healed partition.
        return any(
            (m := core.member(node_id)) is None or m.state in (MemberState.DEAD,)
            for node_id in self._failed_at
        )

    def _known_addresses(self) -> list[Address]:
        now = time.time()
        for node_id, (_, at) in list(self._failed_at.items()):
            if now - at > RECONNECT_TIMEOUT:
                del self._failed_at[node_id]
        core = self.core
        live = (MemberState.ALIVE, MemberState.SUSPECT)
        alive = set() if core is None else {m.name for m in core.members() if m.state in live}
        out = [addr for nid, (addr, _) in self._failed_at.items() if nid not in alive]
        for nid, addresses in self._mdns_peers.items():
            if nid not in alive:
                out.extend(addresses[:1])
        if self.store is not None and core is not None and core.num_alive() <= 1:
            me = self.identity.node_id
            out += [(m.host, m.port) for m in self.store.known_members() if m.node_id != me]
        deduped = list(dict.fromkeys(a for a in out if a != self.advertise))
        random.shuffle(deduped)
        return deduped[:JOIN_CANDIDATES_MAX]

    async def _try_join(self, candidates: Sequence[Address]) -> bool:
        assert self.driver is not None and self.core is not None
        core = self.core
        seeds = [c for c in candidates if c != self.advertise][: JOIN_CANDIDATES_MAX * 2]
        if not seeds:
            return core.num_alive() > 1
        event(_log, 10, "join.attempt", seeds=",".join(format_address(s) for s in seeds))
        self._joined = trio.Event()
        await self.driver.call(lambda now: core.join(seeds, now))
        with trio.move_on_after(max(1.0, 2 * self.swim_config.probe_interval)):
            while core.num_alive() <= 1:
                await self._joined.wait()
                self._joined = trio.Event()
        return core.num_alive() > 1

    ####################################################################################
    # Housekeeping

    def _flush_store(self) -> None:
        if self.store is None:
            self._dirty.clear()
            self._forget.clear()
            return
        try:
            if self._dirty:
                self.store.remember(self._dirty.values())
            if self._forget:
                self.store.forget(self._forget)
            if self.core is not None:
                self.store.save_incarnation(self.core.incarnation)
        except StoreError as exc:
            event(_log, 30, "store.write_failed", reason=str(exc))
        self._dirty.clear()
        self._forget.clear()

    async def _housekeeping(self) -> None:
        while True:
            await trio.sleep(HOUSEKEEPING_INTERVAL)
            self._flush_store()
            assert self.transport is not None
            paths = self.transport.paths
            for peer in paths.blocked_peers():
                if paths.warn_udp_blocked_once(peer):
                    name = self.codec.recipients.get(peer, "?")
                    event(
                        _log, 30, "udp.blocked", peer=format_address(peer), id=name,
                        effect="probes fall back to tcp; check the firewall for udp",
                    )  # fmt: skip
            for node_id in self.records.revalidate(time.time()):
                event(_log, 30, "record.expired", id=node_id)
            if self.core is not None:
                self.codec.introductions.prune(_Held(self.core), time.monotonic())
            self._adopt_revocations(self._load_revocations(), source="file")

    ####################################################################################
    # Revocations: files in STATE_DIR/revocations, gossiped as a grow-only set

    def _adopt_revocations(self, heard: RevocationList, source: str) -> None:
        merged = self.revocations.merge(heard)
        if merged is self.revocations or len(merged) == len(self.revocations):
            return
        new = [r for r in merged if r not in self.revocations.revocations]
        self.revocations = merged
        self.codec.auth.update_revocations(merged)
        for node_id in self.records.update_revocations(merged, time.time()):
            event(_log, 30, "record.revoked", id=node_id)
        directory = self.config.state_dir / "revocations"
        for revocation in new:
            event(_log, 30, "revocation.adopted", what=revocation.describe(), source=source)
            if source != "file":
                try:
                    directory.mkdir(mode=0o700, exist_ok=True)
                    name = hashlib.sha256(revocation.raw).hexdigest()[:16]
                    write_revocation(directory / f"gossip-{name}{REVOCATION_SUFFIX}", revocation)
                except FileExistsError:
                    pass
                except OSError as exc:
                    event(_log, 30, "revocation.not_saved", reason=str(exc))
        self._gossip_revocations_now.set()

    def _on_control(self, message: bytes) -> None:
        if message[:1] != CONTROL_REVOCATIONS:
            return  # a kind from a newer version: ignore
        try:
            heard = RevocationList.from_bytes(message[1:], self.authority_key)
        except CertificateError as exc:
            event(_log, 30, "revocation.refused", reason=str(exc))
            return
        self._adopt_revocations(heard, source="gossip")

    async def _gossip_revocations(self) -> None:
        """Anti-entropy for revocations: send the whole (small, signed) list to a few
        random members when it grows, and to one every push-pull interval."""
        interval = max(1.0, self.swim_config.push_pull_interval)
        while True:
            with trio.move_on_after(interval):
                await self._gossip_revocations_now.wait()
            burst = self._gossip_revocations_now.is_set()
            self._gossip_revocations_now = trio.Event()
            if not len(self.revocations) or self.core is None or self.transport is None:
                continue
            me = self.identity.node_id
            live = (MemberState.ALIVE, MemberState.SUSPECT)
            peers = [m for m in self.core.members() if m.name != me and m.state in live]
            random.shuffle(peers)
            payload = CONTROL_PREFIX + CONTROL_REVOCATIONS + self.revocations.to_bytes()
            for member in peers[: 3 if burst else 1]:
                sealed = self.codec.seal(member.address, payload, True)
                try:
                    await self.transport.send_frame(member.address, sealed)
                except TransportError as exc:
                    event(_log, 10, "revocation.send_failed", to=member.name, reason=str(exc))

    ####################################################################################
    # Leaving

    def request_leave(self) -> None:
        """Start a graceful leave (API or signal); `run` then returns."""
        self._leaving.set()

    async def _leave_when_asked(self) -> None:
        await self._leaving.wait()
        assert self.driver is not None and self.core is not None and self._nursery is not None
        core = self.core
        started = trio.current_time()
        event(_log, 20, "node.leaving", timeout=LEAVE_TIMEOUT)
        with trio.move_on_after(LEAVE_TIMEOUT):
            await self.driver.call(core.leave)
            # The driver keeps running (receiving, acking, gossiping) until the core has
            # sent our "left" as many times as its transmit limit asks.
            await self.driver.wait_for(lambda: core.leave_announced)
        self._left = True
        self._flush_store()
        self._left = True
        self._flush_store()
        event(
            _log, 20, "node.left", seconds=round(trio.current_time() - started, 3),
            announced=str(core.leave_announced).lower(),
        )  # fmt: skip
        # Let the API finish answering (the `leave` request itself) before stopping.
        self._api_stop.set()
        with trio.move_on_after(2.0):
            await self._api_done.wait()
        self._nursery.cancel_scope.cancel()

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if self._leaving.is_set():
                    event(_log, 30, "node.exit_now", signal=signal.Signals(signum).name)
                    assert self._nursery is not None
                    self._nursery.cancel_scope.cancel()
                    return
                event(_log, 20, "node.signal", signal=signal.Signals(signum).name)
                self.request_leave()

    ####################################################################################
    # Running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start everything, serve until a leave completes or the task is cancelled.

        Raises:
            NodeStartError: bad credentials, no usable address, port in use, another
                daemon on the same state dir.
        """
        self._load_credentials()
        config = self.config
        if ApiClient(config.api_socket, timeout=2.0).is_running():
            raise NodeStartError(
                f"another populi daemon is running on state dir {config.state_dir}"
                " (stop it with populi-node leave, or use another --state-dir)"
            )
        bind, self.policy = await self._choose_addresses()
        incarnation = self._open_store()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._start(nursery, bind, incarnation)
                task_status.started()
        finally:
            self._flush_store()
            if self.store is not None:
                self.store.close()
            try:
                config.api_socket.unlink()
            except OSError:
                pass

    async def _start(self, nursery: trio.Nursery, bind: str, incarnation: int) -> None:
        config = self.config
        transport = Transport(
            bind, config.port, policy=self.policy, classify=_lane, dual_stack=bind == "::"
        )
        try:
            local = await nursery.start(transport.run)
        except (TransportError, ValueError) as exc:
            raise NodeStartError(
                f"cannot listen on {bind} port {config.port}: {exc}"
                " (is another node using the port? pick one with --port)"
            ) from None
        self.transport = transport
        self.advertise = (self._advertise_host(bind), local[1])
        # The first GPU report goes into the first record (bounded wait: a wedged driver
        # must not hold the node out of the mesh; a late report re-signs the record).
        nursery.start_soon(self._run_gpu_monitor)
        with trio.move_on_after(GPU_FIRST_REPORT_WAIT):
            await self._gpu_ready.wait()
        meta = self._sign_record()
        core = Membership(
            self.swim_config, self.identity.node_id, self.advertise, random.Random(),
            trio.current_time(), meta=meta, incarnation=incarnation,
        )  # fmt: skip
        self.core = core
        self.driver = Driver(
            core, transport, self.codec, self._on_event,
            max_datagram_size=transport.config.max_datagram_size,
        )  # fmt: skip
        await nursery.start(self.driver.run)
        nursery.start_soon(self._signals)
        nursery.start_soon(self._leave_when_asked)
        try:
            await nursery.start(self._serve_api)
        except OSError as exc:
            raise NodeStartError(
                f"cannot create the API socket {config.api_socket}: {exc}"
            ) from None
        peers = [(p, self.advertise[1]) for p in self.overlay.peers]  # Tailscale's online peers
        self.bootstrapper = Bootstrapper(
            self._try_join,
            bootstrap=[*config.bootstrap, *peers],
            known_members=self._known_addresses,
            needs_join=self._needs_join,
            backoff=Backoff(jitter=0.2, rng=random.Random()),
            check_interval=max(1.0, 5 * self.swim_config.probe_interval),
        )
        nursery.start_soon(self.bootstrapper.run)
        nursery.start_soon(self._housekeeping)
        nursery.start_soon(self._gossip_revocations)
        if config.mdns:
            nursery.start_soon(self._run_mdns)
        overlay = self.overlay
        event(_log, 20, "overlay.detected", kind=str(overlay.kind), detail=overlay.describe())
        event(
            _log, 20, "node.ready",
            name=config.name, id=self.identity.node_id, addr=format_address(self.advertise),
            inc=incarnation, cluster=cluster_fingerprint(self.authority_key),
            overlay=str(self.overlay.kind), accept=",".join(self.policy.cidrs),
            preset=config.preset, api=str(config.api_socket),
        )  # fmt: skip

    async def _serve_api(self, *, task_status: trio.TaskStatus[Path]) -> None:
        try:
            await serve_api(
                make_app(_Backend(self)),
                self.config.api_socket,
                shutdown_trigger=self._api_stop.wait,
                task_status=task_status,
            )
        finally:
            self._api_done.set()

    async def _run_gpu_monitor(self) -> None:
        from .gpu import CapacityPolicy, GpuMonitor, parse_declared

        monitor = GpuMonitor(
            self._on_gpu_change,
            policy=CapacityPolicy(
                reserve_vram=self.config.reserve_vram, withheld=frozenset(self.config.withhold_gpu)
            ),
            labels=dict(self.config.labels),
            declared=parse_declared(self.config.advertise_gpu),
            interval=self.config.gpu_probe_interval,
        )
        self.gpu_monitor = monitor
        await monitor.run()

    async def _run_mdns(self) -> None:
        """Advertise and browse `_populi._udp` on the LAN interfaces (never the overlay).

        A discovery is only an address to try: admission still needs a certificate.
        """
        from overlay.detect import list_interfaces
        from overlay.mdns import MdnsAnnouncer, lan_addresses

        bind = self.transport.local_address[0] if self.transport is not None else "0.0.0.0"
        if bind not in ("0.0.0.0", "::"):
            addresses = [bind] if ipaddress.ip_address(bind).version == 4 else []
        else:
            try:
                interfaces = await list_interfaces()
            except (OSError, TimeoutError, ValueError) as exc:
                event(_log, 30, "mdns.off", reason=f"cannot list interfaces: {exc}")
                return
            exclude = [self.overlay.interface] if self.overlay.interface else []
            addresses = lan_addresses(interfaces, exclude=exclude)
        if not addresses:
            event(_log, 30, "mdns.off", reason="no LAN IPv4 address to run mDNS on")
            return
        announcer = MdnsAnnouncer(
            node_id=self.identity.node_id,
            port=self.advertise[1],
            fingerprint=cluster_fingerprint(self.authority_key),
            addresses=addresses,
            advertise_addresses=[self.advertise[0]],
        )
        self.mdns = announcer
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(announcer.run)
                event(_log, 20, "mdns.on", addresses=",".join(addresses),
                      fp=cluster_fingerprint(self.authority_key))  # fmt: skip
                async for peer in announcer.discoveries:
                    known = self.core.member(peer.node_id) if self.core is not None else None
                    if len(self._mdns_peers) >= JOIN_CANDIDATES_MAX * 8:
                        self._mdns_peers.pop(next(iter(self._mdns_peers)))
                    self._mdns_peers[peer.node_id] = peer.addresses
                    alive = (MemberState.ALIVE, MemberState.SUSPECT)
                    if known is None or known.state not in alive:
                        event(_log, 20, "mdns.found", id=peer.node_id,
                              addr=",".join(format_address(a) for a in peer.addresses))  # fmt: skip
                        if self.bootstrapper is not None:
                            self.bootstrapper.poke()
        except OSError as exc:
            event(_log, 30, "mdns.off", reason=str(exc))

    ####################################################################################
    # What the API shows

    def member_rows(self) -> list[dict[str, Any]]:
        from .gpu import GpuReport, member_gpu_summary, report_to_dict

        core = self.core
        if core is None:
            return []
        rows = []
        for member in core.members():
            reason = self.unverified_reason(member.name)
            # What an unverified member's record claims is not shown: only its id,
            # address and state (the core's own) and the name it had when it verified.
            record = self.records.get(member.name) if reason is None else None
            name = record.name if record is not None else self._names.get(member.name, "?")
            caps = "-"
            gpu_detail: dict[str, Any] | None = None
            if record is not None:
                c = record.capabilities
                gpu = member_gpu_summary(c.gpu) if c.gpu is not None else "no GPU"
                caps = f"{c.cpu_cores} cpu, {c.ram_bytes / 2**30:.0f} GiB, {gpu}"
                if c.gpu is not None:
                    try:
                        gpu_detail = report_to_dict(GpuReport.from_record(c.gpu))
                    except ValueError:
                        gpu_detail = None  # the summary already says "GPU record unreadable"
            rows.append(
                {
                    "name": name,
                    "node_id": member.name,
                    "address": format_address(member.address),
                    "state": member.state.name.lower(),
                    "incarnation": member.incarnation,
                    "rtt_ms": None if member.rtt is None else round(member.rtt * 1000, 3),
                    "capabilities": caps,
                    # The member's signed GPU record, in the `gpus --json` form: every
                    # section says its layer (A verified, B derived, C operator).
                    "gpu": gpu_detail,
                    "labels": dict(record.labels) if record is not None else {},
                    "status": record.status.value if record is not None else None,
                    "verified": reason is None,
                    "unverified": reason,
                    "self": member.name == self.identity.node_id,
                    "state_since": round(trio.current_time() - member.state_since, 3),
                }
            )
        return rows

    def unverified_members(self) -> list[dict[str, Any]]:
        """Members the core holds whose record is not trusted, with the reason."""
        if self.core is None:
            return []
        out = []
        for member in self.core.members():
            reason = self.unverified_reason(member.name)
            if reason is not None:
                out.append({
                    "node_id": member.name, "name": self._names.get(member.name, "?"),
                    "state": member.state.name.lower(), "reason": reason,
                })  # fmt: skip
        return out

    def status(self) -> dict[str, Any]:
        core = self.core
        counts = {s.name.lower(): 0 for s in MemberState}
        members = core.members() if core is not None else []
        for m in members:
            counts[m.state.name.lower()] += 1
        summary = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
        warnings: list[str] = []
        clashes = self.name_clashes()
        for clash in clashes:
            ids = ", ".join(clash["node_ids"])
            warnings.append(f"name {clash['name']!r} is used by nodes {ids}")
        blocked: list[str] = []
        transport_stats: dict[str, Any] = {}
        if self.transport is not None:
            stats = self.transport.statistics()
            blocked = [format_address(a) for a in stats.udp_blocked_peers]
            transport_stats = {
                "udp": _asdict(stats.udp),
                "tcp": _asdict(stats.tcp),
            }
        for peer in blocked:
            warnings.append(f"UDP to {peer} seems blocked; TCP works")
        unverified = self.unverified_members()
        for entry in unverified[:UNVERIFIED_WARNINGS_MAX]:
            warnings.append(
                f"member {entry['node_id']} ({entry['name']}, {entry['state']}) is unverified:"
                f" {entry['reason']}"
            )
        if len(unverified) > UNVERIFIED_WARNINGS_MAX:
            warnings.append(
                f"... and {len(unverified) - UNVERIFIED_WARNINGS_MAX} more unverified members"
            )
        if unverified:
            summary += f"; {len(unverified)} unverified"
        boot = self.bootstrapper.statistics() if self.bootstrapper is not None else None
        return {
            "node": {
                "name": self.config.name,
                "node_id": self.identity.node_id,
                "public_key": encode_public_key(self.identity.public_key),
                "address": format_address(self.advertise),
                "incarnation": core.incarnation if core is not None else None,
                "left": self._left or (core is not None and core.has_left),
                "started_at": self.started_at,
                "uptime_s": round(time.time() - self.started_at, 3),
                "software_version": _software_version(),
                "preset": self.config.preset,
                "pid": os.getpid(),
            },
            "overlay": {
                **self.overlay.to_dict(),
                "accept": list(self.policy.cidrs),
                "description": self.overlay.describe(),
            },
            "cluster": {
                "fingerprint": cluster_fingerprint(self.authority_key),
                "members": counts,
                "summary": summary,
                "unverified": len(unverified),
                "awareness": core.awareness if core is not None else None,
            },
            "unverified": unverified,
            "name_clashes": clashes,
            "udp_blocked": blocked,
            "warnings": warnings,
            "drops": {
                "auth": self.codec.auth.drops.as_dict(),
                "records": self.records.drops.as_dict(),
            },
            "traffic": {
                "bytes_out": self.codec.bytes_out,
                "bytes_in": self.codec.bytes_in,
                "datagrams_with_certificate": self.codec.datagrams_with_certificate,
                "datagrams_without_certificate": self.codec.datagrams_without_certificate,
            },
            "bootstrap": None if boot is None else _asdict(boot),
            "swim": _asdict(core.statistics()) if core is not None else {},
            "driver": _asdict(self.driver.statistics()) if self.driver is not None else {},
            "transport": transport_stats,
        }

    def gpus(self) -> dict[str, Any]:
        from .gpu import format_gpu_table, report_to_dict

        report = self._gpu_report
        if report is None:
            return {"table": "GPU probe has not finished yet", "report": None}
        return {"table": format_gpu_table(report), "report": report_to_dict(report)}

    async def probe_gpus(self) -> dict[str, Any]:
        """Re-probe the GPUs now and answer with the resulting report. A change has
        been signed into a new NodeRecord (and handed to gossip) before this returns."""
        monitor = self.gpu_monitor
        if monitor is not None:
            # Every probe is bounded by its own timeout; this is belt and braces.
            with trio.move_on_after(GPU_PROBE_WAIT_MAX):
                await monitor.probe_now()
        return self.gpus()


class _Backend:
    """The API's view of the node (`api.ApiBackend`)."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def status(self) -> dict[str, Any]:
        return self._node.status()

    def members(self) -> list[dict[str, Any]]:
        return self._node.member_rows()

    def gpus(self) -> dict[str, Any]:
        return self._node.gpus()

    async def probe_gpus(self) -> dict[str, Any]:
        return await self._node.probe_gpus()

    def request_leave(self) -> None:
        self._node.request_leave()


class _Held:
    """`name in _Held(core)`: whether the core holds that member (any state)."""

    def __init__(self, core: Membership) -> None:
        self._core = core

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._core.member(name) is not None


def _asdict(value: Any) -> dict[str, Any]:
    import attrs

    out = attrs.asdict(value)
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}


def _protocol_version() -> int:
    from swim import PROTOCOL_VERSION

    return int(PROTOCOL_VERSION)


def _guess_local_address(*, ipv6: bool) -> str:
    """The address this host would use to reach the outside (no packet is sent)."""
    family = socket.AF_INET6 if ipv6 else socket.AF_INET
    target = "2001:db8::1" if ipv6 else "192.0.2.1"  # documentation ranges: never routed
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            host = str(s.getsockname()[0])
            ipaddress.ip_address(host)
            return host
    except OSError:
        return "::1" if ipv6 else "127.0.0.1"


def run_node(config: NodeConfig) -> None:
    """Run a daemon in the foreground until it leaves (the `populi-node up` command).

    Raises:
        NodeStartError: the daemon could not start (one line).
    """
    from ._log import configure_logging

    configure_logging(config.log_level)
    trio.run(Node(config).run)
