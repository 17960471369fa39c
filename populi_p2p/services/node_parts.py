"""The node's services that need no socket of their own, in two parts built on either
side of the membership service, each service with its collaborators.

`MembershipParts`, before the first socket opens (so a bad key fails before anything
listens): what the membership is built from, the envelope keys and packet codec (with
the clock-skew watch, and the path health it shares with the transport), the swim
configuration, the application channel's sync sections and the record signer (whose
first record is the membership's metadata).

`NodeParts`, once the membership service and the store exist: the application channel
(sends with the membership), the roster of verified records (queries the membership,
told our first record), revocations, the certificate watch, the record publisher
(publishes with the membership, feeds the roster), the event feed, the metrics registry
and the GPU service (feeds the publisher).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import attrs

from overlay.auth import DEFAULT_FRESHNESS, PacketAuthenticator
from overlay.peerpaths import PathHealth
from overlay.transport import Transport, TransportConfig
from swim import SwimConfig

from ..config import NodeConfig
from ..observe import EventService, MetricSources, MetricsService
from ..trust._keyfiles import encode_public_key
from ..trust.envelope_keys import EnvelopeKeys
from ..trust.record_book import RecordBook
from .app_channel import AppChannel, AppKind, AppSections
from .clock import CertificateWatch, SkewWatch
from .codec import WIRE_PACKET_BUDGET, AuthCodec
from .credentials import Credentials
from .gpus import GpuService
from .membership import MembershipService
from .memory import StoreService
from .publisher import OwnRecord, RecordPublisher, RecordSigner, software_version
from .revocations import RevocationService
from .roster import Roster

if TYPE_CHECKING:
    from ..observe.collector import NodeCollector

__all__ = ["MembershipParts", "NodeParts"]


class MembershipParts:
    """What the membership service is built from, made before the first socket opens.

    Args:
        config: the node's configuration.
        swim_config: the preset's membership timing (`Node.presets`), before the
            codec's packet budget and the application channel are set here.
        creds: the verified credentials (`load_credentials`).
        started_at: realtime of the start, for the record.
    """

    def __init__(
        self, config: NodeConfig, swim_config: SwimConfig, creds: Credentials, started_at: float
    ) -> None:
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
        self.skew = SkewWatch()
        #: The transport's per-peer UDP/TCP health (`Node._listen` binds the transport
        #: with it); the codec adds the TCP answers only it can attribute.
        self.paths = PathHealth()
        self.codec = AuthCodec(
            auth, TransportConfig().tcp.max_frame_size, on_stale=self.skew.observe,
            on_tcp_answer=self.paths.record_tcp_received,
        )  # fmt: skip
        #: The core's `AppState` delegate; each kind's section joins as it registers.
        self.sections = AppSections()
        #: Signs our record; `advertise` is set once the transport is bound.
        self.signer = RecordSigner(
            creds.identity, creds.certificate, name=config.name, labels=dict(config.labels),
            started_at=started_at,
            max_bytes=min(self.swim_config.meta_size_max, self.swim_config.packet_budget - 64),
        )  # fmt: skip


class NodeParts:
    """The services built once the membership service and the store exist.

    Args:
        config: the node's configuration.
        creds: the verified credentials.
        core: what the membership was built from (`MembershipParts`).
        membership: the membership service.
        store: where the roster's members worth remembering go.
        own_record: our first signed record: the membership's metadata.
    """

    def __init__(
        self,
        config: NodeConfig,
        creds: Credentials,
        core: MembershipParts,
        membership: MembershipService,
        store: StoreService,
        own_record: OwnRecord,
    ) -> None:
        self.envelope_keys, self.codec = core.envelope_keys, core.codec
        self.swim_config, self.skew = core.swim_config, core.skew
        self.app = AppChannel(core.sections, membership.broadcast_app)
        records = RecordBook(
            creds.authority_key,
            revocations=creds.revocations,
            max_record_bytes=self.swim_config.meta_size_max,
        )
        self.roster = Roster(
            creds.identity.node_id, records, membership, own_record=own_record,
            on_known=store.remember, on_gone=store.forget,
            on_certificate=self.codec.learn_certificate,
            departed_retention=config.departed_retention,
        )  # fmt: skip
        self.revocations = RevocationService(
            creds.files, creds.revocations, creds.authority_key,
            broadcast=functools.partial(self.app.broadcast, AppKind.REVOCATIONS),
        )  # fmt: skip
        self.app.register(AppKind.REVOCATIONS, self.revocations.on_app, self.revocations)
        public = encode_public_key(creds.identity.public_key)
        self.certificate = CertificateWatch(creds.decoded, public, str(config.cert_path))
        self.revocations.on_change(self.envelope_keys.update_revocations)
        self.revocations.on_change(self.roster.update_revocations)
        self.publisher = RecordPublisher(
            core.signer, publish=membership.set_meta,
            is_open=lambda: not membership.has_left, on_signed=self.roster.accept_own,
        )  # fmt: skip
        self.events = EventService(name_of=self.roster.display_name)
        self.metrics = MetricsService()
        self.gpus = self._gpu_service(config)

    def _gpu_service(self, config: NodeConfig) -> GpuService:
        """The GPU monitor: each report to the event feed, then to the publisher."""
        events, publisher = self.events, self.publisher

        async def gpu_changed(report: Any) -> None:
            events.gpu_report(report)
            await publisher.gpu_changed(report)

        return GpuService(
            gpu_changed,
            reserve_vram=config.reserve_vram,
            withheld=config.withhold_gpu,
            labels=dict(config.labels),
            declared=config.advertise_gpu,
            interval=config.gpu_probe_interval,
        )

    def register_metrics(
        self, node_id: str, name: str, membership: MembershipService, transport: Transport
    ) -> None:
        """The node's collector: membership, transport, codec, records, GPUs, events."""
        codec, roster, gpus, events = self.codec, self.roster, self.gpus, self.events
        sources = MetricSources(
            node_id=node_id, name=name, members=membership.members,
            awareness=lambda: membership.awareness, swim=membership.statistics,
            driver=membership.driver_statistics, transport=transport.statistics,
            traffic=lambda: (codec.bytes_in, codec.bytes_out),
            auth_drops=codec.auth.drops.as_dict, record_drops=roster.records.drops.as_dict,
            gpu_report=lambda: gpus.report, event_counts=lambda: events.counts,
            events_dropped=lambda: events.dropped, version=software_version(),
        )  # fmt: skip

        def collector() -> NodeCollector:  # imports prometheus-client: at the first scrape
            from ..observe.collector import NodeCollector

            return NodeCollector(sources)

        self.metrics.register_factory(collector)
