"""`NodeParts`: the node's services that need no socket, built and wired at start.

The envelope keys and packet codec, the application channel, the roster of verified
records, revocations, the clock watches, the record publisher, the event feed, the
metrics registry and the GPU service. `Node` builds these before its first socket opens
(so a bad certificate or key fails before anything listens), then wires them to the
membership and the transport.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import attrs

from overlay.auth import DEFAULT_FRESHNESS, PacketAuthenticator
from overlay.transport import Transport, TransportConfig
from swim import SwimConfig

from ..config import NodeConfig
from ..observe import EventService, MetricSources, MetricsService
from ..trust._keyfiles import encode_public_key
from ..trust.envelope_keys import EnvelopeKeys
from ..trust.record_book import RecordBook
from .app_channel import AppChannel, AppKind
from .clock import CertificateWatch, SkewWatch
from .codec import WIRE_PACKET_BUDGET, AuthCodec
from .credentials import Credentials
from .gpus import GpuService
from .membership import MembershipService
from .publisher import RecordPublisher, software_version
from .revocations import RevocationService
from .roster import Roster

if TYPE_CHECKING:
    from ..observe.collector import NodeCollector

__all__ = ["NodeParts"]


class NodeParts:
    """The services that exist before the first socket opens, wired to each other.

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
        self.app = AppChannel()
        self.codec = AuthCodec(auth, TransportConfig().tcp.max_frame_size)
        records = RecordBook(
            creds.authority_key,
            revocations=creds.revocations,
            max_record_bytes=self.swim_config.meta_size_max,
        )
        node_id = creds.identity.node_id
        self.roster = Roster(
            node_id, records, on_certificate=self.codec.learn_certificate,
            departed_retention=config.departed_retention,
        )  # fmt: skip
        self.revocations = RevocationService(
            creds.files, creds.revocations, creds.authority_key,
            broadcast=functools.partial(self.app.broadcast, AppKind.REVOCATIONS),
        )  # fmt: skip
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
        self.events = EventService(name_of=roster.display_name)
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
