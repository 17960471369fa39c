"""The daemon: `populi-node up`. Composes the node's services and wires them together.

Each concern is a service in `populi_p2p.services`, with its own state and its own
``run(task_status=...)`` started in the node's nursery; services talk through narrow
interfaces (membership events in, commands out) and never reach into each other:

=====================  ================================================================
credentials            the key, the authority key and the enrollment certificate,
                       verified before any socket opens (`NodeStartError` otherwise)
codec                  every datagram and frame sealed and opened (`AuthCodec`)
membership             the swim core and its driver; ``subscribe()`` fans events out
roster                 verified records, member names, name clashes, the member rows
links                  who needs our certificate again; UDP-blocked warnings
publisher              signs our `NodeRecord`; re-signs it when the GPUs change
gpus                   the GPU monitor (probe modules imported when it runs)
discovery              join, retry, re-join after a partition (`Bootstrapper`)
mdns                   `_populi._udp` on the LAN, when ``--mdns``
revocations            revocation files and their gossip
app channel            the swim application channel: payload kinds, the sync section
leases                 the lease table, the owner election, the tasks run here
store                  members and incarnation across restarts
api                    the control API on ``STATE_DIR/api.sock``
lifecycle              signals and the graceful leave
=====================  ================================================================

`docs/architecture.md` draws them and says how to add one. A restarted node keeps its
node id (the key file) and starts with an incarnation above any it used before (the
store), so its "alive" overrides the "dead" or "left" the others remember.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Final

import attrs
import trio

from overlay.auth import DEFAULT_FRESHNESS, PacketAuthenticator
from overlay.base import Address, TransportError, format_address
from overlay.transport import Transport, TransportConfig
from swim import Event

from ._keyfiles import encode_public_key
from ._log import event, get_logger
from .api import ApiClient
from .authority import cluster_fingerprint
from .config import NodeConfig, parse_api_listen
from .envelope_keys import EnvelopeKeys
from .inference.engines import EngineService
from .inference.keys import ApiKeyChecker, request_authorizer
from .inference.peer_api import PeerApi, PeerRoutes
from .inference.peer_auth import PeerCallSigner, PeerCallVerifier
from .inference.peer_client import PeerClient
from .inference.route import Candidate
from .inference.service import InferenceService
from .leases import LeaseConfig
from .leases.reliability import Outcome
from .observe import EventService, MetricSources, MetricsService, NodeCollector, ObserveView
from .observe.web import AsgiApp, make_observe_app
from .observe.web import handles as observe_paths
from .record import NodeStatus
from .record_book import RecordBook
from .services.addressing import Addressing, advertise_host, choose_addresses, outside_accept
from .services.api_server import ApiService
from .services.app_channel import AppChannel, AppKind
from .services.clock import CertificateWatch, SkewWatch
from .services.codec import WIRE_PACKET_BUDGET, AuthCodec, lane
from .services.credentials import Credentials, load_credentials
from .services.discovery import Discovery
from .services.errors import NodeStartError
from .services.executor import ExecutorConfig, ExecutorService
from .services.gpus import GpuService
from .services.leases import LeaseService
from .services.lifecycle import LEAVE_TIMEOUT, Lifecycle
from .services.links import LinkService
from .services.mdns import MdnsService
from .services.membership import MembershipService
from .services.memory import StoreService
from .services.preflight import check_state_dir, describe_os_error
from .services.publisher import RecordPublisher
from .services.revocations import RevocationService
from .services.roster import Roster
from .services.status import StatusView
from .services.task_logs import TaskLogs
from .services.task_results import RESULT_TAIL_BYTES

__all__ = ["LEAVE_TIMEOUT", "Node", "NodeStartError", "run_node"]

#: Longest the first record waits for the first GPU report, seconds.
GPU_FIRST_REPORT_WAIT: Final = 3.0

#: The codec under its historical name (tests and tools import it from here).
_AuthCodec = AuthCodec

_log = get_logger("node")
#: The lease preset for each swim preset.
_LEASE_PRESETS: Final = {"lan": LeaseConfig.lan, "wan": LeaseConfig.wan, "local": LeaseConfig.local}


class _Parts:
    """The services that exist before the first socket opens."""

    def __init__(self, config: NodeConfig, creds: Credentials, started_at: float) -> None:
        swim_config = config.swim_config()
        self.envelope_keys = EnvelopeKeys(
            creds.identity, creds.certificate, creds.authority_key, revocations=creds.revocations
        )
        auth = PacketAuthenticator(
            self.envelope_keys,
            self.envelope_keys,
            cluster_secret=creds.cluster_secret,
            max_packet_size=TransportConfig().max_datagram_size,
            freshness=(
                DEFAULT_FRESHNESS if config.max_clock_skew is None else config.max_clock_skew
            ),
        )
        budget = max(512, WIRE_PACKET_BUDGET - auth.overhead())
        self.swim_config = attrs.evolve(
            swim_config, packet_budget=budget, app_channel_enabled=True,
            app_payload_size_max=max(256, budget - 256),  # key, source and framing
        )  # fmt: skip
        self.app = AppChannel()
        self.codec = AuthCodec(auth, TransportConfig().tcp.max_frame_size)
        records = RecordBook(
            creds.authority_key,
            revocations=creds.revocations,
            max_record_bytes=self.swim_config.meta_size_max,
        )
        node_id = creds.identity.node_id
        self.roster = Roster(node_id, records)
        self.revocations = RevocationService(creds.files, creds.revocations, creds.authority_key)
        self.app.register(AppKind.REVOCATIONS, self.revocations.on_app, self.revocations)
        self.skew = SkewWatch()
        self.codec.set_stale_handler(self.skew.observe)
        public = encode_public_key(creds.identity.public_key)
        self.certificate = CertificateWatch(creds.decoded, public, str(config.cert_path))
        self.revocations.on_change(self.envelope_keys.update_revocations)
        self.revocations.on_change(self.roster.update_revocations)
        self.publisher = RecordPublisher(
            creds.identity, creds.certificate, name=config.name, labels=dict(config.labels),
            started_at=started_at, on_signed=self.roster.accept_own,
            max_bytes=min(self.swim_config.meta_size_max, self.swim_config.packet_budget - 64),
        )  # fmt: skip
        roster = self.roster
        self.events = EventService(
            name_of=lambda nid: n if (n := roster.name_of(nid)) != "?" else nid[:12]
        )
        self.metrics = MetricsService()
        events, publisher = self.events, self.publisher

        async def gpu_changed(report: Any) -> None:
            events.gpu_report(report)
            await publisher.gpu_changed(report)

        self.gpus = GpuService(
            gpu_changed,
            reserve_vram=config.reserve_vram,
            withheld=config.withhold_gpu,
            labels=dict(config.labels),
            declared=config.advertise_gpu,
            interval=config.gpu_probe_interval,
        )


class Node:
    """One populi daemon. `await Node(config).run()` until it leaves or is cancelled."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.started_at = time.time()
        self._parts: _Parts | None = None
        self._view: StatusView | None = None
        self._lifecycle: Lifecycle | None = None
        #: Routes of the peer API (signed node-to-node HTTP); services add theirs
        #: before `run` (see `PeerRoutes.add`).
        self.peer_routes = PeerRoutes()
        self.peer_api: PeerApi | None = None
        #: Signed calls to other members' peer APIs (set once `run` has started).
        self.peer_client: PeerClient | None = None
        #: The OpenAI-compatible API and the relay (set once `run` has started).
        self.inference: InferenceService | None = None
        #: The observability routes (`populi_p2p.observe.web`), once the node runs: served
        #: on the API socket; `observe.mount` puts them on another listener.
        self.observe_app: AsgiApp | None = None
        #: What those routes read; `provide("tasks", rows)` fills the page's task table.
        self.observe: ObserveView | None = None
        self._leases: LeaseService | None = None
        self.executor: ExecutorService | None = None
        #: `populi-node logs` from any node (set once `run` has started).
        self.task_logs: TaskLogs | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start everything, serve until a leave completes or the task is cancelled.

        Raises:
            NodeStartError: bad credentials, no usable address, port in use, another
                daemon on the same state dir.
        """
        config = self.config
        check_state_dir(config.state_dir, config.api_socket)
        creds = load_credentials(config)
        parts = self._parts = _Parts(config, creds, self.started_at)
        if ApiClient(config.api_socket, timeout=2.0).is_running():
            raise NodeStartError(
                f"another populi daemon is running on state dir {config.state_dir}"
                " (stop it with populi-node leave, or use another --state-dir)"
            )
        addressing = await choose_addresses(config)
        store, incarnation = StoreService.open(config.store_path)
        started = False
        try:
            async with trio.open_nursery() as nursery:
                await self._start(nursery, creds, parts, addressing, store, incarnation)
                started = True
                task_status.started()
        except BaseExceptionGroup as group:
            error = None if started else _start_error(group)
            if error is None:
                raise
            raise error from None
        finally:
            store.close()
            try:
                config.api_socket.unlink()
            except OSError:
                pass

    async def _start(
        self,
        nursery: trio.Nursery,
        creds: Credentials,
        parts: _Parts,
        addressing: Addressing,
        store: StoreService,
        incarnation: int,
    ) -> None:
        config = self.config
        bind, overlay = addressing.bind, addressing.overlay
        transport = Transport(
            bind, config.port, policy=addressing.policy, classify=lane, dual_stack=bind == "::"
        )
        try:
            local = await nursery.start(transport.run)
        except (TransportError, ValueError) as exc:
            raise NodeStartError(
                f"cannot listen on {bind} port {config.port}: {exc}"
                " (is another node using the port? pick one with --port)"
            ) from None
        advertise: Address = (advertise_host(config, overlay, bind), local[1])
        outside = outside_accept(advertise[0], addressing.policy, overlay)
        if outside is not None:
            event(_log, 30, "advertise.outside_accept", message=outside)
        parts.publisher.advertise = advertise
        parts.codec.set_tcp_answer_handler(transport.paths.record_tcp_received)
        node_id = creds.identity.node_id
        await self._start_peer_api(nursery, creds, parts, bind, local[1])
        engines = None
        if config.engine:
            engines = EngineService(config.engine, parts.publisher.set_section)
            await nursery.start(engines.run)  # the first record carries the models
        membership = MembershipService(
            parts.swim_config, node_id, advertise, meta=parts.publisher.sign(),
            incarnation=incarnation, transport=transport, codec=parts.codec,
            max_datagram_size=transport.config.max_datagram_size, now=trio.current_time(),
            app_state=parts.app,
        )  # fmt: skip
        parts.app.attach(membership.broadcast_app)
        try:
            runner = ExecutorService(ExecutorConfig(
                tasks_dir=config.state_dir / "tasks", task_user=config.task_user,
                tail_bytes=RESULT_TAIL_BYTES,
            ))  # fmt: skip
        except ValueError as exc:
            raise NodeStartError(str(exc)) from None
        self.executor = runner
        leases = self._leases = LeaseService(
            _LEASE_PRESETS[config.preset](), creds.identity, config.state_dir / "leases.sqlite3",
            runner=runner, channel=parts.app, submit_acks=config.submit_acks,
        )  # fmt: skip
        leases.attach(
            members=membership.members, record_of=parts.roster.records.get,
            allocate=parts.gpus.allocate, set_draining=parts.publisher.set_draining,
        )  # fmt: skip
        self.task_logs = TaskLogs(
            node_id, find=leases.find, executor=runner, record_of=parts.roster.records.get,
            peer_client=lambda: self.peer_client,
        )  # fmt: skip
        self.task_logs.register_peer_routes(self.peer_routes)
        codec = parts.codec

        parts.roster.attach(membership, on_known=store.remember, on_gone=store.forget)
        parts.publisher.attach(membership.set_meta, lambda: not membership.has_left)
        parts.revocations.attach(functools.partial(parts.app.broadcast, AppKind.REVOCATIONS))
        store.attach(lambda: membership.incarnation)
        links = LinkService(node_id, codec, transport, membership.holds())
        peers = [(p, advertise[1]) for p in overlay.peers]  # Tailscale's online peers
        discovery = Discovery(
            membership, advertise, bootstrap=[*config.bootstrap, *peers],
            remembered=lambda: [(m.host, m.port) for m in store.known_members()
                                if m.node_id != node_id],
            probe_interval=parts.swim_config.probe_interval,
        )  # fmt: skip
        parts.metrics.register(NodeCollector(MetricSources(
            node_id=node_id, name=config.name, members=membership.members,
            awareness=lambda: membership.awareness, swim=membership.statistics,
            driver=membership.driver_statistics, transport=transport.statistics,
            traffic=lambda: (codec.bytes_in, codec.bytes_out),
            auth_drops=codec.auth.drops.as_dict, record_drops=parts.roster.records.drops.as_dict,
            gpu_report=lambda: parts.gpus.report, event_counts=lambda: parts.events.counts,
            events_dropped=lambda: parts.events.dropped,
        )))  # fmt: skip
        self.observe = ObserveView(parts.metrics, parts.events, self.status, self.member_rows)
        self.observe_app = make_observe_app(self.observe)
        api = ApiService(config.api_socket, _Backend(self), extra=self.observe_app)

        def stop_api() -> None:
            parts.events.close()  # open event streams end now, not at the grace timeout
            api.stop()

        lifecycle = self._lifecycle = Lifecycle(
            leave=membership.leave, announced=lambda: membership.leave_announced,
            flush=store.flush, stop_api=stop_api, api_done=api.done,
            stop_node=nursery.cancel_scope.cancel,
        )  # fmt: skip
        self._view = StatusView(
            config, creds.identity, creds.authority_key, self.started_at, advertise, overlay,
            addressing.policy, codec, transport, membership, parts.roster, discovery,
            left=lambda: lifecycle.left,
            notices=lambda: [
                *([outside] if outside is not None else []),
                *parts.certificate.notices(),
                *parts.skew.notices(),
            ],
        )  # fmt: skip
        # Subscribe before the core runs, so that no subscriber misses an event.
        subscribers = [(parts.roster.run, membership.subscribe()),
                       (links.run, membership.subscribe()),
                       (store.run, membership.subscribe()),
                       (parts.events.run, membership.subscribe()),
                       (parts.app.run, membership.subscribe())]  # fmt: skip
        discovery_events = membership.subscribe()
        lease_events = membership.subscribe()
        for run, events in subscribers:
            await nursery.start(run, events)
        await nursery.start(runner.run)
        await nursery.start(leases.run, lease_events)
        await nursery.start(membership.run)
        await nursery.start(lifecycle.run)
        await self._start_inference(nursery, creds, parts, membership, engines)
        try:
            await nursery.start(api.run)
        except OSError as exc:
            raise NodeStartError(
                f"cannot create the API socket {config.api_socket}: {exc}"
            ) from None
        # The API answers from here. The GPU probe (and its imports) is off that path;
        # joining waits for its first report (bounded: a wedged driver must not hold the
        # node out of the mesh), so the record the mesh first hears carries the GPUs.
        nursery.start_soon(parts.gpus.run)
        nursery.start_soon(_join_once_probed, parts.gpus, discovery, discovery_events)
        await nursery.start(parts.revocations.run)
        await nursery.start(parts.certificate.run)
        fingerprint = cluster_fingerprint(creds.authority_key)
        if config.mdns:
            mdns = MdnsService(
                node_id, bind=transport.local_address[0], advertise=advertise,
                fingerprint=fingerprint, overlay_interface=overlay.interface,
                on_found=discovery.found_on_lan,
            )  # fmt: skip
            await nursery.start(mdns.run)
        event(_log, 20, "overlay.detected", kind=str(overlay.kind), detail=overlay.describe())
        event(
            _log, 20, "node.ready",
            name=config.name, id=node_id, addr=format_address(advertise),
            inc=incarnation, cluster=fingerprint,
            overlay=str(overlay.kind), accept=",".join(addressing.policy.cidrs),
            preset=config.preset, api=str(config.api_socket),
        )  # fmt: skip

    async def _start_peer_api(
        self, nursery: trio.Nursery, creds: Credentials, parts: _Parts, bind: str, port: int
    ) -> None:
        """The peer API on the bind address; its port goes into the record (section
        ``peer``) before the first record is signed."""
        config = self.config
        # Default: the swim port + 1, or the kernel's choice when that is taken (the
        # port is advertised in the record, so any port works) or the swim port is 0.
        explicit = config.peer_port is not None
        wanted = (
            config.peer_port
            if config.peer_port is not None
            else ((port + 1) % 0x10000 if config.port else 0)
        )
        node_id = creds.identity.node_id
        verifier = PeerCallVerifier(parts.envelope_keys, node_id, clock=time.time)
        bound: int | None = None
        for attempt in (wanted, 0):
            api = self.peer_api = PeerApi(verifier, self.peer_routes, host=bind, port=attempt)
            try:
                bound = await nursery.start(api.run)
                break
            except (OSError, BaseExceptionGroup) as exc:
                error = _os_error(exc)
                if error is None:
                    raise
                if explicit or attempt == 0:
                    raise NodeStartError(
                        f"cannot listen for peer calls on {bind} port {attempt}: {error.strerror}"
                        " (pick another with --peer-port; 0 lets the kernel choose)"
                    ) from None
        assert bound is not None
        await parts.publisher.set_section("peer", {"port": bound})
        self.peer_client = PeerClient(
            PeerCallSigner(creds.identity, creds.certificate, clock=time.time)
        )

    async def _start_inference(
        self,
        nursery: trio.Nursery,
        creds: Credentials,
        parts: _Parts,
        membership: MembershipService,
        engines: EngineService | None,
    ) -> None:
        """The inference service: peer routes always (so members can use our engines),
        the public API when ``--api-listen`` is given."""
        config = self.config
        node_id = creds.identity.node_id
        roster = parts.roster
        listen = parse_api_listen(config.api_listen) if config.api_listen else None
        keys = None
        if listen is not None:
            required = config.require_api_keys or listen[0] not in ("127.0.0.1", "::1")
            keys = ApiKeyChecker(creds.authority_key, revocations=creds.revocations,
                                 required=required, clock=trio.current_time)  # fmt: skip
            parts.revocations.on_change(keys.update_revocations)

        def view() -> list[Candidate]:
            out = []
            for m in membership.members():
                record = roster.records.get(m.name)
                if record is None or roster.unverified_reason(m.name) is not None:
                    continue
                models = record.sections.get("models") or {}
                out.append(Candidate(
                    node_id=m.name, name=record.name, state=m.state.name.lower(),
                    draining=record.status is NodeStatus.DRAINING,
                    models=models if isinstance(models, dict) else {},
                    rtt=m.rtt, is_self=m.name == node_id,
                ))  # fmt: skip
            return out

        def address_of(node: str) -> tuple[str, int] | None:
            record = roster.records.get(node)
            peer = record.sections.get("peer") if record is not None else None
            port = peer.get("port") if isinstance(peer, dict) else None
            if record is None or not isinstance(port, int):
                return None
            return record.address, port

        def state_of(node: str) -> str | None:
            member = membership.member(node)
            return None if member is None else member.state.name.lower()

        service = self.inference = InferenceService(
            node_id, view=view, address_of=address_of, peer_client=self.peer_client,
            engines=engines, listen=listen, keys=keys, stall_timeout=config.stall_timeout,
            state_of=state_of, outcomes=self._lease_outcomes,
        )  # fmt: skip
        service.register_peer_routes(self.peer_routes)
        if self.observe is not None:  # the dashboard, /metrics and /events on this listener
            observe = make_observe_app(self.observe, authorize=request_authorizer(keys))
            service.mount_paths(observe_paths, observe)
        try:
            await nursery.start(service.run)
        except (OSError, BaseExceptionGroup) as exc:
            error = _os_error(exc)
            if error is None or listen is None:
                raise
            raise NodeStartError(
                f"cannot listen for the API on {config.api_listen}: {error.strerror}"
                " (pick another with --api-listen)"
            ) from None

    ####################################################################################
    # What the API shows (the public names other code and tests use)

    def status(self) -> dict[str, Any]:
        assert self._view is not None
        status = self._view.status()
        if self._leases is not None:
            status["tasks"] = self._leases.summary()
        return status

    def _lease_outcomes(self) -> list[Outcome] | None:
        """The lease table's task outcomes: reliability evidence for the router too."""
        return None if self._leases is None else self._leases.table.outcomes()

    @property
    def leases(self) -> LeaseService:
        assert self._leases is not None, "the node has not started"
        return self._leases

    def member_rows(self) -> list[dict[str, Any]]:
        return [] if self._parts is None else self._parts.roster.member_rows()

    def gpus(self) -> dict[str, Any]:
        assert self._parts is not None
        return self._parts.gpus.gpus()

    async def probe_gpus(self) -> dict[str, Any]:
        """Re-probe the GPUs now; a change is signed and gossiped before this returns."""
        assert self._parts is not None
        return await self._parts.gpus.probe_now()

    def inference_requests(self) -> dict[str, Any]:
        """The recent routes of this node's inference API, and its engines."""
        service = self.inference
        return {
            "listening": None if service is None else service.port,
            "requests": [] if service is None else service.recent_routes(),
            "engines": [] if service is None else service.engines(),
        }

    def request_leave(self) -> None:
        """Start a graceful leave (API or signal); `run` then returns."""
        if self._lifecycle is not None:
            self._lifecycle.request_leave()


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

    # The tasks part of the API (`api.TaskBackend`).

    async def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return await self._node.leases.submit(spec)

    def tasks(self) -> list[dict[str, Any]]:
        return self._node.leases.rows()

    def task(self, task_id: str) -> dict[str, Any]:
        return self._node.leases.detail(task_id)

    def explain(self, task_id: str) -> dict[str, Any]:
        return self._node.leases.explain(task_id)

    async def cancel(self, task_id: str) -> dict[str, Any]:
        return await self._node.leases.cancel(self._node.leases.find(task_id).task_id)

    async def logs(self, task_id: str, stream: object, offset: object) -> dict[str, Any]:
        assert self._node.task_logs is not None
        return await self._node.task_logs.read(task_id, stream, offset)

    async def drain(self, handoff: bool) -> dict[str, Any]:
        return await self._node.leases.drain(handoff)

    async def undrain(self) -> dict[str, Any]:
        return await self._node.leases.undrain()

    def extra_routes(self) -> dict[str, tuple[str, Any]]:
        return {"/v1/inference/requests": ("GET", self._node.inference_requests)}


async def _join_once_probed(
    gpus: GpuService, discovery: Discovery, events: trio.MemoryReceiveChannel[Event]
) -> None:
    with trio.move_on_after(GPU_FIRST_REPORT_WAIT):
        await gpus.ready.wait()
    await discovery.run(events)


def _os_error(exc: BaseException) -> OSError | None:
    """The first `OSError` in `exc` (itself, or a leaf of an exception group)."""
    pending = [exc]
    while pending:
        current = pending.pop(0)
        if isinstance(current, OSError):
            return current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
    return None


def _start_error(group: BaseExceptionGroup[BaseException]) -> NodeStartError | None:
    """The one line to show for a start-up that failed inside the nursery, if any.

    A service that cannot start raises `NodeStartError`, or an `OSError` from a library
    (hypercorn binding the socket): either becomes one line. Anything else is a bug and
    is left to propagate.
    """
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        else:
            leaves.append(exc)
    for exc in leaves:
        if isinstance(exc, NodeStartError):
            return exc
    for exc in leaves:
        if isinstance(exc, OSError):
            return NodeStartError(
                describe_os_error(exc, "start-up", "check --state-dir, --bind and --port")
            )
    return None


def run_node(config: NodeConfig) -> None:
    """Run a daemon in the foreground until it leaves (the `populi-node up` command).

    Raises:
        NodeStartError: the daemon could not start (one line).
    """
    from ._log import configure_logging

    configure_logging(config.log_level)
    trio.run(Node(config).run)
