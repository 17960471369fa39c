"""`RecordSigner` and `RecordPublisher`: our signed record, re-signed on each change
and published until we leave."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from populi_p2p.services.publisher import RecordPublisher, RecordSigner
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.record import NodeRecord, NodeStatus, SignedNodeRecord

IDENTITY = NodeIdentity.from_seed(b"p" * 32)


async def test_publisher_re_signs_on_a_gpu_change_and_publishes_until_left() -> None:
    """The signer's first record is the membership's metadata; the publisher, built
    after the membership, re-signs each change and publishes it while we have not left."""
    identity = IDENTITY
    signed: list[bytes] = []
    published: list[bytes] = []
    open_ = [True]
    clock = iter(float(t) for t in range(1_000, 2_000))
    signer = RecordSigner(
        identity, b"", name="n1", labels={"zone": "a"}, started_at=1.0, max_bytes=1200,
        clock=lambda: next(clock),
    )  # fmt: skip
    signer.advertise = ("10.0.0.1", 7946)

    class Report:
        def to_record(self) -> dict[str, object]:
            return {}

    first = signer.sign()
    assert first.signed_at == 1_000.0

    async def publish(raw: bytes) -> None:
        published.append(raw)

    publisher = RecordPublisher(
        signer, publish=publish, is_open=lambda: open_[0],
        on_signed=lambda raw, _now: signed.append(raw),
    )  # fmt: skip
    await publisher.gpu_changed(Report())
    assert len(published) == 1 and published[0] != first.raw and signed == published
    await publisher.set_section("peer", {"port": 1})
    await publisher.set_section("peer", {"port": 1})  # unchanged: not re-signed
    await publisher.set_section("gone", None)  # nothing to remove: not re-signed
    assert len(published) == 2
    records = [SignedNodeRecord.from_bytes(raw).record for raw in [first.raw, *signed]]
    assert [r.sequence for r in records] == sorted({r.sequence for r in records})
    assert all(isinstance(r, NodeRecord) and r.name == "n1" for r in records)
    assert records[-1].port == 7946 and records[-1].sections == {"peer": {"port": 1}}
    open_[0] = False  # left: nothing more is signed or published
    await publisher.gpu_changed(Report())
    await publisher.set_draining(True)
    assert len(published) == 2 and len(signed) == 2


class BigReport:
    """A GPU report too big for the record's budget."""

    def to_record(self) -> dict[str, object]:
        return {"A": {"d": ["x" * 64] * 40}}


def signer(max_bytes: int = 1200, **kwargs: Any) -> RecordSigner:
    clock = iter(float(t) for t in range(1_000, 2_000))
    return RecordSigner(
        IDENTITY, b"", name="n1", labels={}, started_at=1.0, max_bytes=max_bytes,
        clock=lambda: next(clock), **kwargs,
    )  # fmt: skip


def decoded(raw: bytes) -> NodeRecord:
    return SignedNodeRecord.from_bytes(raw).record


def test_each_signature_has_a_higher_sequence_and_the_advertised_address() -> None:
    s = signer()
    s.advertise = ("10.0.0.9", 7950)
    first, second = s.sign(), s.sign()
    a, b = decoded(first.raw), decoded(second.raw)
    assert b.sequence > a.sequence and s.sequence == b.sequence
    assert (b.address, b.port) == ("10.0.0.9", 7950)
    assert (first.signed_at, second.signed_at) == (1_000.0, 1_001.0)


def test_set_section_says_whether_it_changed() -> None:
    s = signer()
    assert s.set_section("peer", {"port": 1})
    assert not s.set_section("peer", {"port": 1})
    assert s.set_section("peer", {"port": 2})
    assert s.set_section("peer", None)
    assert not s.set_section("peer", None)


def test_a_gpu_report_over_the_budget_is_left_out_not_the_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    s = signer(max_bytes=900)
    s.set_section("peer", {"port": 1})
    s.gpu_report = BigReport()
    record = decoded(s.sign().raw)
    assert record.capabilities.gpu is None and record.sections == {"peer": {"port": 1}}
    assert [r.getMessage() for r in caplog.records] == ["record.gpu_omitted"]


def test_sections_over_the_budget_go_next(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    s = signer(max_bytes=900)
    s.gpu_report = BigReport()
    s.set_section("big", {"blob": "y" * 1000})
    record = decoded(s.sign().raw)
    assert record.capabilities.gpu is None and record.sections == {}
    assert [r.getMessage() for r in caplog.records] == [
        "record.gpu_omitted",
        "record.sections_omitted",
    ]


async def test_draining_is_published_once_per_change() -> None:
    s = signer()
    s.sign()
    published: list[bytes] = []

    async def publish(raw: bytes) -> None:
        published.append(raw)

    publisher = RecordPublisher(s, publish=publish, is_open=lambda: True,
                                on_signed=lambda raw, now: None)  # fmt: skip
    await publisher.set_draining(False)  # already available: nothing
    assert published == []
    await publisher.set_draining(True)
    await publisher.set_draining(True)
    assert [decoded(r).status for r in published] == [NodeStatus.DRAINING]
    await publisher.set_draining(False)
    assert decoded(published[-1]).status is NodeStatus.AVAILABLE and len(published) == 2
