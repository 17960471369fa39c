"""This node's signed `NodeRecord`: the signer, and the publisher that re-signs it when
the GPUs, the draining status or a section change.

Two objects, built on either side of the membership service: `RecordSigner` holds what
the record says and signs it (its first record is the membership's metadata, so it is
built before the core), and `RecordPublisher` re-signs on each change and publishes:
each new record goes to the roster (`on_signed`, so our own record is shown like
anyone's) and into the core's member metadata (`publish`, which gossips it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from overlay.base import Address

from .._log import event, get_logger
from .._version import protocol_version, software_version
from ..trust.identity import NodeIdentity
from ..trust.record import Capabilities, NodeRecord, NodeStatus, next_sequence

__all__ = ["OwnRecord", "RecordPublisher", "RecordSigner", "software_version"]

_log = get_logger("node")


def _ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


@attrs.frozen
class OwnRecord:
    """One record signed here: the signed bytes and the realtime of the signature."""

    raw: bytes = attrs.field(repr=False)
    signed_at: float


class RecordSigner:
    """What our record says, its sequence number, and the signature.

    Args:
        identity: signs the record.
        certificate: carried in the record.
        name: the node's name.
        labels: operator labels.
        started_at: realtime the daemon started.
        max_bytes: the largest signed record (the core's metadata budget).
        clock: realtime, for the sequence.
    """

    def __init__(
        self,
        identity: NodeIdentity,
        certificate: bytes,
        *,
        name: str,
        labels: Mapping[str, str],
        started_at: float,
        max_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._identity = identity
        self._certificate = certificate
        self._name = name
        self._labels = dict(labels)
        self._started_at = started_at
        self._max_bytes = max_bytes
        self._clock = clock
        #: The address the record gives (set once the transport is bound).
        self.advertise: Address = ("", 0)
        self.sequence: int | None = None
        #: The latest GPU report (`GpuReport`), or None before the first.
        self.gpu_report: Any = None
        self.status = NodeStatus.AVAILABLE
        self._sections: dict[str, dict[str, Any]] = {}

    def set_section(self, name: str, value: dict[str, Any] | None) -> bool:
        """Set (or with None remove) one observed-facts section; whether it changed."""
        if value is None:
            return self._sections.pop(name, None) is not None
        if self._sections.get(name) == value:
            return False
        self._sections[name] = value
        return True

    def sign(self) -> OwnRecord:
        """A freshly signed record, with the next sequence number."""
        now = self._clock()
        self.sequence = next_sequence(self.sequence, now)
        gpu = self.gpu_report.to_record() if self.gpu_report is not None else None
        try:
            signed = self._record_with(gpu).sign(self._identity, max_bytes=self._max_bytes)
        except ValueError as exc:
            event(_log, 30, "record.gpu_omitted", reason=str(exc))
            try:
                signed = self._record_with(None).sign(self._identity, max_bytes=self._max_bytes)
            except ValueError as exc2:
                event(_log, 30, "record.sections_omitted", reason=str(exc2))
                signed = self._record_with(None, sections=False).sign(
                    self._identity, max_bytes=self._max_bytes
                )
        return OwnRecord(signed.raw, now)

    def _record_with(self, gpu: dict[str, Any] | None, *, sections: bool = True) -> NodeRecord:
        assert self.sequence is not None
        return NodeRecord(
            node_id=self._identity.node_id,
            public_key=self._identity.public_key,
            name=self._name,
            address=self.advertise[0],
            port=self.advertise[1],
            software_version=software_version(),
            protocol_version=protocol_version(),
            started_at=float(self._started_at),
            sequence=self.sequence,
            status=self.status,
            capabilities=Capabilities(os.cpu_count() or 0, _ram_bytes(), gpu),
            labels=dict(self._labels),
            certificate=self._certificate,
            sections=dict(self._sections) if sections else {},
        )


class RecordPublisher:
    """Re-signs our record on each change and publishes it, until we leave.

    Args:
        signer: holds what the record says; its first record is already published
            (the membership's metadata, and the roster's `accept_own`).
        publish: puts a signed record in the core's member metadata
            (`MembershipService.set_meta`).
        is_open: whether records are still published (False once we left).
        on_signed: handed every record signed here (raw bytes, realtime) at once.
    """

    def __init__(
        self,
        signer: RecordSigner,
        *,
        publish: Callable[[bytes], Awaitable[None]],
        is_open: Callable[[], bool],
        on_signed: Callable[[bytes, float], None],
    ) -> None:
        self._signer = signer
        self._publish = publish
        self._is_open = is_open
        self._on_signed = on_signed

    async def gpu_changed(self, report: Any) -> None:
        """A new GPU report: keep it, re-sign and publish."""
        self._signer.gpu_report = report
        await self._republish("gpu", 20)

    async def set_draining(self, draining: bool) -> None:
        """Advertise (or stop advertising) `draining` in our signed record, so that
        placement on every node sees it."""
        status = NodeStatus.DRAINING if draining else NodeStatus.AVAILABLE
        if status is self._signer.status:
            return
        self._signer.status = status
        await self._republish(status.value, 20)

    async def set_section(self, name: str, value: dict[str, Any] | None) -> None:
        """Set (or with None remove) one observed-facts section of the record, and
        re-sign and publish if it changed."""
        if self._signer.set_section(name, value):
            await self._republish(name, 10)

    async def _republish(self, reason: str, level: int) -> None:
        if not self._is_open():
            return  # left: the record stays as the others last heard it
        own = self._signer.sign()
        self._on_signed(own.raw, own.signed_at)
        await self._publish(own.raw)
        event(_log, level, "record.updated", reason=reason, sequence=self._signer.sequence)
