"""`services.clock`: a peer's clock that is off, and our certificate expiring, said plainly."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import trio
import trio.testing

from overlay.auth import AuthError
from populi_p2p.services.clock import (
    SKEW_SOURCES_MAX,
    CertificateWatch,
    SkewWatch,
    skew_message,
    stale_skew,
)
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.identity import NodeIdentity

NOW = 1_700_000_000.0
AUTHORITY = ClusterAuthority.from_seed(b"A" * 32)
NODE = NodeIdentity.from_seed(b"n" * 32)


def events(caplog: pytest.LogCaptureFixture, what: str) -> int:
    return sum(1 for r in caplog.records if r.getMessage() == what)


def test_stale_skew_reads_the_authenticators_measure() -> None:
    assert stale_skew(AuthError("stale", skew=42.5)) == 42.5
    assert stale_skew(AuthError("stale", skew=-3)) == -3.0
    assert stale_skew(AuthError("stale")) is None
    assert stale_skew(ValueError("no skew here")) is None


def test_skew_message_says_which_way() -> None:
    assert skew_message("10.0.0.7", 90.4) == (
        "packets from 10.0.0.7 are 90 s in the future: check its clock (NTP)"
    )
    assert "are 5 s in the past" in skew_message("h", -5.0)


def test_skew_is_logged_once_per_host_and_the_last_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    watch = SkewWatch()
    watch.observe(("10.0.0.7", 7946), 90.0)
    watch.observe(("10.0.0.7", 7950), 120.0)  # the same host, another port
    watch.observe(("10.0.0.2", 7946), -30.0)
    assert events(caplog, "clock.skew") == 2
    assert watch.notices() == [
        skew_message("10.0.0.2", -30.0),
        skew_message("10.0.0.7", 120.0),  # the last seen
    ]


def test_skew_sources_are_bounded_the_rest_counted() -> None:
    watch = SkewWatch()
    for i in range(SKEW_SOURCES_MAX + 3):
        watch.observe((f"10.0.{i // 256}.{i % 256}", 7946), 60.0)
    watch.observe(("10.0.0.0", 7946), 61.0)  # a listed one is still updated
    assert len(watch.notices()) == SKEW_SOURCES_MAX and watch.unlisted == 3
    assert skew_message("10.0.0.0", 61.0) in watch.notices()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def watch(expires_in: float | None, clock: Callable[[], float]) -> CertificateWatch:
    cert = AUTHORITY.enroll(NODE.public_key, expires_in=expires_in, now=NOW)
    return CertificateWatch(cert, "PUBKEY", "/etc/populi/node.cert", clock=clock)


def test_an_expired_certificate_is_said_once_with_how_to_renew(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(NOW)
    cert = watch(3600.0, clock)
    assert not cert.check() and cert.notices() == []
    clock.now = NOW + 3600.0
    assert cert.check() and cert.check()
    assert events(caplog, "certificate.expired") == 1
    (notice,) = cert.notices()
    assert notice.startswith("this node's certificate expired at 2023-11-14 23:13:20 UTC")
    assert "populi-node cluster enroll PUBKEY" in notice and "/etc/populi/node.cert" in notice
    clock.now = NOW  # a realtime step back does not un-expire it
    assert cert.check()


async def test_run_wakes_at_the_expiry(autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()

    def realtime() -> float:
        return NOW + trio.current_time() - start

    cert = watch(100.0, realtime)
    async with trio.open_nursery() as nursery:
        await nursery.start(cert.run)
    assert cert.expired
    assert 100.0 <= trio.current_time() - start <= 100.0 + 0.05


async def test_a_certificate_that_never_expires_needs_no_watch() -> None:
    cert = watch(None, Clock(NOW + 10**9))
    with trio.fail_after(1):
        await cert.run()
    assert not cert.check() and cert.notices() == []
