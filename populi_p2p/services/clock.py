"""Clock trouble said plainly: a peer's clock that is off, and our certificate expiring.

`SkewWatch` hears about packets refused as stale (their timestamp is further from our
clock than the authenticator's freshness window) and says, once per source, how far
off the sender's clock is. The packet did not authenticate, so the source is only an
address; the advice is the same either way: check the clock (NTP).

`CertificateWatch` says, once, that our own enrollment certificate expired while we
run (peers refuse our packets from then on), and how to renew it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

import trio

from overlay.base import Address, format_address

from .._log import event, get_logger
from ..trust.certificate import EnrollmentCertificate

__all__ = ["SKEW_SOURCES_MAX", "CertificateWatch", "SkewWatch", "stale_skew"]

#: Sources whose skew is remembered (and listed in `status`); beyond this, counted only.
SKEW_SOURCES_MAX: Final = 64
#: Longest sleep between looks at the certificate, seconds (the realtime clock may jump).
CERT_CHECK_MAX: Final = 30.0

_log = get_logger("node")


def stale_skew(exc: Exception) -> float | None:
    """Seconds a stale packet's timestamp is ahead of our clock (negative: behind), as
    the authenticator measured it (`AuthError.skew`); None when it offers none."""
    skew = getattr(exc, "skew", None)
    return float(skew) if isinstance(skew, int | float) else None


def skew_message(source: str, skew: float) -> str:
    direction = "in the future" if skew > 0 else "in the past"
    return f"packets from {source} are {abs(skew):.0f} s {direction}: check its clock (NTP)"


class SkewWatch:
    """Remembers the last skew seen per source host; logs each source once."""

    def __init__(self) -> None:
        self._by_source: dict[str, float] = {}
        self.unlisted = 0

    def observe(self, source: Address, skew: float) -> None:
        key = source[0]
        if key not in self._by_source:
            if len(self._by_source) >= SKEW_SOURCES_MAX:
                self.unlisted += 1
                return
            where = format_address(source)
            message = skew_message(where, skew)
            event(_log, 30, "clock.skew", source=where, skew_s=round(skew, 1), message=message)
        self._by_source[key] = skew

    def notices(self) -> list[str]:
        """One line per source, for `status`."""
        return [skew_message(host, skew) for host, skew in sorted(self._by_source.items())]


class CertificateWatch:
    """Args: our certificate, our public key (for the renew command), the certificate
    path, and realtime."""

    def __init__(
        self,
        certificate: EnrollmentCertificate,
        public_key: str,
        cert_path: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._expires_at = certificate.expires_at
        self._public_key = public_key
        self._cert_path = cert_path
        self._clock = clock
        self.expired = False

    def message(self) -> str:
        assert self._expires_at is not None
        when = datetime.fromtimestamp(self._expires_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return (
            f"this node's certificate expired at {when}; peers refuse its packets. Renew it:"
            f" on the authority machine run populi-node cluster enroll {self._public_key},"
            f" copy the file to {self._cert_path}, then restart populi-node up"
        )

    def check(self) -> bool:
        """True once the certificate has expired (logged the first time)."""
        if self.expired or self._expires_at is None:
            return self.expired
        if self._clock() >= self._expires_at:
            self.expired = True
            event(_log, 40, "certificate.expired", message=self.message())
        return self.expired

    def notices(self) -> list[str]:
        return [self.message()] if self.expired else []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if self._expires_at is None:
            return  # never expires
        while not self.check():
            await trio.sleep(min(CERT_CHECK_MAX, max(0.05, self._expires_at - self._clock())))
