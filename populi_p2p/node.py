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
leases                 the lease agent (ownership by agreement), the tasks run here
store                  members and incarnation across restarts
api                    the control API on ``STATE_DIR/api.sock``
lifecycle              signals and the graceful leave
inference host         the peer API, the engines and the inference service
                       (`services.inference_host`)
=====================  ================================================================

The services that need no socket are built in `services.node_parts`: what the
membership is built from (`MembershipParts`) before it, the rest (`NodeParts`) after
it, each with its collaborators; the API's view of the node is
`services.api_backend.NodeBackend`.

`docs/architecture.md` draws them and says how to add one. A restarted node keeps its
node id (the key file) and starts with an incarnation above any it used before (the
store), so its "alive" overrides the "dead" or "left" the others remember.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import trio

from overlay.base import Address, TransportError, format_address
from overlay.transport import Transport
from swim import Event, MemberState

from ._asgi import AsgiApp
from ._http_serve import OPEN_FILES_LOW, HttpLimits, raise_open_file_limit
from ._log import event, get_logger
from .api import ApiClient
from .artifacts.runner import ArtifactRunner, artifact_runner
from .config import NodeConfig
from .deploy.runner import DeploymentRunner
from .deploy.service import DeployService, deploys_section
from .executor.results import RESULT_TAIL_BYTES
from .executor.service import ExecutorConfig, ExecutorService, parse_uid_range
from .leases.driver.service import LeaseService
from .leases.reliability import Outcome
from .observe import EventService, ObserveView
from .observe.sections import task_rows
from .observe.web import make_observe_app
from .presets import Presets, resolve_preset
from .services._lazy import import_in_thread
from .services.addressing import (
    Addressing,
    advertise_host,
    choose_addresses,
    loopback_with_discovery,
    outside_accept,
)
from .services.api_backend import NodeBackend
from .services.api_server import ApiService
from .services.codec import AuthCodec, lane
from .services.credentials import Credentials, load_credentials
from .services.discovery import Discovery
from .services.errors import NodeStartError, start_error
from .services.lifecycle import LEAVE_TIMEOUT, Lifecycle
from .services.links import LinkService
from .services.mdns import MdnsService
from .services.membership import MembershipService
from .services.memory import StoreService, open_store
from .services.node_parts import MembershipParts, NodeParts
from .services.preflight import check_state_dir
from .services.reachability import PeerReachability
from .services.status import StatusView
from .store import MemberStore
from .trust.authority import cluster_fingerprint
from .trust.operator import operator_checker

if TYPE_CHECKING:  # imported when first used, after the API answers (start-up CPU)
    from prometheus_client.registry import Collector

    from .artifacts.service import ArtifactService
    from .blobs.service import BlobService
    from .executor.logs import TaskLogs
    from .inference.peer_api import PeerRoutes
    from .inference.peer_client import PeerClient
    from .inference.service import InferenceService
    from .services.inference_host import InferenceHost
    from .trust.record import NodeRecord

__all__ = ["LEAVE_TIMEOUT", "Node", "NodeStartError", "run_node"]

#: Longest the first record waits for the first GPU report, seconds.
GPU_FIRST_REPORT_WAIT: Final = 3.0

#: The codec under its historical name (tests and tools import it from here).
_AuthCodec = AuthCodec

_log = get_logger("node")


def _remembered(store: StoreService, node_id: str) -> list[Address]:
    """Members the store remembers from earlier runs, to retry joining (not us)."""
    return [(m.host, m.port) for m in store.known_members() if m.node_id != node_id]


def _task_collector(leases: LeaseService) -> Collector:
    """The tasks' and leases' metric families (prometheus-client: at the first scrape)."""
    from .observe.work_collector import TaskCollector

    return TaskCollector(leases.statistics)


def _blob_collector_of(statistics: Callable[[], dict[str, Any] | None]) -> Collector:
    """The blob store's metric families (prometheus-client: at the first scrape)."""
    from .observe.work_collector import BlobCollector

    return BlobCollector(statistics)


def _stop_api(events: EventService, api: ApiService) -> None:
    events.close()  # open event streams end now, not at the grace timeout
    api.stop()


def _raise_open_files() -> None:
    """The soft open-file limit up to the hard one: the HTTP listeners' connection caps
    follow it (`HttpLimits.for_open_files`); one line says when it stays low."""
    soft, hard = raise_open_file_limit()
    if soft < OPEN_FILES_LOW:
        event(
            _log, 30, "node.open_files_low", limit=soft, hard=hard,
            per_listener=HttpLimits.for_open_files(soft).total,
            message=f"raise the hard limit (LimitNOFILE= in the unit, ulimit -Hn) to"
            f" {OPEN_FILES_LOW} or more for more HTTP connections",
        )  # fmt: skip


class Node:
    """One populi daemon. `await Node(config).run()` until it leaves or is cancelled."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        #: The ``--preset`` resolved, once: each service gets its part from here.
        self.presets: Presets = resolve_preset(config.preset)
        self.started_at = time.time()
        self._parts: NodeParts | None = None
        self._view: StatusView | None = None
        self._lifecycle: Lifecycle | None = None
        #: The peer API, the engines and the inference service (once the API answers).
        self.inference_host: InferenceHost | None = None
        self._peer_routes: PeerRoutes | None = None
        #: The observability routes (`populi_p2p.observe.web`), once the node runs: served
        #: on the API socket; `observe.mount` puts them on another listener.
        self.observe_app: AsgiApp | None = None
        #: What those routes read; `provide("tasks", rows)` fills the page's task table.
        self.observe: ObserveView | None = None
        self._leases: LeaseService | None = None
        self._store: StoreService | None = None
        self.executor: ExecutorService | None = None
        #: `populi-node logs` from any node (set once `run` has started).
        self.task_logs: TaskLogs | None = None
        #: Model blobs: the store, the chunk routes, pulls (once the API answers).
        self.blobs: BlobService | None = None
        #: Deployed models: the replicas run here, and deploy/deployments/undeploy.
        self.deploy_runner: DeploymentRunner | None = None
        self.deploy: DeployService | None = None
        #: Task inputs and outputs (docs/artifacts.md): the runner and the service.
        self.artifact_runner: ArtifactRunner | None = None
        self.artifacts: ArtifactService | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start everything, serve until a leave completes or the task is cancelled.

        Raises:
            NodeStartError: bad credentials, no usable address, port in use, another
                daemon on the same state dir.
        """
        config = self.config
        check_state_dir(config.state_dir, config.api_socket)
        _raise_open_files()
        creds = load_credentials(config)
        core = MembershipParts(config, self.presets.swim, creds, self.started_at)
        if ApiClient(config.api_socket, timeout=2.0).is_running():
            raise NodeStartError(
                f"another populi daemon is running on state dir {config.state_dir}"
                " (stop it with populi-node leave, or use another --state-dir)"
            )
        addressing = await choose_addresses(config)
        member_store, incarnation = open_store(config.store_path)
        started = False
        try:
            async with trio.open_nursery() as nursery:
                await self._start(nursery, creds, core, addressing, member_store, incarnation)
                started = True
                task_status.started()
        except BaseExceptionGroup as group:
            error = None if started else start_error(group)
            if error is None:
                raise
            raise error from None
        finally:
            if self._store is not None:
                self._store.close()
            elif member_store is not None:
                member_store.close()
            try:
                config.api_socket.unlink()
            except OSError:
                pass

    async def _start(
        self,
        nursery: trio.Nursery,
        creds: Credentials,
        core: MembershipParts,
        addressing: Addressing,
        member_store: MemberStore | None,
        incarnation: int,
    ) -> None:
        """Build the services in dependency order, each with its collaborators, then
        start them in start-up order (docs/architecture.md)."""
        config = self.config
        transport, port, advertise, notices = await self._listen(nursery, core, addressing)
        node_id = creds.identity.node_id
        reachability = PeerReachability()  # every failed send, logged and in `status`
        own_record = core.signer.sign()  # the first: our member's metadata
        membership = MembershipService(
            core.swim_config, node_id, advertise, meta=own_record.raw,
            incarnation=incarnation, transport=reachability.watch(transport), codec=core.codec,
            max_datagram_size=transport.config.max_datagram_size, now=trio.current_time(),
            app_state=core.sections,
        )  # fmt: skip
        store = self._store = StoreService(member_store, membership)
        parts = self._parts = NodeParts(config, creds, core, membership, store, own_record)
        runner = self._runners(parts, node_id)
        leases = self._leases = LeaseService(
            self.presets.lease, creds.identity, config.state_dir / "leases.sqlite3",
            runner=runner, channel=parts.app, members=membership.members,
            record_of=parts.roster.records.get, allocate=parts.gpus.allocate,
            set_draining=parts.publisher.set_draining, send=membership.send_app,
            check_operator=operator_checker(creds.authority_key, parts.revocations.current),
        )  # fmt: skip
        links = LinkService(node_id, parts.codec, transport, membership.holds())
        peers = [(p, advertise[1]) for p in addressing.overlay.peers]  # Tailscale's peers
        discovery = Discovery(
            membership, advertise, bootstrap=[*config.bootstrap, *peers],
            remembered=functools.partial(_remembered, store, node_id),
            probe_interval=parts.swim_config.probe_interval, reachability=reachability,
        )  # fmt: skip
        reachability.describe = discovery.describe
        parts.register_metrics(node_id, config.name, membership, transport)
        api = self._api(parts, leases)
        lifecycle = self._lifecycle = Lifecycle(
            leave=membership.leave, announced=lambda: membership.leave_announced,
            flush=store.flush, stop_api=functools.partial(_stop_api, parts.events, api),
            api_done=api.done, stop_node=nursery.cancel_scope.cancel,
        )  # fmt: skip
        self._view = StatusView(
            config, creds.identity, creds.authority_key, self.started_at, advertise,
            addressing.overlay, addressing.policy, parts.codec, transport, membership,
            parts.roster, discovery, left=lambda: lifecycle.left,
            notices=lambda: [*notices, *parts.certificate.notices(), *parts.skew.notices()],
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
        assert self.executor is not None and self.deploy_runner is not None
        await nursery.start(self.executor.run)
        await nursery.start(self.deploy_runner.run)
        await nursery.start(runner.run)
        self.deploy = self._deploy_service(parts, membership, leases)
        await nursery.start(leases.run, lease_events)
        await nursery.start(membership.run)
        await nursery.start(lifecycle.run)
        http = functools.partial(
            self._start_http, nursery, creds, parts, membership, addressing.bind, port
        )
        await self._serve(nursery, parts, api, http, discovery, discovery_events)
        await self._start_late(nursery, creds, addressing, transport, advertise, discovery)
        self._ready(creds, addressing, advertise, incarnation)

    def _runners(self, parts: NodeParts, node_id: str) -> ArtifactRunner:
        """The task runner chain: the executor, deployments around it, artifacts
        around both (each hands on what is not its own)."""
        config = self.config
        executor = self.executor = self._executor()
        self.deploy_runner = self._deploy_runner(executor, parts)
        self.artifact_runner = artifact_runner(
            self.deploy_runner, state_dir=config.state_dir, me=node_id,
            blobs=lambda: self.blobs, service=lambda: self.artifacts,
            retention=config.output_retention, table=lambda: self._leases,
        )  # fmt: skip
        return self.artifact_runner

    def _blob_collector(self) -> Collector:
        return _blob_collector_of(lambda: None if self.blobs is None else self.blobs.statistics())

    def _api(self, parts: NodeParts, leases: LeaseService) -> ApiService:
        """The control API on its socket, with the page, events and metrics."""
        parts.metrics.register_factory(functools.partial(_task_collector, leases))
        parts.metrics.register_factory(self._blob_collector)
        self.observe = ObserveView(parts.metrics, parts.events, self.status, self.member_rows)
        self.observe.provide("tasks", lambda: task_rows(leases.rows(), parts.roster.name_of))
        self.observe_app = make_observe_app(self.observe)
        return ApiService(self.config.api_socket, NodeBackend(self), extra=self.observe_app)

    async def _listen(
        self, nursery: trio.Nursery, core: MembershipParts, addressing: Addressing
    ) -> tuple[Transport, int, Address, list[str]]:
        """The transport, bound and running: it, its port, the address we advertise
        and the warnings about who can reach it (none when all is well)."""
        config = self.config
        bind, overlay = addressing.bind, addressing.overlay
        transport = Transport(
            bind, config.port, policy=addressing.policy, classify=lane, dual_stack=bind == "::",
            paths=core.paths,
        )  # fmt: skip
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
        loopback = loopback_with_discovery(advertise[0], config)
        if loopback is not None:
            event(_log, 30, "advertise.loopback", message=loopback)
        core.signer.advertise = advertise
        return transport, local[1], advertise, [w for w in (outside, loopback) if w is not None]

    def _deploy_runner(self, executor: ExecutorService, parts: NodeParts) -> DeploymentRunner:
        """The node's task runner: the executor, and deployed replicas around it."""
        return DeploymentRunner(
            executor, engine=self.config.deploy_engine, blobs=lambda: self.blobs,
            engines=lambda: None if self.inference_host is None else self.inference_host.engines,
            set_section=parts.publisher.set_section,
        )  # fmt: skip

    def _deploy_service(
        self, parts: NodeParts, membership: MembershipService, leases: LeaseService
    ) -> DeployService:
        """``deploy``, ``deployments``, ``undeploy`` (docs/models.md, "Deployments")."""

        def deploys_of(node: str) -> Any:
            record = parts.roster.records.get(node)
            return None if record is None else deploys_section(record.sections)

        return DeployService(
            submit=leases.submit, cancel=leases.cancel, entries=lambda: leases.table,
            why=leases.agent.why.get, blobs=lambda: self.blobs, deploys_of=deploys_of,
            alive=lambda node: node == leases.me or membership.is_live(node),
            name_of=parts.roster.name_of,
        )  # fmt: skip

    def _executor(self) -> ExecutorService:
        """The task executor, from `--task-user` and `--task-uids` (one line if bad)."""
        config = self.config
        try:
            return ExecutorService(ExecutorConfig(
                tasks_dir=config.state_dir / "tasks", task_user=config.task_user,
                task_uids=parse_uid_range(config.task_uids), tail_bytes=RESULT_TAIL_BYTES,
                fence_grace=self.presets.lease.fence_grace,
            ))  # fmt: skip
        except ValueError as exc:
            raise NodeStartError(str(exc)) from None

    async def _serve(
        self,
        nursery: trio.Nursery,
        parts: NodeParts,
        api: ApiService,
        http: Callable[[], Awaitable[None]],
        discovery: Discovery,
        discovery_events: trio.MemoryReceiveChannel[Event],
    ) -> None:
        """The control API, the GPU service, node-to-node HTTP, then joining."""
        config = self.config
        serves_inference = bool(config.engine or config.gguf or config.api_listen)
        if serves_inference:  # when the API answers, so does the inference API
            await http()
        try:
            await nursery.start(api.run)
        except OSError as exc:
            raise NodeStartError(
                f"cannot create the API socket {config.api_socket}: {exc}"
            ) from None
        # The API answers from here. What it does not need is imported and started
        # after: the GPU probe, then (without --engine or --api-listen) node-to-node
        # HTTP (the inference package, httpx). Joining waits for both (the GPU report
        # bounded: a wedged driver must not hold the node out of the mesh), so the
        # record the mesh first hears carries the GPUs, the peer port and the models.
        nursery.start_soon(parts.gpus.run)
        if not serves_inference:
            await http()
        join = functools.partial(discovery.run, after=parts.gpus.ready)
        nursery.start_soon(
            functools.partial(join, wait_max=GPU_FIRST_REPORT_WAIT), discovery_events
        )

    async def _start_late(
        self,
        nursery: trio.Nursery,
        creds: Credentials,
        addressing: Addressing,
        transport: Transport,
        advertise: Address,
        discovery: Discovery,
    ) -> None:
        """Revocations, the certificate watch and mDNS."""
        assert self._parts is not None
        await nursery.start(self._parts.revocations.run)
        await nursery.start(self._parts.certificate.run)
        if self.config.mdns:
            mdns = MdnsService(
                creds.identity.node_id, bind=transport.local_address[0],
                advertise=advertise,
                fingerprint=cluster_fingerprint(creds.authority_key),
                overlay_interface=addressing.overlay.interface, on_found=discovery.found_on_lan,
            )  # fmt: skip
            await nursery.start(mdns.run)

    def _ready(
        self, creds: Credentials, addressing: Addressing, advertise: Address, incarnation: int
    ) -> None:
        config, overlay = self.config, addressing.overlay
        event(_log, 20, "overlay.detected", kind=str(overlay.kind), detail=overlay.describe())
        event(
            _log, 20, "node.ready",
            name=config.name, id=creds.identity.node_id, addr=format_address(advertise),
            inc=incarnation, cluster=cluster_fingerprint(creds.authority_key),
            overlay=str(overlay.kind), accept=",".join(addressing.policy.cidrs),
            preset=config.preset, api=str(config.api_socket),
        )  # fmt: skip

    async def _start_http(
        self,
        nursery: trio.Nursery,
        creds: Credentials,
        parts: NodeParts,
        membership: MembershipService,
        bind: str,
        port: int,
    ) -> None:
        """Task logs from any node, the peer API, the engines and the inference service."""
        await import_in_thread(  # off the loop: the API and pings are answered meanwhile
            "populi_p2p.services.inference_host", "populi_p2p.executor.logs"
        )
        from .executor.logs import TaskLogs
        from .services.inference_host import InferenceHost

        assert self.executor is not None
        self.task_logs = TaskLogs(
            creds.identity.node_id, find=self.leases.find, executor=self.executor,
            record_of=parts.roster.records.get, peer_client=lambda: self.peer_client,
            is_member=membership.is_live,
        )  # fmt: skip
        self.task_logs.register_peer_routes(self.peer_routes)
        host = self.inference_host = InferenceHost(
            self.config,
            creds,
            parts.envelope_keys,
            parts.publisher,
            self.peer_routes,
            lease_config=self.presets.lease,
        )
        await self._start_blobs(nursery, creds, parts, membership)
        await host.start_peer(nursery, bind, port)  # the record gets the port and models
        await host.start_inference(
            nursery, members=membership.members, member=membership.member, roster=parts.roster,
            revocations=parts.revocations, outcomes=self._lease_outcomes, observe=self.observe,
            metrics=parts.metrics, loading=self._loading,
        )  # fmt: skip

    async def _start_blobs(
        self,
        nursery: trio.Nursery,
        creds: Credentials,
        parts: NodeParts,
        membership: MembershipService,
    ) -> None:
        """The blob store and service (docs/models.md): its section goes in the record."""
        await import_in_thread("populi_p2p.blobs.service")
        from .blobs.service import BlobService
        from .blobs.store import BlobStore

        roster = parts.roster

        def verified(node: str) -> NodeRecord | None:
            record = roster.records.get(node)
            return None if roster.unverified_reason(node) is not None else record

        def sections() -> dict[str, Any]:
            out = {}
            for m in membership.members():
                record = verified(m.name) if membership.is_live(m.name) else None
                if record is not None and "blobs" in record.sections:
                    out[m.name] = record.sections["blobs"]
            return out

        def address_of(node: str) -> tuple[str, int] | None:
            record = verified(node)
            peer = record.sections.get("peer") if record is not None else None
            port = peer.get("port") if isinstance(peer, dict) else None
            return (record.address, port) if record is not None and isinstance(port, int) else None

        store = BlobStore(self.config.state_dir / "blobs", self.config.blob_quota)
        self.blobs = BlobService(
            store, me=creds.identity.node_id, is_member=membership.is_live, sections=sections,
            address_of=address_of, peer_client=lambda: self.peer_client,
            set_section=parts.publisher.set_section, bandwidth=self.config.blob_bandwidth,
        )  # fmt: skip
        self.blobs.register_peer_routes(self.peer_routes)
        await nursery.start(self.blobs.run)
        await self._start_artifacts(nursery, membership)

    async def _start_artifacts(self, nursery: trio.Nursery, membership: MembershipService) -> None:
        """Task inputs and outputs (docs/artifacts.md): submit, hold, fetch, sweep."""
        await import_in_thread("populi_p2p.artifacts.service")
        from .artifacts.service import ArtifactService

        leases, runner = self.leases, self.artifact_runner
        gone = (MemberState.DEAD, MemberState.LEFT)
        assert runner is not None and self.blobs is not None
        self.artifacts = ArtifactService(
            blobs=lambda: self.blobs, me=leases.me, k=self.config.output_replicas,
            retention=self.config.output_retention, is_live=membership.is_live,
            live_members=lambda: [m.name for m in membership.members() if m.state not in gone],
            grant_of=leases.agent.grants.get, entry_of=leases.table.get, submit=leases.submit,
            address_of=self.blobs.address_of, peer_client=lambda: self.peer_client,
            running=lambda: set(runner.runs),
        )  # fmt: skip
        self.artifacts.register_peer_routes(self.peer_routes)
        await nursery.start(self.artifacts.run)

    ####################################################################################
    # What the API shows (the public names other code and tests use)

    def status(self) -> dict[str, Any]:
        assert self._view is not None
        status = self._view.status()
        if self._leases is not None:
            status["tasks"] = self._leases.summary()
            if self.task_logs is not None:
                status["tasks"]["logs_refused_not_member"] = self.task_logs.refused_not_member
        if self.blobs is not None:
            status["blobs"] = self.blobs.statistics()
        if self.artifacts is not None and self.artifact_runner is not None:
            runner = self.artifact_runner
            status["artifacts"] = {**self.artifacts.statistics(), **runner.stats,
                                   **runner.checkpoints_of().stats}  # fmt: skip
        host = self.inference_host
        if host is not None:
            status["http"] = host.http_statistics()
            if host.peer_api is not None:
                status["node"]["peer_port"] = getattr(host.peer_api, "port", None)
        return status

    def _loading(self, model: str) -> bool:
        """Whether `model` is deployed and may be served soon (requests then wait)."""
        return self.deploy is not None and self.deploy.loading(model)

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

    @property
    def peer_routes(self) -> PeerRoutes:
        """Routes of the peer API (signed node-to-node HTTP); services add theirs
        before `run` (see `PeerRoutes.add`). The inference package is imported here,
        on first use, so that a node answers its API before it loads."""
        if self._peer_routes is None:
            from .inference.peer_api import PeerRoutes

            self._peer_routes = PeerRoutes()
        return self._peer_routes

    @property
    def peer_client(self) -> PeerClient | None:
        """Signed calls to other members' peer APIs (set once `run` has started)."""
        return None if self.inference_host is None else self.inference_host.peer_client

    @property
    def inference(self) -> InferenceService | None:
        """The OpenAI-compatible API and the relay (set once `run` has started)."""
        return None if self.inference_host is None else self.inference_host.inference

    def request_leave(self) -> None:
        """Start a graceful leave (API or signal); `run` then returns."""
        if self._lifecycle is not None:
            self._lifecycle.request_leave()


def run_node(config: NodeConfig) -> None:
    """Run a daemon in the foreground until it leaves (the `populi-node up` command).

    Raises:
        NodeStartError: the daemon could not start (one line).
    """
    from ._log import configure_logging

    configure_logging(config.log_level)
    trio.run(Node(config).run)
