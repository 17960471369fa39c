"""The record publisher: signs this node's `NodeRecord`, and re-signs it when the GPUs
change.

Events in: GPU reports (`gpu_changed`). Commands out: each new signed record goes to
the record book (`on_signed`, so our own record is shown like anyone's) and, once the
membership service is attached, into the core's member metadata (`publish`), which
gossips it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from overlay.base import Address

from .._log import event, get_logger
from .._version import protocol_version, software_version
from ..trust.identity import NodeIdentity
from ..trust.record import Capabilities, NodeRecord, NodeStatus, next_sequence

__all__ = ["RecordPublisher", "software_version"]

_log = get_logger("node")


def _ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


class RecordPublisher:
    """Owns the record's sequence number and the latest GPU report.

    Args:
        identity: signs the record.
        certificate: carried in the record.
        name: the node's name.
        labels: operator labels.
        started_at: realtime the daemon started.
        max_bytes: the largest signed record (the core's metadata budget).
        on_signed: handed every signed record (raw bytes) at once.
        clock: realtime, for the sequence and the book.
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
        on_signed: Callable[[bytes, float], None] = lambda _raw, _now: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._identity = identity
        self._certificate = certificate
        self._name = name
        self._labels = dict(labels)
        self._started_at = started_at
        self._max_bytes = max_bytes
        self._on_signed = on_signed
        self._clock = clock
        self.advertise: Address = ("", 0)
        self.sequence: int | None = None
        self.signed: bytes | None = None
        self._gpu_report: Any = None
        self.status = NodeStatus.AVAILABLE
        self._sections: dict[str, dict[str, Any]] = {}
        self._publish: Callable[[bytes], Awaitable[None]] | None = None
        self._is_open: Callable[[], bool] = lambda: False

    def attach(
        self, publish: Callable[[bytes], Awaitable[None]], is_open: Callable[[], bool]
    ) -> None:
        """From now on re-signed records go to `publish`, while `is_open()` (not left)."""
        self._publish = publish
        self._is_open = is_open

    def sign(self) -> bytes:
        """A freshly signed record, with the next sequence number."""
        now = self._clock()
        self.sequence = next_sequence(self.sequence, now)
        gpu = self._gpu_report.to_record() if self._gpu_report is not None else None
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
        self.signed = signed.raw
        self._on_signed(signed.raw, now)
        return signed.raw

    async def gpu_changed(self, report: Any) -> None:
        """A new GPU report: keep it, and re-sign and publish once attached."""
        self._gpu_report = report
        if self._publish is None or not self._is_open():
            return
        await self._publish(self.sign())
        event(_log, 20, "record.updated", reason="gpu", sequence=self.sequence)

    async def set_draining(self, draining: bool) -> None:
        """Advertise (or stop advertising) `draining` in our signed record, so that
        placement on every node sees it."""
        status = NodeStatus.DRAINING if draining else NodeStatus.AVAILABLE
        if status is self.status:
            return
        self.status = status
        if self._publish is None or not self._is_open():
            return
        await self._publish(self.sign())
        event(_log, 20, "record.updated", reason=status.value, sequence=self.sequence)

    async def set_section(self, name: str, value: dict[str, Any] | None) -> None:
        """Set (or with None remove) one observed-facts section of the record, and
        re-sign and publish once attached, if it changed."""
        if value is None:
            if self._sections.pop(name, None) is None:
                return
        elif self._sections.get(name) == value:
            return
        else:
            self._sections[name] = value
        if self._publish is None or not self._is_open():
            return
        await self._publish(self.sign())
        event(_log, 10, "record.updated", reason=name, sequence=self.sequence)

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
