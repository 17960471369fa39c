"""What ``GET /v1/status`` shows: a read-only view over the services.

It calls only the services' queries; nothing here changes state.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Final

import attrs

from overlay.base import Address, format_address
from overlay.detect import OverlayInfo
from overlay.netfilter import AcceptPolicy
from overlay.transport import Transport

from .._version import protocol_version, software_version
from ..config import NodeConfig
from ..trust._keyfiles import encode_public_key
from ..trust.authority import cluster_fingerprint
from ..trust.identity import NodeIdentity
from .codec import AuthCodec
from .discovery import Discovery
from .membership import MembershipService
from .roster import Roster

__all__ = ["UNVERIFIED_WARNINGS_MAX", "StatusView"]

#: `status` warns about this many unverified members one by one, then counts the rest.
UNVERIFIED_WARNINGS_MAX: Final = 5


def asdict(value: Any) -> dict[str, Any]:
    out = attrs.asdict(value)
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}


@attrs.define
class StatusView:
    """The parts `status` reads; `notices` are extra warnings (start-up, clock, cert)."""

    config: NodeConfig
    identity: NodeIdentity
    authority_key: bytes
    started_at: float
    advertise: Address
    overlay: OverlayInfo
    policy: AcceptPolicy
    codec: AuthCodec
    transport: Transport
    membership: MembershipService
    roster: Roster
    discovery: Discovery
    left: Callable[[], bool]
    notices: Callable[[], list[str]] = list

    def status(self) -> dict[str, Any]:
        membership = self.membership
        counts = self.roster.state_counts()
        summary = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
        warnings: list[str] = list(self.notices())
        clashes = self.roster.name_clashes()
        for clash in clashes:
            ids = ", ".join(clash["node_ids"])
            warnings.append(f"name {clash['name']!r} is used by nodes {ids}")
        warnings.extend(self.discovery.warnings())
        stats = self.transport.statistics()
        blocked = [format_address(a) for a in stats.udp_blocked_peers]
        transport_stats = {"udp": asdict(stats.udp), "tcp": asdict(stats.tcp)}
        for peer in blocked:
            warnings.append(f"UDP to {peer} seems blocked; TCP works")
        unverified = self.roster.unverified_members()
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
        codec = self.codec
        return {
            "node": {
                "name": self.config.name,
                "node_id": self.identity.node_id,
                "public_key": encode_public_key(self.identity.public_key),
                "address": format_address(self.advertise),
                "incarnation": membership.incarnation,
                "left": self.left() or membership.has_left,
                "started_at": self.started_at,
                "uptime_s": round(time.time() - self.started_at, 3),
                "software_version": software_version(),
                "protocol_version": protocol_version(),
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
                "awareness": membership.awareness,
            },
            "unverified": unverified,
            "name_clashes": clashes,
            "udp_blocked": blocked,
            "warnings": warnings,
            "drops": {
                "auth": codec.auth.drops.as_dict(),
                "records": self.roster.records.drops.as_dict(),
            },
            "traffic": {
                "bytes_out": codec.bytes_out,
                "frame_bytes_out": codec.frame_bytes_out,
                "bytes_in": codec.bytes_in,
                "datagrams_with_certificate": codec.datagrams_with_certificate,
                "datagrams_without_certificate": codec.datagrams_without_certificate,
            },
            "bootstrap": asdict(self.discovery.statistics()),
            "swim": asdict(membership.statistics()),
            "driver": asdict(membership.driver_statistics()),
            "transport": transport_stats,
        }
