"""The inference host: the node's HTTP between members and to clients, wired in one place.

Three services from `populi_p2p.inference` (docs/inference.md), constructed here as the
node always has:

- the peer API (signed node-to-node HTTP, ``--peer-port``): its port goes into the
  record's ``peer`` section; other services add routes to `peer_routes` and call
  members with `peer_client`;
- the engines (``--engine``): their models go into the record's ``models`` section;
- the inference service: the OpenAI-compatible API on ``--api-listen`` (only when
  given), and the peer routes that let members use our engines. Its route view is read
  from the membership and the roster's verified records; the lease table's outcomes are
  its reliability evidence.

Commands out: `RecordPublisher.set_section` (``peer``, ``models``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from swim import Member

from ..config import NodeConfig, parse_api_listen
from ..inference._tls import tls_context
from ..inference.engines import EngineService
from ..inference.keys import ApiKeyChecker, request_authorizer
from ..inference.peer_api import PeerApi, PeerRoutes
from ..inference.peer_auth import PeerCallSigner, PeerCallVerifier
from ..inference.peer_client import PeerClient
from ..inference.route import Candidate
from ..inference.service import InferenceService
from ..leases.config import LeaseConfig
from ..leases.reliability import Outcome
from ..observe import MetricsService, ObserveView
from ..observe.sections import model_rows, route_rows
from ..observe.web import handles as observe_paths
from ..observe.web import make_observe_app
from ..trust.envelope_keys import EnvelopeKeys
from ..trust.record import NodeStatus
from .credentials import Credentials
from .errors import NodeStartError, first_os_error
from .publisher import RecordPublisher
from .revocations import RevocationService
from .roster import Roster

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from ..inference.llama_server import LlamaServer

__all__ = ["InferenceHost"]


def _inference_collector(service: InferenceService) -> Collector:
    """The inference API's metric families (prometheus-client: at the first scrape)."""
    from ..observe.work_collector import InferenceCollector

    return InferenceCollector(service.stats.statistics)


class _RouteView:
    """What the router reads of the mesh: the members with a verified record, as
    candidates (their models, state, draining, RTT); a node's peer API address; a
    member's state."""

    def __init__(
        self,
        node_id: str,
        members: Callable[[], list[Member]],
        member: Callable[[str], Member | None],
        roster: Roster,
    ) -> None:
        self._node_id = node_id
        self._members = members
        self._member = member
        self._roster = roster

    def candidates(self) -> list[Candidate]:
        roster, node_id = self._roster, self._node_id
        out = []
        for m in self._members():
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

    def address_of(self, node: str) -> tuple[str, int] | None:
        record = self._roster.records.get(node)
        peer = record.sections.get("peer") if record is not None else None
        port = peer.get("port") if isinstance(peer, dict) else None
        if record is None or not isinstance(port, int):
            return None
        return record.address, port

    def state_of(self, node: str) -> str | None:
        found = self._member(node)
        return None if found is None else found.state.name.lower()


class InferenceHost:
    """Starts the peer API and the engines (`start_peer`), then the inference service
    (`start_inference`), in the node's nursery.

    Args:
        config: the node's configuration (``peer_port``, ``engine``, ``api_listen``...).
        creds: our identity, certificate and the authority key.
        envelope_keys: who may call us (the same keys that open packets).
        publisher: where the ``peer`` and ``models`` sections go.
        peer_routes: the peer API's routes, which other services fill before the start.
        lease_config: the preset's lease timing (`Node.presets`): the reliability prior
            and decay the router ranks nodes by, the same as placement's.
    """

    def __init__(
        self,
        config: NodeConfig,
        creds: Credentials,
        envelope_keys: EnvelopeKeys,
        publisher: RecordPublisher,
        peer_routes: PeerRoutes,
        *,
        lease_config: LeaseConfig,
    ) -> None:
        self._config = config
        self._lease_config = lease_config
        self._creds = creds
        self._envelope_keys = envelope_keys
        self._publisher = publisher
        self._peer_routes = peer_routes
        self.peer_api: PeerApi | None = None
        #: Signed calls to other members' peer APIs (set by `start_peer`).
        self.peer_client: PeerClient | None = None
        self.engines: EngineService | None = None
        #: The ``llama-server`` processes this node runs (``--gguf``).
        self.llama_servers: list[LlamaServer] = []
        #: The OpenAI-compatible API and the relay (set by `start_inference`).
        self.inference: InferenceService | None = None

    async def start_peer(self, nursery: trio.Nursery, bind: str, port: int) -> None:
        """The peer API on the bind address, then the engines: the first record
        carries the peer port and the models.

        Raises:
            NodeStartError: the peer port cannot be bound.
        """
        await self._start_peer_api(nursery, bind, port)
        # Always: a deployed replica's engine joins it when it answers (populi_p2p.deploy).
        urls = [*self._config.engine, *await self._start_llama_servers(nursery)]
        self.engines = EngineService(urls, self._publisher.set_section)
        await nursery.start(self.engines.run)

    async def _start_llama_servers(self, nursery: trio.Nursery) -> list[str]:
        """``llama-server`` on each ``--gguf`` file; their URLs once their ports open
        (each model enters the record when the engine poll finds it loaded).

        Raises:
            NodeStartError: no ``llama-server``, or one did not start.
        """
        if not self._config.gguf:
            return []
        from ..inference.llama_server import (
            LlamaServer,
            LlamaServerError,
            find_llama_server,
            parse_gguf,
        )

        try:
            binary = find_llama_server(self._config.llama_server)
            urls = []
            for text in self._config.gguf:
                spec = parse_gguf(text)
                log = self._config.state_dir / "engines" / f"{spec.name.replace('/', '_')}.log"
                server = LlamaServer(binary, spec, log)
                self.llama_servers.append(server)
                urls.append(await nursery.start(server.run))
        except (LlamaServerError, ValueError) as exc:
            raise NodeStartError(f"gguf: {exc}") from None
        return urls

    async def _start_peer_api(self, nursery: trio.Nursery, bind: str, port: int) -> None:
        config = self._config
        # Default: the swim port + 1, or the kernel's choice when that is taken (the
        # port is advertised in the record, so any port works) or the swim port is 0.
        explicit = config.peer_port is not None
        wanted = (
            config.peer_port
            if config.peer_port is not None
            else ((port + 1) % 0x10000 if config.port else 0)
        )
        node_id = self._creds.identity.node_id
        verifier = PeerCallVerifier(self._envelope_keys, node_id, clock=time.time)
        bound: int | None = None
        for attempt in (wanted, 0):
            api = self.peer_api = PeerApi(verifier, self._peer_routes, host=bind, port=attempt)
            try:
                bound = await nursery.start(api.run)
                break
            except (OSError, BaseExceptionGroup) as exc:
                error = first_os_error(exc)
                if error is None:
                    raise
                if explicit or attempt == 0:
                    raise NodeStartError(
                        f"cannot listen for peer calls on {bind} port {attempt}: {error.strerror}"
                        " (pick another with --peer-port; 0 lets the kernel choose)"
                    ) from None
        assert bound is not None
        await self._publisher.set_section("peer", {"port": bound})
        # The client's TLS context reads the whole CA bundle (about 40 ms of CPU, whole
        # seconds on a starved host): in a worker thread, so the loop goes on handling
        # membership packets (a start storm's traces showed it blocking a seed's loop).
        await trio.to_thread.run_sync(tls_context)
        self.peer_client = PeerClient(
            PeerCallSigner(self._creds.identity, self._creds.certificate, clock=time.time)
        )

    async def start_inference(
        self,
        nursery: trio.Nursery,
        *,
        members: Callable[[], list[Member]],
        member: Callable[[str], Member | None],
        roster: Roster,
        revocations: RevocationService,
        outcomes: Callable[[], list[Outcome] | None],
        observe: ObserveView | None,
        metrics: MetricsService | None = None,
        loading: Callable[[str], bool] | None = None,
    ) -> None:
        """The inference service: peer routes always (so members can use our engines),
        the public API when ``--api-listen`` is given, with the observe routes on it.

        Raises:
            NodeStartError: the ``--api-listen`` address cannot be bound.
        """
        config = self._config
        creds = self._creds
        node_id = creds.identity.node_id
        listen = parse_api_listen(config.api_listen) if config.api_listen else None
        keys = None
        if listen is not None:
            required = config.require_api_keys or listen[0] not in ("127.0.0.1", "::1")
            keys = ApiKeyChecker(creds.authority_key, revocations=creds.revocations,
                                 required=required, clock=trio.current_time)  # fmt: skip
            revocations.on_change(keys.update_revocations)

        routes = _RouteView(node_id, members, member, roster)
        service = self.inference = InferenceService(
            node_id, view=routes.candidates, address_of=routes.address_of,
            peer_client=self.peer_client, engines=self.engines, listen=listen, keys=keys,
            stall_timeout=config.stall_timeout, state_of=routes.state_of, outcomes=outcomes,
            lease_config=self._lease_config, loading=loading, load_wait=config.load_wait,
        )  # fmt: skip
        service.register_peer_routes(self._peer_routes)
        if metrics is not None:
            metrics.register_factory(functools.partial(_inference_collector, service))
        if observe is not None:
            observe.provide("models", lambda: model_rows(service.models()))
            observe.provide("routes", lambda: route_rows(service.recent_routes()))
        if observe is not None:  # the dashboard, /metrics and /events on this listener
            service.mount_paths(
                observe_paths, make_observe_app(observe, authorize=request_authorizer(keys))
            )
        try:
            await nursery.start(service.run)
        except (OSError, BaseExceptionGroup) as exc:
            error = first_os_error(exc)
            if error is None or listen is None:
                raise
            raise NodeStartError(
                f"cannot listen for the API on {config.api_listen}: {error.strerror}"
                " (pick another with --api-listen)"
            ) from None

    def http_statistics(self) -> dict[str, Any]:
        """The peer API's calls and connections, and the public listener's connections
        (``status["http"]``)."""
        peer, service = self.peer_api, self.inference
        return {
            "peer": None if peer is None else {"port": peer.port, **peer.statistics()},
            "api": None if service is None or service.port is None else {
                "port": service.port, "connections": service.gate.statistics(),
            },
        }  # fmt: skip

    def requests(self) -> dict[str, Any]:
        """The recent routes of this node's inference API, and its engines."""
        service = self.inference
        return {
            "listening": None if service is None else service.port,
            "requests": [] if service is None else service.recent_routes(),
            "engines": [] if service is None else service.engines(),
        }
